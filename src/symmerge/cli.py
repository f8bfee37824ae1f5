"""The `symmerge` command line. Thin: each command parses its arguments and makes one library call.

Every command module defines `register(subparsers)`, adding its parser with `set_defaults(run=fn)`;
`fn(args)` returns an exit code. Errors the user can fix raise `SymmergeError` and print one line.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import SymmergeError, __version__

#: modules under symmerge.commands, each with register(subparsers)
COMMANDS = ("inspect", "transform", "align", "interpolate", "barrier", "train", "eval")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="symmerge", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"symmerge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"symmerge.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except SymmergeError as e:
        print(f"symmerge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"symmerge {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
