"""What an output records of how it was made: symmerge.json, written by `write_metadata` into every checkpoint
symmerge writes (the one place outputs are finished with their metadata: `model.save_model`,
`stream.write_streaming`, `train`)."""

from __future__ import annotations

import json
from pathlib import Path

from .hub import resolved


def write_metadata(folder: Path, own: dict, inherited: dict | None = None) -> None:
    """symmerge.json of an output being written in `folder`: the input's metadata `inherited` (its training,
    alignment, ... records), then this operation's record `own` (one key: the operation), then, where
    inputs were read by Hub id, `hub` (their commits, `hub.resolved`; an inherited `hub` is dropped: it
    named the inputs of an earlier operation)."""
    meta = {k: v for k, v in (inherited or {}).items() if k not in own and k != "hub"}
    meta.update(own)
    if resolved():
        meta["hub"] = resolved()
    (folder / "symmerge.json").write_text(json.dumps(meta, indent=2))
