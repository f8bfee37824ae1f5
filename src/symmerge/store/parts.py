"""Canonical tensors served one part at a time: the protocol of everything that yields them.

A model is read, moved, averaged and written in parts (`part_keys`): "embed" (the embeddings), each block
by its index, "final" (final norm, head, the norm's eps). Whatever yields canonical tensors serves them
through `Parts.part(key)`, and so gets `ends()` and `scalars(key)` from here:

- a checkpoint read from its files (`model.LazyModel`), a model in memory through a view
  (`InMemoryParts`: `model.as_parts`), a narrow model seen in a wide config (`expansion.ExpandedModel`);
- a weighted or leave-one-out mean of moved models (`match.many.MeanParts`), a model
  at another residual scale (`match.many.ScaledParts`), a mean kept for many reads (`match.part_cache.PartCache`);
- the frozen endpoints of learned matching, whole or sharded over processes (`match.frozen.Frozen`,
  `match.sharded.Sharded`).

`ModelParts` adds what it takes to run or write the model whose parts they are (its adapter, config,
shape, spec, storage dtype, folder): `stream.write_streaming`, the block-wise forwards and the frozen
stores take one. `Served` makes any `Parts` one, as the parts of a model like a given one (a mean written or
run as its first model).

Invariant: `part(key)` holds exactly the canonical tensors `name` of the model with `part_of(name) == key`,
and the parts over `part_keys(shape)` together hold every canonical tensor once. A source may return its own
tensors (a caller that changes them must copy) unless it says otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..algebra.shape import ModelShape
    from ..algebra.spec import Spec

Params = dict[str, torch.Tensor]


def part_keys(shape) -> list:
    """The parts a model is read in: "embed", the block indices, "final" (head, final norm, eps)."""
    return ["embed", *range(shape.n_layers), "final"]


def part_of(name: str):
    """The part key a canonical tensor belongs to."""
    if name.startswith("blocks."):
        return int(name.split(".")[1])
    return "embed" if name.startswith("embed.") else "final"


class Parts(Protocol):
    """Canonical tensors, one part at a time (see the module docstring)."""

    #: `part` is a collective of the run's processes (sharded endpoints): every process must ask for the same parts
    #: in the same order, whatever its own batch
    collective: bool = False

    def part(self, key) -> Params:
        """The canonical tensors of part `key` ("embed", a block index, "final")."""
        ...

    def ends(self) -> Params:
        """The embeddings' and the final part's tensors in one dict (the vocabulary-sized tensors, the final
        norm and eps: what an exported config and the models' ends are built from)."""
        return {**self.part("embed"), **self.part("final")}

    def scalars(self, key) -> Params:
        """The 0-dim tensors of part `key` (`norm.eps`)."""
        return {k: v for k, v in self.part(key).items() if v.dim() == 0}


class ModelParts(Parts, Protocol):
    """The parts of one model, with what it takes to run it or write it as a stock checkpoint."""

    path: object  # the checkpoint folder its side files (tokenizer, ...) come from, or None
    config: object  # the HF config its parts are written under
    adapter: Adapter
    shape: ModelShape
    spec: Spec
    dtype: torch.dtype  # the storage dtype (what outputs are written in by default)


class InMemoryParts(Parts):
    """Canonical tensors already in memory (a dict, or a `model.Model`'s parameters), served part by part
    in `dtype` (each read a cast: a copy unless the tensor is in `dtype` already)."""

    def __init__(self, params: Params, dtype: torch.dtype = torch.float64):
        self.parts: dict = {}
        for name, t in params.items():
            self.parts.setdefault(part_of(name), {})[name] = t
        self.dtype = dtype

    def part(self, key) -> Params:
        return {k: v.to(self.dtype) for k, v in self.parts.get(key, {}).items()}


class Served(ModelParts):
    """The parts of `parts` served as those of a model like `like` (its folder, config, adapter, shape, spec
    and storage dtype: what it takes to run or write them), each read cast to `cast` where given (a copy
    unless the tensor is in `cast` already). A mean of moved models runs and is written as the first of them;
    a model read in one precision is computed on in another, as `InMemoryParts` serves a `Model`."""

    def __init__(self, like: ModelParts, parts: Parts | None = None, cast: torch.dtype | None = None):
        self.path, self.config, self.adapter, self.shape = like.path, like.config, like.adapter, like.shape
        self.spec, self.dtype = like.spec, like.dtype
        self.source, self.cast = like if parts is None else parts, cast

    def part(self, key) -> Params:
        part = self.source.part(key)
        return part if self.cast is None else {k: v.to(self.cast) for k, v in part.items()}
