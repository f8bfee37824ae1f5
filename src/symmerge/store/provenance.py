"""What an output records of how it was made, written by `write_metadata` into every checkpoint symmerge writes
(the one place outputs are finished with their metadata: `model.save_model`, `stream.write_streaming`,
`train`): symmerge.json, and the model card README.md made from it (`card.py`)."""

from __future__ import annotations

import json
from pathlib import Path

from . import card
from .hub import name_of, resolved

_COMMAND: list[list[str]] = []  # the command line of the running command (the CLI records it), else empty


def record_command(argv: list[str] | None) -> None:
    """The arguments of the `symmerge` command now running (None: none; outputs are written through the API)."""
    _COMMAND[:] = [] if argv is None else [list(argv)]


def write_metadata(folder: Path, own: dict, inherited: dict | None = None) -> None:
    """symmerge.json of an output being written in `folder`: the input's metadata `inherited` (its training,
    alignment, ... records), then this operation's record `own` (one key: the operation), then, where
    inputs were read by Hub id, `hub` (their commits, `hub.resolved`; an inherited `hub` is dropped: it
    named the inputs of an earlier operation); and the model card README.md of that operation."""
    meta = {k: v for k, v in (inherited or {}).items() if k not in own and k != "hub"}
    meta.update(own)
    if resolved():
        meta["hub"] = resolved()
    (folder / "symmerge.json").write_text(json.dumps(meta, indent=2))
    (op,) = own
    (folder / "README.md").write_text(card.text(meta, op, _COMMAND[0] if _COMMAND else None, name_of))
