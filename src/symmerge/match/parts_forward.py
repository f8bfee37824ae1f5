"""The stock loss of canonical parameters served one part at a time (`parts.Parts`): the loss of a weighted
mean of moved models (`activation_many.average_loss`) without the mean, or any model, held whole.

`PartsForward(like)` builds the stock HF model of `like`'s class without weights (`blockwise.weightless`,
its floating buffers then cast to the forward's dtype as `model.build_hf_model` casts them) under the config
`evaluation.StockForward(like)` exports (bias slots from `like`'s own attention biases, `stream._bias_probe`),
and replaces each block (`HookPoints.block`) by a stand-in that reads that block's canonical tensors
(`source.part(i)`) when the forward reaches it; the top-level forward gets the ends (embeddings, final norm,
head) read once per call of `mean_loss`.

Invariant: `mean_loss(source, batches)` is `StockForward(like, dtype, device).mean_loss(params, batches)` for
the parameters `source` serves over all parts, to the bit: the same modules on the same tensors in the same
order, the parameters moved to `like`'s normalisation eps first where the model has a residual scale
(`evaluation.at_eps`, applied part by part with the scale read from the final part). Memory: the ends and one
block in the forward's dtype, whatever the depth. Where it fails: as `file_forward.py` (a stock class whose
top-level forward reads block parameters outside the block modules, or an adapter without `HookPoints.block`).
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from ..algebra.apply import apply
from ..algebra.spec import SCALE
from ..errors import SymmergeError
from ..evaluation.forward import model_inputs
from ..store.parts import Params, Parts
from .blockwise import StandIn, stand_in_blocks, weightless


class _PartBlock(StandIn):
    """Stands in for stock block i: reads its canonical tensors from the owner's source, runs the stock block."""

    def forward(self, *args, **kwargs):
        return functional_call(self.stock, self.owner.block_state(self.i), args, kwargs)


class PartsForward:
    """The stock forward of `like`'s class in `dtype` on `device`, fed one part at a time (module docstring).
    `like`: a `parts.ModelParts` whose config, eps and attention biases the stock model is built for."""

    def __init__(self, like, dtype: torch.dtype = torch.float64, device=None):
        from types import SimpleNamespace

        from ..store.stream import _bias_probe

        self.adapter, self.shape, self.spec, self.dtype, self.device = like.adapter, like.shape, like.spec, dtype, device
        hooks = self.adapter.hooks
        if hooks is None or hooks.block is None:
            raise SymmergeError(f"{self.shape.hf_class}: the adapter names no block modules (HookPoints.block)")
        ends = like.ends()
        probe = _bias_probe(SimpleNamespace(part=like.part, shape=self.shape), ends)
        config = self.adapter.export_config(like.config, self.shape, {**ends, **probe})
        self.hf = weightless(config, self.shape.hf_class, dtype, device).to(dtype)  # buffers as build_hf_model casts them
        self.prefixes, self.block_keys = stand_in_blocks(self.hf, hooks, self.shape.n_layers, _PartBlock, self)
        self.end_keys = {k for k, _ in self.hf.named_parameters()}  # the stand-ins hide the blocks' parameters
        self.eps0 = float(ends["norm.eps"]) if "norm.eps" in ends else None
        self.rescale = self.eps0 is not None and SCALE in self.spec.groups
        self.source: Parts | None = None
        self.scale: dict = {}

    def _read(self, key) -> Params:
        """Part `key` of the source, at `like`'s eps (`evaluation.at_eps`, part by part)."""
        part = self.source.part(key)
        return apply(self.spec, self.scale, part) if self.scale else part

    def _cast(self, sd: Params, keys, prefix: str = "") -> Params:
        n = len(prefix)
        return {k[n:]: v.to(device=self.device, dtype=self.dtype) for k, v in sd.items() if k[n:] in keys}

    def block_state(self, i: int) -> Params:
        sd = self.adapter.block_from_canonical(self._read(i), self.shape, i)
        return self._cast(sd, self.block_keys[i], self.prefixes[i])

    @torch.no_grad()
    def mean_loss(self, source: Parts, batches: list[dict]) -> float:
        """The mean over `batches` of the stock loss of the parameters `source` serves (labels in every batch)."""
        if any("labels" not in b for b in batches):
            raise SymmergeError("each batch needs 'labels' (the task loss is the HF model's loss)")
        self.source, self.scale = source, {}
        try:
            final = source.part("final")
            if self.rescale:
                self.scale = {SCALE: torch.sqrt(self.eps0 / final["norm.eps"].to(torch.float64))}
            ends = {**self._read("embed"), **self._read("final")}
            state = self._cast(self.adapter.ends_from_canonical(ends, self.shape), self.end_keys)
            del ends, final
            losses = [functional_call(self.hf, state, args=(), kwargs=model_inputs(b, self.dtype, self.device, labels=True))
                      .loss for b in batches]
            return sum(float(x) for x in losses) / len(batches)
        finally:
            self.source, self.scale = None, {}
