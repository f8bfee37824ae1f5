"""The `symmerge` command line. Thin: each command parses its arguments and makes one library call.

Every command module defines `register(subparsers)`, adding its parser with `set_defaults(run=fn)`;
`fn(args)` returns an exit code. Errors the user can fix raise `SymmergeError` and print one line.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

from safetensors import SafetensorError

from .errors import SymmergeError
from .version import __version__

#: what `symmerge --version` prints
VERSION = f"symmerge {__version__}"

#: modules under symmerge.commands, each with register(subparsers)
COMMANDS = ("inspect", "transform", "expand", "align", "merge", "interpolate", "barrier", "train", "eval", "demo")


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help, "(default: X)", once. Not shown: a default of None (the help
    says in words what the option's absence means, e.g. "(default: the preset's)") and the False of an
    on/off flag."""

    def _get_help_string(self, action):
        if action.default is None or action.nargs == 0:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows the defaults (`DefaultsFormatter`), for every subcommand too."""

    def __init__(self, *args, formatter_class=DefaultsFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="symmerge", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=VERSION)
    sub = parser.add_subparsers(dest="command", required=True)  # subparsers are Parsers too
    for name in COMMANDS:
        importlib.import_module(f"symmerge.commands.{name}").register(sub)
    return parser


def _terminate(signum, frame):
    """SIGTERM unwinds like Ctrl-C, so that every `AtomicFolder` removes its temporary folder."""
    from .runtime import distributed

    why = " (by torchrun, which stops every process once one fails: see that one's error)" if distributed.launched() else ""
    raise KeyboardInterrupt(f"terminated{why}")


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. `--version` alone answers before the commands (and torch) are imported."""
    typed = sys.argv[1:] if argv is None else argv
    if typed == ["--version"]:
        print(VERSION)
        return 0
    from .runtime import distributed
    from .store import hub, provenance

    args = build_parser().parse_args(argv)
    provenance.record_command(typed)  # as typed, for the outputs' model cards
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    if distributed.idle(args):  # under torchrun, a command that does not spread runs in the first process
        return 0
    try:
        hub.forget()
        hub.resolve_args(args)  # Hub ids named by the command's checkpoint arguments -> local snapshot folders
        return int(args.run(args) or 0)
    except SymmergeError as e:
        if distributed.prints(e):  # under torchrun an error all processes share is printed once
            print(f"symmerge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # learned matching says where its checkpoint is
        print(f"symmerge {args.command}: {e or 'interrupted'}", file=sys.stderr)
        return 130
    except OSError as e:  # a full disk, a vanished folder: the system's words, and no traceback
        where = f" ({e.filename})" if e.filename else ""
        print(f"symmerge {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except SafetensorError as e:  # safetensors' writer reports a full disk as its own error, with the system's words
        print(f"symmerge {args.command}: error: {e}", file=sys.stderr)
        return 1
    finally:  # a signal can land between a write's steps; its temporary folder goes all the same
        io = sys.modules.get("symmerge.store.io")
        if io is not None:
            io.remove_pending()
        distributed.close()


if __name__ == "__main__":
    sys.exit(main())
