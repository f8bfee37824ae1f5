"""Every flag of every command reaches symmerge unchanged under `torchrun ... -m symmerge COMMAND ...`.

torchrun's own parser reads the whole command line and abbreviates: a symmerge flag that is a prefix of two of
torchrun's options (`--start` of `--start-method` and `--start_method`) stops torchrun before symmerge runs. The
check parses each flag with torchrun's stock parser and asserts that symmerge's arguments come through as given."""

from __future__ import annotations

import argparse

import pytest

from symmerge.cli import build_parser

run = pytest.importorskip("torch.distributed.run")


def _long_flags() -> list[tuple[str, str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted({(name, s) for name, p in sub.choices.items() for a in p._actions for s in a.option_strings
                   if s.startswith("--")})


def _passes_through(command: str, flag: str) -> bool:
    """Whether torchrun hands `COMMAND FLAG x` to `-m symmerge` as given."""
    argv = ["--standalone", "--nproc-per-node", "2", "-m", "symmerge", command, flag, "x"]
    try:
        got = run.get_args_parser().parse_args(argv)
    except SystemExit:  # argparse's error: the flag was taken for one of torchrun's
        return False
    return got.training_script == "symmerge" and got.training_script_args == [command, flag, "x"]


def test_the_check_sees_a_colliding_flag():
    """The control: a flag torchrun finds ambiguous is caught."""
    assert not _passes_through("align", "--start")


@pytest.mark.parametrize("command,flag", _long_flags())
def test_torchrun_passes_every_flag_through(command, flag):
    assert _passes_through(command, flag)
