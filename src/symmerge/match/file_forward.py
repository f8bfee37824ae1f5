"""The stock forward of a checkpoint folder, read from its files one block at a time: how the outputs of
learned / dual matching are checked against their inputs at any size (`outputs.logit_gap`).

`FileForward(path)` builds the stock HF model of the folder's class and config without weights
(`blockwise.weightless`: parameters on the meta device, buffers made as `from_pretrained(dtype=...)`
makes them) and replaces each block (`HookPoints.block`) by a stand-in that reads that block's tensors
from the safetensors files under their stock names (`Adapter.rename`, as `from_pretrained` maps legacy
names), casts them to `dtype` and runs the stock block on them; the top-level forward gets the tensors
outside the blocks the same way (a tied head takes the embedding, as the stock tie does). Nothing is
converted to canonical form: the stored weights are what is checked.

Invariant: `logits(batch)` is `from_pretrained(path, dtype=dtype)(**batch).logits`, the same modules on
the same weights in the same order (tests/test_outputs_bounded.py, every architecture). Memory: the
tensors outside the blocks and one block, in `dtype`, whatever the depth (float64 at Pythia-1.4B shape:
the embedding and head, 0.8 GB each, and a 0.4 GB block). Where it fails: a class whose top-level forward
reads block parameters outside the blocks (none of the supported ones), or without `HookPoints.block`.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from ..adapters import adapter_for
from ..adapters.stored import StoredNames
from ..errors import SymmergeError
from ..evaluation.forward import model_inputs
from ..store.io import Checkpoint
from ..store.model import tied_copies
from .blockwise import StandIn, weightless

Params = dict[str, torch.Tensor]


class _FileBlock(StandIn):
    """Stands in for one stock block (`key`: its name prefix): reads its tensors from the files, runs it on them."""

    def forward(self, *args, **kwargs):
        keys, prefix = [k for k, _ in self.stock.named_parameters()], self.i
        state = self.owner.read([prefix + k for k in keys])
        return functional_call(self.stock, {k: state[prefix + k] for k in keys}, args, kwargs)


class FileForward:
    """The stock forward of the checkpoint folder `path` in `dtype`, block by block from its files."""

    def __init__(self, path, dtype: torch.dtype = torch.float64):
        self.ckpt = Checkpoint(path)
        config = self.ckpt.config
        self.adapter = adapter_for(config)
        shape = self.adapter.shape(config)
        self.dtype = dtype
        self.names = StoredNames(self.adapter, self.ckpt)  # stock names -> the tensors in the files
        hooks = self.adapter.hooks
        if hooks is None or hooks.block is None:
            raise SymmergeError(f"{shape.hf_class}: the adapter names no block modules (HookPoints.block)")
        self.hf = weightless(config, shape.hf_class, dtype)
        for i in range(shape.n_layers):
            name = hooks.layer(i).block
            parent, _, idx = name.rpartition(".")
            self.hf.get_submodule(parent).register_module(idx, _FileBlock(self.hf.get_submodule(name), name + ".", self))
        self.end_keys = [k for k, _ in self.hf.named_parameters()]
        self.tied = tied_copies(config, shape.hf_class)  # a head the files may leave out -> the tensor it shares

    def read(self, keys: list[str]) -> Params:
        """The stock tensors `keys` from the files, in `dtype`; then the files are closed."""
        missing = [k for k in keys if k not in self.names]
        if missing:
            raise SymmergeError(f"{self.ckpt.path}: tensor {missing[0]} is missing; the checkpoint does not match its config.json")
        try:
            return {k: self.names.get(k).to(self.dtype) for k in keys}
        finally:
            self.ckpt.close()

    @torch.no_grad()
    def logits(self, batch: dict) -> torch.Tensor:
        inputs = model_inputs(batch, self.dtype)
        source = {k: (self.tied[k] if k in self.tied and k not in self.names else k) for k in self.end_keys}
        read = self.read(sorted(set(source.values())))
        return functional_call(self.hf, {k: read[s] for k, s in source.items()}, args=(), kwargs=inputs).logits
