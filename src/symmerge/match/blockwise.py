"""The block-wise forward of learned and dual matching: the stock HF blocks run one at a time on weights
materialised inside the forward, so that memory holds the frozen endpoints and one block's worth more.

- `Frozen`: one endpoint's canonical tensors, read part by part (`model.part_keys`: embeddings, each
  block, final norm and head) from a `Model` in memory or a `LazyModel` (its safetensors files read one
  part at a time, in float64), moved by a fixed element on the way if asked (dual: the absorbed
  weight-matching solution) and kept in the checkpoint's own dtype on the forward's device. 0-dim
  tensors (`norm.eps`) stay float64 on the CPU: the config's eps is a float64 number.
- `BlockwiseForward`: a stock HF model of the class built without weights (parameters on the meta
  device, buffers real), whose blocks (`HookPoints.block`) are replaced by stand-ins.
  `loss(part, batch)` runs the stock top-level forward with the embeddings, final norm and head
  materialised by `part("embed")` and `part("final")`; the stand-in of block i calls `part(i)` and the
  stock block on the result through `functional_call`, inside `torch.utils.checkpoint` (non-reentrant)
  when gradients are on: the backward recomputes the block's weights and activations instead of keeping
  them, so a step holds the endpoints, the ends, one block and the blocks' inputs, whatever the depth.
  `part` is the caller's: canonical tensors of one part (learned matching: the interpolated endpoints,
  each moved by its group element; the element of a block acts on that block's tensors only, the
  residual group on every part).

Invariant: `loss(part, batch)` is the stock HF loss of the state dict that `part` gives over all parts
(`evaluate.StockForward.loss` on the same canonical parameters, the plain path), by the same operations
in the same order; only the order in which gradients from different blocks are summed differs
(tests/test_blockwise.py checks loss and gradients on every architecture, and that a wrong block order
is caught). Where it fails: a stock class whose top-level forward reads block parameters outside the
block modules (none of the supported ones does), or an adapter without `HookPoints.block` (refused).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .. import SymmergeError
from ..evaluate import model_inputs
from ..model import InMemoryParts, Model, hf_class, part_keys

Params = dict[str, torch.Tensor]
#: what the backward recomputes of each block: "block" (its weights and activations: memory holds one
#: block's, whatever the depth), "weights" (its materialised weights only; the activations of every block are
#: kept, as in plain training: a forward less per step), "none" (nothing; every block's weights stay until the
#: backward, as a whole-model forward holds them)
RECOMPUTE = ("block", "weights", "none")
#: part key ("embed", block index, "final") -> canonical tensors of that part, in the forward's dtype and device
PartFn = Callable[[object], Params]


@functools.lru_cache(maxsize=1)
def _large_frees_to_the_os() -> None:
    """glibc: serve every allocation of 1 MiB or more by its own mapping, so that what a block materialises
    goes back to the OS when it is freed. With glibc's default (a threshold that rises to 32 MiB as big
    chunks are freed) the blocks' transients came from the heap, and small long-lived allocations (each
    block's saved input) between them kept it from shrinking: the RSS of a Pythia-410M-shaped dual step
    grew by about one block per layer (benchmarks/README.md). Elsewhere nothing is changed."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD (also stops the dynamic threshold)
    except (OSError, AttributeError):
        pass


class Frozen:
    """One endpoint's frozen canonical tensors, part by part, in `dtype` (default: the checkpoint's own) on
    `device`; `transform(part)` (float64, e.g. a fixed group element) is applied before they are kept.
    Peak memory while reading: what is kept plus one part in float64."""

    def __init__(self, source, device=None, transform: Callable[[Params], Params] | None = None, dtype=None):
        _large_frees_to_the_os()  # each part's float64 transient, freed, must not fragment the heap under what is kept
        self.shape, self.spec = source.shape, source.spec
        self.dtype = dtype or source.dtype
        reader = InMemoryParts(source.params) if isinstance(source, Model) else source
        self.parts: dict = {}
        for key in part_keys(self.shape):
            part = reader.part(key)
            if transform is not None:
                part = transform(part)
            self.parts[key] = {k: (v.detach().to(torch.float64) if v.dim() == 0 else v.detach().to(device=device, dtype=self.dtype))
                               for k, v in part.items()}

    def part(self, key) -> Params:
        return self.parts[key]

    def params(self) -> Params:
        """Every part's tensors in one dict (no copies)."""
        return {k: v for part in self.parts.values() for k, v in part.items()}

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.params().values())


@contextlib.contextmanager
def _parameters_on_meta():
    """Modules built inside register their parameters on the meta device (buffers stay where they are made)."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def weightless(config, class_name: str, dtype: torch.dtype, device=None):
    """A stock model of `class_name` for `config` with no weights (parameters on the meta device), its buffers
    made as `from_pretrained(dtype=dtype)` makes them (the default dtype set to `dtype` while it is built)."""
    from transformers.initialization import no_init_weights

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights(), _parameters_on_meta(), torch.device(device or "cpu"):
            model = hf_class(class_name)(config)
    finally:
        torch.set_default_dtype(old)
    return model.eval().requires_grad_(False)


class _StandIn(nn.Module):
    """Takes the place of stock block i: materialises its tensors and runs the stock block on them. Holds no
    parameters itself (the stock block is kept outside the module tree); other attributes are the block's."""

    def __init__(self, stock: nn.Module, i: int, owner: BlockwiseForward):
        super().__init__()
        self.__dict__["stock"], self.__dict__["owner"], self.__dict__["i"] = stock, owner, i

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["stock"], name)

    def forward(self, *args, **kwargs):
        owner, i = self.owner, self.i
        part = owner.current  # captured: the backward's recomputation materialises the same step's tensors

        def run(*a, **k):
            owner.materialising = True
            try:
                state = owner.block_state(part, i)
            finally:
                owner.materialising = False
            return functional_call(self.stock, state, a, k)

        if owner.recompute == "none" or not torch.is_grad_enabled():
            return run(*args, **kwargs)
        context = {} if owner.recompute == "block" else {"context_fn": owner.keep_activations}
        return checkpoint(run, *args, use_reentrant=False, **context, **kwargs)


