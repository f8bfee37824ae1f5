"""Every subcommand's --help shows each option's default once (issue 16: "defaults shown in every --help").

An option whose default is not None shows "(default: VALUE)" (added by `cli.DefaultsFormatter`); an
option whose default is None says in words what its absence means, and no help names a default twice
(a hand-written "(default ...)" beside the formatter's)."""

from __future__ import annotations

import argparse

import pytest

from symmerge.cli import COMMANDS, build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser):
    """(action, its help as printed) for every option with a value (not -h, not on/off flags)."""
    fmt = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.nargs != 0 and action.default is not argparse.SUPPRESS:
            yield action, " ".join(fmt._expand_help(action).split())


def missing_defaults(parser: argparse.ArgumentParser) -> list[str]:
    """The options of `parser` whose help hides a non-None default or names a default twice."""
    bad = []
    for action, text in _options(parser):
        flag = action.option_strings[-1]
        if action.default is not None and f"(default: {action.default})" not in text:
            bad.append(f"{flag}: default {action.default!r} not shown in {text!r}")
        if text.lower().count("default") > 1:
            bad.append(f"{flag}: a default named twice in {text!r}")
    return bad


def test_every_subcommand_is_checked():
    assert set(_subparsers(build_parser())) == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_shows_its_default_once(command):
    parser = _subparsers(build_parser())[command]
    assert not missing_defaults(parser)
    shown = [a for a, _ in _options(parser) if a.default is not None]
    assert all(f"(default: {a.default})" in " ".join(parser.format_help().split()) for a in shown)  # as printed


def test_a_parser_without_the_formatter_is_caught():
    """Negative control: a default argparse hides; and a hand-written default beside the formatter's."""
    plain = argparse.ArgumentParser()
    plain.add_argument("--steps", type=int, default=200, help="optimiser steps")
    assert missing_defaults(plain) == ["--steps: default 200 not shown in 'optimiser steps'"]
    twice = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    twice.add_argument("--steps", type=int, default=200, help="optimiser steps (default 200)")
    assert len(missing_defaults(twice)) == 1 and "twice" in missing_defaults(twice)[0]
