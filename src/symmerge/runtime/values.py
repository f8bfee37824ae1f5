"""Text-to-value parsers for options (argparse `type=`s): numbers, bounded numbers, seeds.

Each refuses a bad value with `argparse.ArgumentTypeError`, which argparse reports as one line naming the
flag (exit 2) while the command line is parsed, before anything is read or written. They live below the
matchers and the commands, so that an option's parser is declared once where the option is (the matcher
registry) and used by the command line that is built from it.
"""

from __future__ import annotations

import argparse
import math

from ..errors import SymmergeError


def finite_float(text: str) -> float:
    """A float that is neither NaN nor infinite."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return x


def positive_float(text: str) -> float:
    """A finite float above 0 (learning rates, tolerances)."""
    x = finite_float(text)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be above 0")
    return x


def at_least(low: float, kind=int, high: float | None = None, why: str = ""):
    """An argparse type for a finite number (`kind`: int or float) of at least `low` (and at most `high`,
    `why` saying what a larger value would break)."""

    def parse(text: str):
        try:
            x = kind(finite_float(text)) if kind is float else int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if x < low:
            raise argparse.ArgumentTypeError(f"{text} must be at least {low:g}")
        if high is not None and x > high:
            raise argparse.ArgumentTypeError(f"{text} must be at most {high:g}{why}")
        return x

    parse.__name__ = f"{kind.__name__} >= {low:g}"  # how argparse names the type in its message
    return parse


SEED_MAX = 2**32 - 1  # what every generator symmerge seeds accepts, and its derived seeds stay in range


def seed(text: str) -> int:
    """A seed: a whole number in [0, 2**32 - 1] (torch and numpy refuse negative or huge seeds only later,
    after data and models are read)."""
    try:
        x = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= x <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{text} is not a seed: give a whole number from 0 to {SEED_MAX}")
    return x


def argument_type(parse):
    """`parse` (text -> value, raising SymmergeError on bad text) as an argparse type: argparse reports
    only its own error types as a usage error, anything else would escape as a traceback."""

    def wrapped(text: str):
        try:
            return parse(text)
        except SymmergeError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    wrapped.__name__ = parse.__name__
    return wrapped
