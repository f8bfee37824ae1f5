"""Argument checks shared by the commands: argparse types for numbers, and report files checked before work.

An argparse `type=` refuses a bad value while the command line is parsed: one line naming the flag,
exit 2, nothing read or written. `check_report_file` does the same for `--json`/`--plot` paths,
which would otherwise fail only after the whole computation.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from .. import SymmergeError


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


def check_report_file(path: str | None, flag: str, outputs=()) -> None:
    """Refuse, before any work, a report path that names a folder, lies in a missing folder, or is one of
    the folders the command writes (`outputs`: OUT, --aligned; they do not exist yet when checked)."""
    if path is None:
        return
    p = Path(path)
    for out in outputs:
        if out is not None and p.absolute() == Path(out).absolute():
            raise SymmergeError(f"{flag} {path} is the output folder; give a file beside it, e.g. {p}.json")
    if p.is_dir():
        raise SymmergeError(f"{flag} {path} is a folder; give a file name, e.g. {p / 'report.json'}")
    if not p.absolute().parent.is_dir():
        raise SymmergeError(f"{flag} {path}: the folder {p.absolute().parent} does not exist; create it first")


def check_plot_file(path: str | None, report: str | None = None, flag: str = "--plot") -> None:
    """`check_report_file`, a file type matplotlib can write (known by the name's suffix) and not the `report`
    file (--json) too: refused before the computation, which otherwise ends in matplotlib's ValueError."""
    check_report_file(path, flag)
    if path is None:
        return
    if report is not None and Path(report).absolute() == Path(path).absolute():
        raise SymmergeError(f"{flag} and --json both name {path}; give each its own file")
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in kinds:
        raise SymmergeError(f"{flag} {path}: matplotlib cannot write {'.' + suffix if suffix else 'a file without a suffix'}; "
                            f"name a .png, .pdf or .svg file (or any of {', '.join(sorted(kinds))})")
