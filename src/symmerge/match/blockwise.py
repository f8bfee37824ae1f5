"""The block-wise forward of learned and dual matching: the stock HF blocks run one at a time on weights
materialised inside the forward, so that memory holds the frozen endpoints and one block's worth more.

- the endpoints: frozen stores (`frozen.Frozen`, or `sharded.Sharded` over processes), part by part.
- `BlockwiseForward`: a stock HF model of the class built without weights (parameters on the meta
  device, buffers real), whose blocks (`HookPoints.block`) are replaced by stand-ins.
  `loss(part, batch)` runs the stock top-level forward with the rest of the ends (final norm, a ViT's
  patch projection, ...) materialised by `part("embed")` and `part("final")`; the stand-in of block i
  calls `part(i)` and the stock block on the result through `functional_call`, inside
  `torch.utils.checkpoint` (non-reentrant) when gradients are on: the backward recomputes the block's
  weights and activations instead of keeping them, so a step holds the endpoints, one block and the
  blocks' inputs, whatever the depth. The vocabulary-sized ends are fed by rows (`Vocab`): an embedding
  gets only the rows of the batch's distinct ids, a head (or classifier) `head_rows` rows at a time, each
  chunk checkpointed like a block; no vocabulary x d_model tensor is materialised (each would be as large as
  the embedding, and a whole-table step would make several of them and their gradients).
  `part` is the caller's: canonical tensors of one part (learned matching: the interpolated endpoints,
  each moved by its group element; the element of a block acts on that block's tensors only, the
  residual group on every part), optionally only some tensors and rows (`PartFn`).

Invariant: `loss(part, batch)` is the stock HF loss of the state dict that `part` gives over all parts
(`evaluation.StockForward.loss` on the same canonical parameters, the plain path), by the same operations
in the same order, but for the rows: a lookup in the rows it asks for, and a head's output computed in
chunks of rows, are the whole table's row by row (the group acts on their d_model axis only; checked
per tensor, `vocab_modules`); the order in which gradients from different blocks are summed differs
(tests/test_blockwise.py checks loss and gradients on every architecture, that a wrong block order and
rows one further on are caught, and a padding index). Where it fails: a stock class whose top-level
forward reads block parameters outside the block modules (none of the supported ones does), or an
adapter without `HookPoints.block` (refused).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ..errors import SymmergeError
from ..evaluation.forward import model_inputs
from ..store.model import default_dtype, hf_class, runs_in
from ..store.parts import Params, part_of
from .frozen import Frozen
from .heap import large_frees_to_the_os

#: what `end_state` hands `ends_from_canonical` for a tensor fed by rows (never reaches the stock model)
_ABSENT = torch.empty(0, dtype=torch.float64)
#: what the backward recomputes of each block: "block" (its weights and activations: memory holds one
#: block's, whatever the depth), "weights" (its materialised weights only; the activations of every block are
#: kept, as in plain training: a forward less per step), "none" (nothing; every block's weights stay until the
#: backward, as a whole-model forward holds them), "auto" ("none" where `kept_for_backward` of the batch is at most
#: `AUTO_KEEP_BYTES`, else "block": the small models whose steps the recomputation slows most, at little memory)
RECOMPUTE = ("auto", "block", "weights", "none")
#: recompute="auto": the most bytes a step may keep for the backward beyond "block"'s to run with nothing recomputed
AUTO_KEEP_BYTES = 256 << 20
#: part(key, rows=None): the canonical tensors of part `key` ("embed", a block index, "final") in the forward's
#: dtype and device; with `rows` ({canonical name: indices, a slice, or None for all}), only those tensors, each
#: restricted to those rows of axis 0 before it is acted on
PartFn = Callable[..., Params]


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

    with default_dtype(dtype), no_init_weights(), _parameters_on_meta(), torch.device(device or "cpu"):
        model = hf_class(class_name)(runs_in(config, dtype))
    return model.eval().requires_grad_(False)


class StandIn(nn.Module):
    """Takes the place of a stock module in the model tree and runs it on tensors it is given (`forward`, in
    subclasses). Holds no parameters itself (the stock module is kept outside the tree, so the model's own
    parameters are the rest); other attributes are the stock module's. `key`: what the subclass needs to know
    of its place (a block index, a `Vocab`, a name prefix)."""

    def __init__(self, stock: nn.Module, key, owner):
        super().__init__()
        self.__dict__["stock"], self.__dict__["owner"], self.__dict__["i"] = stock, owner, key

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["stock"], name)


class _StandIn(StandIn):
    """Stock block i: materialises its tensors and runs the stock block on them."""

    def forward(self, *args, **kwargs):
        owner, i = self.owner, self.i
        part = owner.current  # captured: the backward's recomputation materialises the same step's tensors
        return owner.run_on(self.stock, lambda: owner.block_state(part, i), args, kwargs)


def stand_in_blocks(hf: nn.Module, hooks, n_layers: int, kind: type[StandIn], owner) -> tuple[list[str], list[set]]:
    """Every stock block of `hf` (`hooks.layer(i).block`) replaced by `kind(stock block, i, owner)`; returns each
    block's name prefix and the names of its parameters (local to the block)."""
    prefixes, keys = [], []
    for i in range(n_layers):
        name = hooks.layer(i).block
        parent, _, idx = name.rpartition(".")
        stock = hf.get_submodule(name)
        prefixes.append(name + ".")
        keys.append({k for k, _ in stock.named_parameters()})
        hf.get_submodule(parent).register_module(idx, kind(stock, i, owner))
    return prefixes, keys


