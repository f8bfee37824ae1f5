"""The frozen endpoints of learned and dual matching, kept whole on every process (`Frozen`; sharded over
processes: `sharded.Sharded`).

`Frozen`: one endpoint's canonical tensors, read part by part (`parts.part_keys`: embeddings, each block, final
norm and head) from a `Model` in memory or a `LazyModel` (its safetensors files read one part at a time, in
float64, or float32 for a 16-bit store: `read_dtype`), moved by a fixed element on the way if asked (dual: the
absorbed weight-matching solution) and kept in the checkpoint's own dtype on the forward's device. 0-dim tensors
(`norm.eps`) stay float64 on the CPU: the config's eps is a float64 number. `fill` reads several stores' ends
first, while little is kept. `blockwise.BlockwiseForward` is fed from them.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..store.model import as_parts, in_memory
from ..store.parts import Params, Parts, part_keys
from .heap import large_frees_to_the_os


class Frozen(Parts):
    """One endpoint's frozen canonical tensors, part by part, in `dtype` (default: the checkpoint's own) on
    `device`; `transform(part)` (a fixed group element) is applied before they are kept.

    `keys`: the parts read now (default: every part); `read(keys)` reads more. A `LazyModel` is read in
    `read_dtype(kept dtype)`: float64 for float32 stores, float32 for 16-bit ones (its rounding error, 2^-24,
    is 2^-16 of a bf16 step: the kept tensors equal float64's but where a value lies that close to a rounding
    tie), which halves the transient of each part. Peak memory while reading: what is kept plus one part in
    that precision (read the ends first: `fill`)."""

    def __init__(self, source, device=None, transform: Callable[[Params], Params] | None = None, dtype=None,
                 keys=None):
        large_frees_to_the_os()  # each part's float64 transient, freed, must not fragment the heap under what is kept
        self.shape, self.spec = source.shape, source.spec
        self.dtype = dtype or source.dtype
        self.device, self.transform = device, transform
        self.reader = reader_of(source, self.dtype)
        self.parts: dict = {}
        self.read(part_keys(self.shape) if keys is None else keys)

    def read(self, keys) -> None:
        for key in keys:
            part = self.reader.part(key)
            if self.transform is not None:
                part = self.transform(part)
            self.parts[key] = {k: (v.detach().to(torch.float64) if v.dim() == 0 else v.detach().to(device=self.device, dtype=self.dtype))
                               for k, v in part.items()}
            del part

    def part(self, key) -> Params:
        return self.parts[key]

    def params(self) -> Params:
        """Every part's tensors in one dict (no copies)."""
        return {k: v for part in self.parts.values() for k, v in part.items()}

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.params().values())


def read_dtype(kept: torch.dtype) -> torch.dtype:
    """The precision a part is read (and its canonical form computed) in before it is kept in `kept`."""
    return torch.float32 if torch.finfo(kept).bits <= 16 else torch.float64


def reader_of(source, kept: torch.dtype):
    """What a frozen store reads `source` through, part by part: a `Model` in memory through its float64 view,
    a `LazyModel` in `read_dtype(kept)`, any other `parts.Parts` (an expanded model) as it is."""
    if in_memory(source):
        return as_parts(source)
    return source.at_dtype(read_dtype(kept)) if hasattr(source, "at_dtype") else source


def fill(stores: list) -> None:
    """Read every part of `stores` (built with `keys=()`), the ends of all first: the ends (vocabulary x d_model,
    the largest parts) are then read while little is kept, and the blocks' transients, smaller, come last."""
    shape = stores[0].shape
    for keys in (["embed", "final"], list(range(shape.n_layers))):
        for store in stores:
            store.read(keys)