class BlockwiseForward:
    """The stock forward of `model`'s class, fed one part at a time (see the module docstring).

    `endpoints`: the `Frozen` models whose parts the forward will be fed (their attention biases decide
    whether the exported config has bias slots, as `export_config` decides for a checkpoint)."""

    def __init__(self, model, endpoints: list[Frozen], dtype: torch.dtype, device=None, recompute: str = "block"):
        if recompute not in RECOMPUTE:
            raise SymmergeError(f"recompute must be one of {', '.join(RECOMPUTE)}, not {recompute!r}")
        self.adapter, self.shape, self.dtype, self.device, self.recompute = model.adapter, model.shape, dtype, device, recompute
        self.materialising = False
        _large_frees_to_the_os()
        hooks = self.adapter.hooks
        if hooks is None or hooks.block is None:
            raise SymmergeError(f"{self.shape.hf_class}: the adapter names no block modules (HookPoints.block); "
                                "learned matching runs the stock blocks one at a time and needs them")
        config = self.adapter.export_config(model.config, self.shape, _config_probe(endpoints, self.shape))
        config.use_cache = False  # a cache would be filled twice: once forward, once by the recomputation
        self.hf = weightless(config, self.shape.hf_class, dtype, device)
        self.prefixes, self.block_keys = [], []
        for i in range(self.shape.n_layers):
            name = hooks.layer(i).block
            parent, _, idx = name.rpartition(".")
            stock = self.hf.get_submodule(name)
            self.prefixes.append(name + ".")
            self.block_keys.append({k for k, _ in stock.named_parameters()})
            self.hf.get_submodule(parent).register_module(idx, _StandIn(stock, i, self))
        self.end_keys = {k for k, _ in self.hf.named_parameters()}  # the stand-ins hide the blocks' parameters
        self.current: PartFn | None = None

    def _policy(self, ctx, op, *args, **kwargs):
        """recompute="weights": what the materialisation computes, and every view (a view of a weight would
        keep it alive), is recomputed in the backward; every other output of the stock block is kept."""
        if self.materialising or any(r.alias_info is not None for r in op._schema.returns):
            return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE

    def keep_activations(self):
        return create_selective_checkpoint_contexts(self._policy)

    def _cast(self, sd: Params, keys, prefix: str = "") -> Params:
        n = len(prefix)
        return {k[n:]: v.to(device=self.device, dtype=self.dtype) for k, v in sd.items() if k[n:] in keys}

    def block_state(self, part: PartFn, i: int) -> Params:
        """Stock block i's parameters (names local to the block) from the canonical tensors `part(i)`."""
        return self._cast(self.adapter.block_from_canonical(part(i), self.shape, i), self.block_keys[i], self.prefixes[i])

    def end_state(self, part: PartFn) -> Params:
        """The stock model's parameters outside the blocks (embeddings, final norm, head) from `part`; with
        recompute="block", what it takes to materialise them is recomputed in the backward (only they are kept)."""
        names: list[str] = []

        def ends():
            canonical = {**part("embed"), **part("final")}
            sd = self._cast(self.adapter.ends_from_canonical(canonical, self.shape), self.end_keys)
            names[:] = names or list(sd)  # the recomputation returns them in the first call's order
            return tuple(sd[n] for n in names)

        run = checkpoint if self.recompute == "block" and torch.is_grad_enabled() else (lambda f, **_: f())
        values = run(ends, use_reentrant=False)
        return dict(zip(names, values))

    def forward(self, part: PartFn, batch: dict, labels: bool = True):
        """The stock model's output on `batch` with the weights `part` gives (with its loss when labelled)."""
        inputs = model_inputs(batch, self.dtype, self.device, labels=labels)
        self.current = part
        try:
            return functional_call(self.hf, self.end_state(part), args=(), kwargs=inputs)
        finally:
            self.current = None

    def loss(self, part: PartFn, batch: dict) -> torch.Tensor:
        if "labels" not in batch:
            raise SymmergeError("each batch needs 'labels' (the task loss is the HF model's loss)")
        return self.forward(part, batch).loss


def _config_probe(endpoints: list[Frozen], shape) -> Params:
    """What `export_config` reads of the parameters: the first endpoint's eps, and an attention bias per
    block that is non-zero where any endpoint's is (so the config keeps a slot for every non-zero bias)."""
    probe = {"norm.eps": endpoints[0].part("final")["norm.eps"]} if "norm.eps" in endpoints[0].part("final") else {}
    for i in range(shape.n_layers):
        for n in ("b_Q", "b_K", "b_V", "b_O"):
            name = f"blocks.{i}.attn.{n}"
            hit = any(name in f.part(i) and bool(f.part(i)[name].ne(0).any()) for f in endpoints)
            probe[name] = torch.ones(1, dtype=torch.float64) if hit else torch.zeros(1, dtype=torch.float64)
    return probe