@dataclass(frozen=True)
class Vocab:
    """A stock end module (`nn.Embedding` or `nn.Linear`) whose parameters are canonical tensors, as they are,
    with a row axis (axis 0: vocabulary, positions, classes) on which no group acts: one row of their
    transformed and interpolated values depends on that row of the endpoints' only. `tensors`: parameter
    name -> canonical name; `part`: the part they belong to; `rows`: the size of axis 0."""

    module: str
    part: str
    tensors: dict
    rows: int


class _EmbeddingStandIn(StandIn):
    """An `nn.Embedding` fed only the rows its input asks for: the input's distinct ids `u` (sorted), their
    rows materialised, and the stock module run on the positions of the ids in `u` (its `padding_idx` moved
    along, so the gradient skips what it skipped). The same vectors as a lookup in the whole table."""

    def forward(self, ids):
        owner, vocab, stock = self.owner, self.i, self.stock
        part = owner.current
        u, inv = torch.unique(ids, return_inverse=True)
        pad = stock.padding_idx
        hit = (u == pad).nonzero() if pad is not None else None
        stock.padding_idx = int(hit[0, 0]) if hit is not None and hit.numel() else None
        try:
            return functional_call(stock, owner.vocab_state(part, vocab, u), (inv,))
        finally:
            stock.padding_idx = pad


class _HeadStandIn(StandIn):
    """An `nn.Linear` read by rows (the head, a classifier): its outputs computed `owner.head_rows` rows at a
    time, each chunk's weights materialised inside it (and recomputed in the backward like a block's), then
    concatenated: the same outputs as the whole layer, with one chunk's weights in memory."""

    def forward(self, x):
        owner, vocab, stock = self.owner, self.i, self.stock
        part = owner.current
        step = max(1, owner.head_rows)
        outs = []
        for start in range(0, vocab.rows, step):
            rows = slice(start, min(vocab.rows, start + step))
            outs.append(owner.run_on(stock, lambda rows=rows: owner.vocab_state(part, vocab, rows), (x,), {}))
        return outs[0] if len(outs) == 1 else torch.cat(outs, -1)


def _rows_free(spec, name: str) -> bool:
    """No group of `spec` acts on axis 0 of canonical tensor `name` (a scalar group scales every row alike)."""
    return all(not spec.groups[a.group].structure.acts_on_axis or (a.axis != 0 and 0 not in a.batch_axes)
               for a in spec.actions.get(name, ()))


def _row_wise(m: nn.Module) -> bool:
    """Exactly `nn.Linear`, or `nn.Embedding` without `max_norm` (which renormalises rows in place): the class itself or
    a stock scaled embedding (Gemma's `*ScaledWordEmbedding`: the lookup times the constant `embed_scale`)."""
    scaled = type(m).__name__.endswith("ScaledWordEmbedding") and hasattr(m, "embed_scale")
    return type(m) is nn.Linear or (isinstance(m, nn.Embedding) and m.max_norm is None and (type(m) is nn.Embedding or scaled))


