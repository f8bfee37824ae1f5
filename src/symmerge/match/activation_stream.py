"""Activation matching streamed block by block: the method of `activation.py`, in the memory of weight matching.

Both models run on the same batches one block at a time: the stock HF model of each checkpoint's
canonical export is built without weights (`blockwise.weightless`), its blocks (`HookPoints.block`)
replaced by stand-ins that only record what the top-level forward hands them (the residual stream
after the embeddings, and each block's other arguments: masks, rotary tables). Then, for block i, the
stock block of each model runs on every batch with block i's weights alone (read from the checkpoint,
`LazyModel.part`), the adapter's hook points (`HookPoints`) feed statistics, the outputs replace the
streams, and layer i's groups are solved before block i + 1 is read. Held at any time: one block of
each model, the ends, both residual streams of the sample (`tokens x d`), one layer's statistics and
the residual ones; never the activations of more than one block.

Statistics, and why they give today's answer (`activation.activation_match`, up to rounding):
- residual rotation: `sum a b^T` over every normalised stream (d x d), as the in-memory cross-product;
- head permutation: `sum P_a P_b^T` of the attention patterns, the in-memory overlap;
- FFN: count, means and centred co-moments of the hidden units, merged batch by batch (Chan et al.),
  give exactly the correlation and RMS the in-memory path computes from stored columns; a mixture of
  experts' input is kept for the block's tokens (as the streams are) and its experts' statistics are summed
  from it, a block of experts at a time (`activation_experts.py`);
- QK / OV maps: every solver (`solvers.solve_map`) reads its data `Xa, Xb, Ya, Yb` only through the
  Gram matrices within {Xa, Xb} and within {Ya, Yb}. Each side is affine in the attention input x,
  `W x + b = W~ [x; 1]`, so those Grams are `W~ M W~^T` with M the joint second moment of `[x_A; 1;
  x_B; 1]` (accumulated). The solver is then fed square-root factors of the Grams (`2 dh` columns per
  KV group) in place of the tokens: the same Grams, hence the same maps.
- the residual scale (invisible to the data) and the reported objective come from weight statistics
  (`residual.ResidualFit`) of the parts read on the way: the least-squares scale given everything else,
  as `weight_steps.solve_scaling` gives it in memory.
Where it fails: as `activation.py` (the hook points' invariants), and a stock class whose top-level
forward reads block parameters outside the block modules or passes blocks arguments that depend on
other blocks' outputs (none of the supported ones does).
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.func import functional_call

from ..algebra import groups as G
from ..algebra.apply import apply
from ..algebra.spec import ROTATION, SCALE
from ..errors import SymmergeError
from ..evaluation.forward import model_inputs
from ..store.model import as_parts
from .activation import ffn_step, head_maps, head_perms, hook_stream, in_a_order, map_sides, side_data, writer_scale
from .activation_experts import expert_step
from .activation_stats import FfnMoments, sides_factor
from .blockwise import weightless
from .residual import ResidualFit
from .solvers import best_rotation
from .weight import MatchResult


class _Recorder(nn.Module):
    """Stands in for stock block i: records the arguments the top-level forward gives it, returns its input."""

    def __init__(self, i: int, log: dict):
        super().__init__()
        self.i, self.log = i, log

    def forward(self, hidden, *args, **kwargs):
        self.log[self.i] = (hidden, args, kwargs)
        return hidden


class Runner:
    """One model's stock blocks, run one at a time on recorded inputs (see the module docstring).

    `source`: a `LazyModel` (or a `Model`, served part by part); `dtype`: the forward's precision; `device`:
    where the forward runs (default: the CPU)."""

    def __init__(self, source, dtype: torch.dtype, device=None):
        from types import SimpleNamespace

        from ..store.stream import _bias_probe

        self.parts = as_parts(source)
        self.adapter, self.shape, self.dtype = source.adapter, source.shape, dtype
        self.device = torch.device("cpu") if device is None else torch.device(device)
        hooks = self.adapter.hooks
        if hooks is None or not hooks.norms or hooks.block is None or hooks.attention is None:
            raise SymmergeError(f"activation matching has no hook points for {self.adapter.name}; use --method weight")
        self.hooks = hooks
        ends = self.parts.ends()
        self.eps = ends.get("norm.eps")
        probe = _bias_probe(SimpleNamespace(part=self.parts.part, shape=self.shape), ends)
        config = self.adapter.export_config(source.config, self.shape, {**ends, **probe})
        config._attn_implementation = "eager"  # attention patterns are only returned by the eager path
        config.use_cache = False
        self.hf = weightless(config, self.shape.hf_class, dtype, self.device)
        self.base, prefix = self.hf.base_model, self.hf.base_model_prefix + "."
        sd = self.adapter.ends_from_canonical(ends, self.shape)
        self.base_state = {k[len(prefix):]: self._cast(v) for k, v in sd.items() if k.startswith(prefix)}
        self.log: dict = {}
        self.blocks = []
        for i in range(self.shape.n_layers):
            name = hooks.layer(i).block
            parent, _, idx = name.rpartition(".")
            self.blocks.append(self.hf.get_submodule(name))
            self.hf.get_submodule(parent).register_module(idx, _Recorder(i, self.log))
        norm = hooks.final_norm
        self.final_norm = self.hf.get_submodule(norm)
        self.final_state = {k[len(norm) + 1:]: self._cast(v) for k, v in sd.items() if k.startswith(norm + ".")}

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self.device, dtype=self.dtype)

    def start(self, batch: dict):
        """The stream after the embeddings, each block's other arguments, and the token mask, for one batch."""
        inputs = model_inputs(batch, self.dtype, self.device)
        self.log.clear()
        with torch.no_grad():
            functional_call(self.base, self.base_state, args=(), kwargs=inputs)
        mask = inputs.get("attention_mask")
        calls = [self.log[i][1:] for i in range(self.shape.n_layers)]
        return self.log[0][0], calls, (mask.bool() if mask is not None else None)

    def block_state(self, i: int, part: dict) -> dict:
        prefix = self.hooks.layer(i).block + "."
        sd = self.adapter.block_from_canonical(part, self.shape, i)
        local = {k for k, _ in self.blocks[i].named_parameters()}
        return {k[len(prefix):]: self._cast(v) for k, v in sd.items() if k[len(prefix):] in local}

    def run(self, i: int, state: dict, hidden, call, keep):
        """Block i on one batch; `keep(kind, tensor)` receives what the hook points see."""
        h = self.hooks.layer(i)
        block, prefix = self.blocks[i], h.block + "."
        local = lambda n: block.get_submodule(n[len(prefix):])  # noqa: E731
        handles = [hook_stream(local(n), lambda t, n=n: keep(("norm", n), t), h.reads_inputs) for n in h.norms]
        handles.append(hook_stream(local(h.moe_input), lambda t: keep("moe_x", t), True) if self.shape.experts_in(i)
                       else hook_stream(local(h.ffn_hidden), lambda t: keep("ffn", t), True))
        handles.append(local(h.attention).register_forward_hook(lambda m, a, o: keep("pattern", o[1])))
        try:
            with torch.no_grad():
                return functional_call(block, state, args=(hidden, *call[0]), kwargs=call[1])
        finally:
            for x in handles:
                x.remove()

    def final(self, hidden):
        with torch.no_grad():
            return functional_call(self.final_norm, self.final_state, (hidden,))


