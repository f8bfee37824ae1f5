"""Every subcommand's --help shows each option's default once (issue 16: "defaults shown in every --help").

An option whose default is not None shows "(default: VALUE)" (added by `cli.DefaultsFormatter`); an
option whose default is None says in words what its absence means, and no help names a default twice
(a hand-written "(default ...)" beside the formatter's)."""

from __future__ import annotations

import argparse
import re

import pytest

from symmerge.cli import COMMANDS, DefaultsFormatter, build_parser


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


#: the longest help text that `align` and `merge` print, on one line, before the default it ends with (the
#: defaults of the learned options name each recipe's and method's); the details are in the docs
MAX_HELP = 100
#: a trailing "(default: ...)", one level of parentheses inside it allowed
DEFAULT = re.compile(r" \(default: [^()]*(?:\([^()]*\)[^()]*)*\)$")


def sectioned_problems(parser: argparse.ArgumentParser) -> list[str]:
    """Options of `parser` left in the generic "options" section (all but -h), and help texts over MAX_HELP."""
    fmt = parser._get_formatter()
    generic = next(g for g in parser._action_groups if g.title == "options")
    bad = [f"{a.option_strings[-1]}: in no section" for a in generic._group_actions if not isinstance(a, argparse._HelpAction)]
    for action in parser._actions:
        text = DEFAULT.sub("", " ".join(fmt._expand_help(action).split())) if action.help else ""
        if len(text) > MAX_HELP:
            bad.append(f"{action.option_strings[-1] if action.option_strings else action.dest}: help of {len(text)} characters")
    return bad


@pytest.mark.parametrize("command, sections", [
    ("align", ["output", "matching", "data", "weight matching", "activation matching", "learned and dual matching",
               "device and precision"]),
    ("merge", ["output", "matching", "rounds", "data", "learned and dual matching", "device and precision"]),
])
def test_align_and_merge_group_their_options_by_method(command, sections):
    parser = _subparsers(build_parser())[command]
    assert [g.title for g in parser._action_groups][2:] == sections
    assert sectioned_problems(parser) == []
    text = parser.format_help()
    assert all(f"\n{s}:\n" in text for s in sections)  # as printed


def test_an_option_outside_the_sections_or_a_long_help_is_caught():
    """Negative control: an option added to the parser itself, and one with a help over MAX_HELP (its default
    not counted)."""
    p = argparse.ArgumentParser(formatter_class=DefaultsFormatter)
    p.add_argument_group("data").add_argument("--data", help="data set")
    p.add_argument("--steps", help="optimiser steps")
    p.add_argument_group("learned").add_argument("--lr", help="x" * (MAX_HELP + 1))
    p.add_argument_group("learned").add_argument("--seed", default=12345, help="x" * MAX_HELP)
    p.add_argument_group("learned").add_argument("--eps", help="x" * MAX_HELP + " (default: 1 (full), 2 (quick))")
    assert sectioned_problems(p) == ["--steps: in no section", f"--lr: help of {MAX_HELP + 1} characters"]


def test_every_matcher_option_lands_in_its_method_section():
    from symmerge.commands.help_sections import DATA, LEARNED, MATCHING, WEIGHT, section_of
    from symmerge.commands.option_flags import option_fields

    assert section_of("precision") == MATCHING and section_of("batch_size") == DATA
    assert section_of("sweep_workers") == WEIGHT and section_of("lr") == LEARNED
    assert section_of("blocks") == "activation matching"
    assert {section_of(o) for o in option_fields()} == {MATCHING, DATA, WEIGHT, "activation matching", LEARNED}
