"""A model-sized set of canonical tensors written once, part by part, and read back many times.

Many-model weight matching matches each model to the leave-one-out mean of the others; forming that mean
means reading every other model's part and moving it by its element (`apply`), which a matching run
would otherwise repeat in every sweep. `PartCache` holds the mean instead, served part by part
(`parts.Parts`):

- in memory, when every source is in memory already (a model more costs nothing new in kind);
- on disk, when the sources stream from checkpoints: one safetensors file per part in a temporary
  folder (`tempfile`, so `TMPDIR` chooses where), so that the resident memory stays one part of each
  model as in pairwise matching; the folder takes one model in the algebra's dtype and is removed
  when the cache is closed.

Reads return fresh tensors (a caller may change them), in the dtype they were written in and in the order the
part listed them (code that sums over a part's tensors in turn then sums in one order). They are contiguous,
whichever the mode, unless the cache keeps `strides`: then each comes back with the strides it was written
with (a transposed weight stays transposed, on disk too), so that products of what is read are computed as
products of what was written are, to the bit (the layout of a matrix chooses how a product sums). Tensors
written must then be dense (as every result of arithmetic is).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable

import torch

from ..store.parts import Parts


class PartCache(Parts):
    def __init__(self, keys: list, on_disk: bool, strides: bool = False):
        self.keys, self.on_disk, self.strides = list(keys), on_disk, strides
        self._mem: dict = {}
        self._dir = tempfile.TemporaryDirectory(prefix="symmerge-mean-") if on_disk else None

    def _file(self, key) -> Path:
        return Path(self._dir.name) / f"{key}.safetensors"

    def fill(self, part: Callable[[object], dict]) -> PartCache:
        """Write `part(key)` for every key (one part held at a time)."""
        from safetensors.torch import save_file

        for key in self.keys:
            tensors = part(key)
            if not self.strides:
                tensors = {k: v.contiguous() for k, v in tensors.items()}  # one layout either way: equal sums
            if self.on_disk:  # the layouts, in the part's order (a file lists its tensors sorted by name)
                layout = {k: v.stride() for k, v in tensors.items()}
                save_file({k: v.contiguous() for k, v in tensors.items()}, str(self._file(key)),
                          metadata={"strides": json.dumps(layout)})
            else:
                self._mem[key] = tensors
            del tensors
        return self

    def part(self, key) -> dict[str, torch.Tensor]:
        if key not in self.keys:
            raise KeyError(f"part {key!r} is not cached (parts: {self.keys})")
        if self.on_disk:
            from safetensors import safe_open

            with safe_open(str(self._file(key)), "pt") as f:  # one read: the layouts, then each tensor in their order
                layout = json.loads(f.metadata()["strides"])
                tensors = {k: f.get_tensor(k) for k in layout}
            if not self.strides:
                return tensors
            return {k: torch.empty_strided(v.shape, layout[k], dtype=v.dtype).copy_(v) for k, v in tensors.items()}
        return {k: v.clone() for k, v in self._mem[key].items()}  # dense: the same strides

    def close(self) -> None:
        self._mem.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> PartCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