def _tokens(t: torch.Tensor, mask, dtype: torch.dtype) -> torch.Tensor:
    """`[batch, seq, features] -> [tokens, features]` (the unmasked tokens), in the statistics' precision
    `dtype` (a 16-bit forward's activations are summed in it, not in 16 bits)."""
    t = t.detach().to(dtype)
    return t.reshape(-1, t.shape[-1]) if mask is None else t[mask]


class _Residual:
    """The residual rotation's statistics: `sum a b^T` over every normalised stream, and both sides' norms."""

    def __init__(self, d: int, device):
        self.c, self.aa, self.bb = torch.zeros(d, d, dtype=G.DTYPE, device=device), 0.0, 0.0

    def add(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.c += a.T @ b
        self.aa, self.bb = self.aa + float((a * a).sum()), self.bb + float((b * b).sum())


def activation_match_streaming(a, b, batches: list[dict], families: list[str] | None = None,
                               max_tokens: int = 20000, dtype: torch.dtype = torch.float64,
                               progress: bool = False, device=None, forward: torch.dtype | None = None) -> MatchResult:
    """The element g making g·B's activations closest to A's, streamed (see the module docstring).

    `a`, `b`: `LazyModel`s (or `Model`s); `dtype`: the precision of the statistics, and of the forward unless
    `forward` says otherwise (float64: the in-memory path to rounding; float32 at scale; `forward` bfloat16:
    16-bit activations summed in `dtype`); `device`: where the forward runs and the statistics are summed
    (default: the CPU; the groups are solved on the CPU). Batches are taken in order until `max_tokens`
    tokens are reached."""
    from ..runtime.progress import tqdm

    start = time.perf_counter()
    ra, rb = Runner(a, forward or dtype, device), Runner(b, forward or dtype, device)
    spec = b.spec.restricted(families)
    chosen = set(spec.select(families))
    streams, count = [], 0
    for batch in batches:
        ha, calls_a, mask = ra.start(batch)
        hb, calls_b, _ = rb.start(batch)
        streams.append([ha, hb, calls_a, calls_b, mask])
        count += int(mask.sum()) if mask is not None else ha.shape[0] * ha.shape[1]
        if count >= max_tokens:
            break
    if not streams:
        raise SymmergeError("the data gave no batches; check --data")
    ra.base_state = rb.base_state = None  # the embeddings are no longer needed
    g = {n: G.identity(grp) for n, grp in spec.groups.items()}
    fit: dict = {}
    res = _Residual(spec.shape.d_model, ra.device)
    at_start, moved = ResidualFit(spec), ResidualFit(spec)
    for key in ("embed", "final"):
        pa, pb = ra.parts.part(key), rb.parts.part(key)
        at_start.add_distances(pa, pb)
        moved.add(pa, pb)
    scale = writer_scale(spec, chosen, ra.eps, rb.eps)
    for i in tqdm(range(spec.shape.n_layers), desc="activation matching", disable=not progress):
        pa, pb = ra.parts.part(i), rb.parts.part(i)
        _layer(spec, chosen, g, fit, i, ra, rb, pa, pb, streams, res, scale, dtype)
        at_start.add_distances(pa, pb)
        moved.add(pa, apply(spec, {n: x for n, x in g.items() if spec.groups[n].layer == i}, pb))
        del pa, pb
    for s in streams:
        res.add(_tokens(ra.final(s[0]), s[4], dtype), _tokens(rb.final(s[1]), s[4], dtype))
    rot = ROTATION
    if rot in chosen:
        g[rot] = best_rotation(spec.groups[rot], res.c.cpu())
        fit["residual_r2"] = 1 - (res.aa + res.bb - 2 * float((g[rot] * res.c.cpu()).sum())) / res.aa
    r, s = g[rot], torch.tensor(1.0, dtype=G.DTYPE)
    if SCALE in chosen:  # invisible to the data: the least-squares scale given everything else
        r, s = moved.solve(r, s, rotation=False, scale=True)
        g[SCALE] = s
    history = [1.0 - at_start.distance(r, s) / at_start.norm2(), 1.0 - moved.distance(r, s) / moved.norm2()]
    fit["tokens"] = count
    return MatchResult(g, history, time.perf_counter() - start, 0, len(chosen), {"fit": fit})


def _layer(spec, chosen, g, fit, i, ra, rb, pa, pb, streams, res: _Residual, scale: float, dtype) -> None:
    """Block i of both models on every batch (statistics accumulated in `dtype` and float64 on the forward's
    device, streams advanced), then layer i's groups (on the CPU)."""
    sa, sb = ra.block_state(i, pa), rb.block_state(i, pb)
    h = ra.hooks.layer(i)
    d, heads = spec.shape.d_model, spec.shape.n_heads
    ffn = FfnMoments()  # in `dtype` (float32 at scale: d_mlp^2 entries)
    moe_x: tuple[list, list] = ([], [])  # a mixture of experts' input, batch by batch (the experts run later)
    moment = torch.zeros(2 * d + 2, 2 * d + 2, dtype=G.DTYPE, device=ra.device)  # of [x_A; 1; x_B; 1], x the attention input
    patterns = torch.zeros(heads, heads, dtype=G.DTYPE, device=ra.device)
    tokens = lambda t, mask: _tokens(t, mask, dtype)  # noqa: E731
    for s in streams:
        mask = s[4]
        seen = {}
        s[0] = ra.run(i, sa, s[0], s[2][i], lambda k, t, seen=seen: seen.__setitem__(("A", k), t))
        s[1] = rb.run(i, sb, s[1], s[3][i], lambda k, t, seen=seen: seen.__setitem__(("B", k), t))
        for n in h.norms:
            res.add(tokens(seen[("A", ("norm", n))], mask), tokens(seen[("B", ("norm", n))], mask))
        xa, xb = tokens(seen[("A", ("norm", h.attn_norm))], mask), tokens(seen[("B", ("norm", h.attn_norm))], mask)
        one = torch.ones(xa.shape[0], 1, dtype=xa.dtype, device=xa.device)
        z = torch.cat([xa, one, xb, one], 1)  # [tokens, 2d + 2]
        moment += z.T @ z
        if spec.shape.experts_in(i):
            moe_x[0].append(tokens(seen[("A", "moe_x")], mask))
            moe_x[1].append(tokens(seen[("B", "moe_x")], mask))
        else:
            ffn.add(tokens(seen[("A", "ffn")], mask), tokens(seen[("B", "ffn")], mask))
        pat = [seen[(m, "pattern")].detach().to(G.DTYPE) for m in "AB"]  # [batch, heads, T, T]
        pat = [p.transpose(0, 1).reshape(heads, -1) for p in pat]
        patterns += pat[0] @ pat[1].T
    head_perms(spec, chosen, g, patterns.cpu(), i)
    moment = moment.cpu()
    kind = pa[next(iter(pa))].dtype  # the canonical tensors' precision
    basis = torch.cat([torch.eye(d, dtype=kind), torch.zeros(d, 1, dtype=kind)], 1)  # x~ = [x; 1] -> x
    ones = torch.zeros(d + 1, dtype=kind)
    ones[d] = 1.0

    def sides(name, p, inner_p):
        wa = map_sides(spec, pa, basis, name, ROTATION, 1.0, ones)  # each side as W~ [kv, (q,) dh, d + 1]
        wb = {k: in_a_order(v, p, inner_p) for k, v in map_sides(spec, pb, basis, name, ROTATION, scale, ones).items()}
        out = []
        for how in ("g", "inv_t"):
            if how not in wa:
                out += [side_data({}, how, spec.shape)] * 2
                continue
            out += list(sides_factor(wa[how], wb[how], moment))
        return out[0], out[1], out[2], out[3]

    head_maps(spec, chosen, g, i, sides)
    if spec.shape.experts_in(i):
        expert_step(spec, chosen, g, fit, *moe_x, pa, pb, i)
        return
    corr, rms_a, rms_b = (t.cpu() for t in ffn.correlation())
    ffn_step(spec, chosen, g, fit, corr, rms_a, rms_b, i)