def vocab_modules(hf: nn.Module, adapter, shape, spec, ends: Params) -> list[Vocab]:
    """The stock end modules that can be fed by rows (`Vocab`, `_row_wise`), each of whose parameters
    `ends_from_canonical` passes through as a canonical tensor of `ends` (found by identity), no group acting on its
    axis 0. The rest of the ends is materialised whole."""
    sd = adapter.ends_from_canonical(ends, shape)
    canonical = {hf_name: c for hf_name, v in sd.items() for c, t in ends.items() if v is t and t.dim() >= 1}
    found = []
    for name, module in ((n, m) for n, m in hf.named_modules() if _row_wise(m)):
        local = {n: f"{name}.{n}" for n, _ in module.named_parameters(recurse=False)}
        if not local or not all(h in canonical for h in local.values()):
            continue
        tensors = {n: canonical[h] for n, h in local.items()}
        sizes = {ends[c].shape[0] for c in tensors.values()}
        parts = {part_of(c) for c in tensors.values()}
        if len(sizes) == 1 and len(parts) == 1 and all(_rows_free(spec, c) for c in tensors.values()):
            found.append(Vocab(name, parts.pop(), tensors, sizes.pop()))
    return found


class BlockwiseForward:
    """The stock forward of `model`'s class, fed one part at a time (see the module docstring).

    `endpoints`: the `Frozen` models whose parts the forward will be fed (their attention biases decide
    whether the exported config has bias slots, as `export_config` decides for a checkpoint)."""

    def __init__(self, model, endpoints: list[Frozen], dtype: torch.dtype, device=None, recompute: str = "auto"):
        if recompute not in RECOMPUTE:
            raise SymmergeError(f"recompute must be one of {', '.join(RECOMPUTE)}, not {recompute!r}")
        if recompute == "auto" and any(e.collective for e in endpoints):
            recompute = "block"  # not decided by a process's own batch, and the order the sharded prefetch expects
        self.adapter, self.shape, self.dtype, self.device, self.recompute = model.adapter, model.shape, dtype, device, recompute
        self.mode = "block"  # what the current forward's backward recomputes (`resolved`, set by `forward`)
        self.materialising = False
        large_frees_to_the_os()
        hooks = self.adapter.hooks
        if hooks is None or hooks.block is None:
            raise SymmergeError(f"{self.shape.hf_class}: the adapter names no block modules (HookPoints.block); "
                                "learned matching runs the stock blocks one at a time and needs them")
        config = self.adapter.export_config(model.config, self.shape, _config_probe(endpoints, self.shape))
        config.use_cache = False  # a cache would be filled twice: once forward, once by the recomputation
        self.hf = weightless(config, self.shape.hf_class, dtype, device)
        self.prefixes, self.block_keys = stand_in_blocks(self.hf, hooks, self.shape.n_layers, _StandIn, self)
        ends = endpoints[0].ends()
        self.vocab = vocab_modules(self.hf, self.adapter, self.shape, model.spec, ends)
        self.vocab_names = {c for v in self.vocab for c in v.tensors.values()}
        for v in self.vocab:
            parent, _, idx = v.module.rpartition(".")
            kind = _EmbeddingStandIn if isinstance(self.hf.get_submodule(v.module), nn.Embedding) else _HeadStandIn
            stand_in = kind(self.hf.get_submodule(v.module), v, self)
            (self.hf.get_submodule(parent) if parent else self.hf).register_module(idx, stand_in)
        #: the canonical tensors of each end part materialised whole (the vocabulary tensors are fed by rows)
        self.rest = {key: [k for k, t in endpoints[0].part(key).items() if t.dim() > 0 and k not in self.vocab_names]
                     for key in ("embed", "final")}
        self.end_keys = {k for k, _ in self.hf.named_parameters()}  # the stand-ins hide the blocks' parameters
        self.current: PartFn | None = None
        #: rows of a head (`_HeadStandIn`) materialised at a time: about 2^24 weights
        self.head_rows = max(1, (1 << 24) // self.shape.d_model)

    def run_on(self, stock: nn.Module, state: Callable[[], Params], args, kwargs):
        """`stock` run on the tensors `state()` materialises; inside a checkpoint when gradients are on (the
        backward recomputes what `recompute` says)."""
        def run(*a, **k):
            self.materialising = True
            try:
                tensors = state()
            finally:
                self.materialising = False
            return functional_call(stock, tensors, a, k)

        if self.mode == "none" or not torch.is_grad_enabled():
            return run(*args, **kwargs)
        context = {} if self.mode == "block" else {"context_fn": self.keep_activations}
        return checkpoint(run, *args, use_reentrant=False, **context, **kwargs)

    def vocab_state(self, part: PartFn, vocab: Vocab, rows) -> Params:
        """The parameters of `vocab`'s module restricted to `rows` (indices or a slice of axis 0)."""
        tensors = part(vocab.part, {c: rows for c in vocab.tensors.values()})
        return {n: tensors[c].to(device=self.device, dtype=self.dtype) for n, c in vocab.tensors.items()}

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
        """The stock model's parameters outside the blocks and the vocabulary modules (embeddings, final norm,
        head, as far as they are not fed by rows) from `part`; with recompute="block", what it takes to
        materialise them is recomputed in the backward (only they are kept)."""
        names: list[str] = []

        def ends():
            canonical = {c: _ABSENT for c in self.vocab_names}  # fed by rows: `ends_from_canonical` passes them through
            for key in ("embed", "final"):
                canonical.update(part(key, {k: None for k in self.rest[key]}))
            sd = self._cast(self.adapter.ends_from_canonical(canonical, self.shape), self.end_keys)
            names[:] = names or list(sd)  # the recomputation returns them in the first call's order
            return tuple(sd[n] for n in names)

        run = checkpoint if self.mode == "block" and torch.is_grad_enabled() else (lambda f, **_: f())
        values = run(ends, use_reentrant=False)
        return dict(zip(names, values))

    def forward(self, part: PartFn, batch: dict, labels: bool = True):
        """The stock model's output on `batch` with the weights `part` gives (with its loss when labelled)."""
        inputs = model_inputs(batch, self.dtype, self.device, labels=labels)
        self.mode = self.resolved(inputs)
        self.current = part
        try:
            return functional_call(self.hf, self.end_state(part), args=(), kwargs=inputs)
        finally:
            self.current = None

    def resolved(self, inputs: dict) -> str:
        """What the backward recomputes on the batch of forward kwargs `inputs`: `recompute`, "auto" resolved by the
        batch's `kept_for_backward`."""
        if self.recompute != "auto":
            return self.recompute
        kept = kept_for_backward(self.shape, *_tokens(inputs, self.shape), self.dtype.itemsize)
        return "none" if kept <= AUTO_KEEP_BYTES else "block"

    def loss(self, part: PartFn, batch: dict) -> torch.Tensor:
        if "labels" not in batch:
            raise SymmergeError("each batch needs 'labels' (the task loss is the HF model's loss)")
        return self.forward(part, batch).loss


def _tokens(inputs: dict, shape) -> tuple[int, int]:
    """(tokens, sequence length) of a batch's forward kwargs: its token ids', or an image's `n_positions` each."""
    ids = inputs.get("input_ids")
    if ids is not None:
        return ids.numel(), ids.shape[-1]
    images = next(v for v in inputs.values() if torch.is_tensor(v)).shape[0]
    return images * shape.n_positions, shape.n_positions


def kept_for_backward(shape, tokens: int, context: int, itemsize: int) -> int:
    """Bytes that recompute="none" keeps for the backward beyond what "block" keeps, estimated from above: per
    block, its weights four times (each endpoint moved by its element, their interpolation, the stock block's views)
    and twice what a stock block saves per token (norm outputs, q, k, v, attention probabilities and output, the
    MLP's hidden units of each chosen expert and of a shared expert, residual sums), plus the head's rows (the vocabulary by d_model) and
    the logits. Where it fails: a stock block that saves more per token than this counts (none of the supported
    ones does at these factors); the memory a step takes besides is `learned_memory.py`'s."""
    s = shape
    experts = max(1, s.n_experts)
    ffn = (3 if s.gated else 2) * (s.d_mlp * experts + s.d_shared)
    weights = s.d_model * (s.d_head * 2 * (s.n_heads + s.n_kv_heads) + ffn + bool(s.d_shared))
    per_token = (8 * s.d_model + 6 * s.n_heads * s.d_head + s.n_heads * context
                 + (4 if s.gated else 2) * (s.d_mlp * max(1, s.experts_per_token) + s.d_shared))
    ends = 4 * s.vocab * s.d_model + 2 * tokens * s.vocab
    return (s.n_layers * (4 * weights + 2 * tokens * per_token) + ends) * itemsize


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
