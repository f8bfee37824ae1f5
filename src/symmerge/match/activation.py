"""Activation matching: the same groups as weight matching, found from both models' activations on data.

Activations come from forward hooks on the stock HF model of each checkpoint's canonical export
(`model.build_hf_model`), so readers see the normalised stream; the modules hooked are the adapter's
`hooks` (`adapters.base.HookPoints`), and which tensors make up each side of a map is read off the
spec's actions. For each group:

- residual rotation: Procrustes (an assignment for signed permutations) between the streams the readers
  read (every norm's output, all layers; under post-norms the attention's and the MLP's inputs): the
  stream of g·B is `O` times B's (normalisation removes the residual scale);
- FFN permutation: assignment on the correlation of hidden units (the down projection's input),
  on |correlation| when GLU scales (which may flip signs) are matched too; GLU scale: sign of the
  correlation times the ratio of the units' RMS (exact for a planted scale, never near 0);
- a mixture of experts' layer: every expert run densely on the stream the experts read, the experts assigned
  on the value of their best unit assignment, then the units inside matched experts (`activation_experts.py`);
- head permutation: assignment on the overlap of attention patterns, which the QK and OV maps
  leave unchanged (query heads inside KV groups as in weight matching);
- QK map: balanced least squares (`solvers.solve_map`) between the matched heads' "g" side (queries)
  and "inv_t" side (keys), taken before RoPE (the maps commute with it) from the captured attention
  input and the canonical weights; OV map: the same balanced least squares between the values
  `W_V x` ("g" side: `N W_V`) and `W_O^T x` ("inv_t" side: `W_O N^{-1}` gives `N^{-T} W_O^T x`),
  x the normalised stream the attention reads (exact for a planted element: B's stream is `R^T` A's;
  B's writers carry the residual scale, divided out as `sqrt(eps_B / eps_A)` when it is matched).
  Fitting the values (or head outputs) alone is one-sided: least squares shrinks N for weakly related
  models and W_O's `N^{-1}` then blows up (two digit ViTs, seeds 0/1: barrier 3.58 with every family
  but the residual scale, 0.35 with both sides; the weight-matching maps given the same rotation and
  heads gave 0.39);
- groups the data cannot see (the residual scale: normalisation hides it) are set by the weight-matching
  step given the rest.

Here (`activation_match`) every activation is kept in memory (at most `max_tokens` tokens): the method's
definition, for small models and samples. `symmerge align` runs `activation_stream.py` instead, which
streams both models block by block from their checkpoints and gives the same element from accumulated
statistics (tests/test_activation_stream.py); the solving steps below (`head_perms`, `head_maps`,
`ffn_step`, `map_sides`) are shared by both. Each group's cost here is blind to the others (the streams do
not move under the per-block groups, the hidden units and patterns not under the rotation); `align` and
`merge` then re-solve the per-block groups by weight matching given the rotation (`activation_blocks.py`)
unless `--blocks activation`.
"""

from __future__ import annotations

import time

import torch

from ..algebra import groups as G
from ..algebra.spec import ROTATION
from ..errors import SymmergeError
from ..evaluation.forward import model_inputs
from ..store.model import Model, build_hf_model, export_state_dict
from .activation_experts import expert_step, unit_step
from .costs import touching
from .solvers import best_rotation, solve_map
from .weight import MatchResult
from .weight_state import State, scatter
from .weight_steps import assign_heads, solve_scaling


def _hf_model(model: Model):
    config, sd = export_state_dict(model, dtype=torch.float64)
    config._attn_implementation = "eager"  # attention patterns are only returned by the eager path
    return build_hf_model(config, sd, model.shape.hf_class)


def hook_stream(module, fn, reads_input: bool):
    """Register `fn(tensor)` on what `module` hands on (its output) or, with `reads_input`, on what it is given
    (its first positional argument, else its first tensor keyword: HF blocks call attention with
    `hidden_states=`). Returns the handle."""
    if not reads_input:
        return module.register_forward_hook(lambda m, args, out: fn(out))

    def pre(m, args, kwargs):
        fn(args[0] if args else next(v for v in kwargs.values() if torch.is_tensor(v)))

    return module.register_forward_pre_hook(pre, with_kwargs=True)


def _hook_points(model: Model) -> list[tuple[str, tuple, bool]]:
    """(module, key, whether its input is hooked) for every activation kept: the streams the readers read
    (("norm", name)), the attention's input (("x_attn", i)) and the FFN hidden vector (("ffn", i)), or in a
    mixture of experts the stream the experts read (("moe_x", i))."""
    hooks = model.adapter.hooks
    if hooks is None or not hooks.norms:
        raise SymmergeError(f"activation matching has no hook points for {model.adapter.name}; use --method weight")
    layers = [hooks.layer(i) for i in range(model.shape.n_layers)]
    ins = hooks.reads_inputs
    points = [(n, ("norm", n), ins) for h in layers for n in h.norms] + [(hooks.final_norm, ("norm", hooks.final_norm), False)]
    points += [(h.attn_norm, ("x_attn", i), ins) for i, h in enumerate(layers)]
    return points + [(h.moe_input, ("moe_x", i), True) if model.shape.experts_in(i) else (h.ffn_hidden, ("ffn", i), True)
                     for i, h in enumerate(layers)]


def collect(model: Model, batches: list[dict], max_tokens: int = 20000) -> dict:
    """Activations `[features, tokens]` (float64) of one model on the batches, keyed by kind and layer."""
    points = _hook_points(model)
    hf = _hf_model(model)
    store: dict = {}
    mask_now: list = [None]

    def keep(key, t):  # t: [batch, seq, features] -> [features, tokens]
        t = t.detach().to(torch.float64)
        flat = t.reshape(-1, t.shape[-1]) if mask_now[0] is None else t[mask_now[0]]
        store.setdefault(key, []).append(flat.T)

    modules = dict(hf.named_modules())
    missing = sorted({n for n, _, _ in points} - set(modules))
    if missing:
        raise SymmergeError(f"activation matching: {hf.__class__.__name__} has no module {missing[0]}; "
                            "this transformers version names its modules differently, use --method weight")
    hooks = [hook_stream(modules[n], lambda t, k=key: keep(k, t), ins) for n, key, ins in points]
    try:
        with torch.no_grad():
            for batch in batches:
                inputs = model_inputs(batch, torch.float64)
                mask = inputs.get("attention_mask")
                mask_now[0] = mask.bool() if mask is not None else None
                out = hf(**inputs, output_attentions=True)
                for i, att in enumerate(out.attentions):  # [batch, heads, T, T] -> [heads, batch * T * T]
                    store.setdefault(("pattern", i), []).append(att.detach().to(torch.float64).transpose(0, 1).reshape(att.shape[1], -1))
                if keep_count(store) >= max_tokens:
                    break
    finally:
        for h in hooks:
            h.remove()
    if not store:
        raise SymmergeError("the data gave no batches; check --data")
    return {k: torch.cat(v, dim=1) for k, v in store.items()}


def keep_count(store) -> int:
    """Tokens collected so far (columns of any per-token activation)."""
    for k, v in store.items():
        if k[0] in ("ffn", "moe_x"):
            return sum(x.shape[1] for x in v)
    return 0


# --- solving ---------------------------------------------------------------------------------------------


def _term(t: torch.Tensor, action, residual: int | None, x: torch.Tensor, ones=None) -> torch.Tensor:
    """One tensor's part of a map's side, `[*batch, *others, n, N]` (others: the query-head axis of W_Q and
    W_O): contracted with x `[d, N]` along its residual axis, or, without one (a bias), broadcast over tokens
    (times `ones [N]` when given: the constant coordinate of augmented data, `activation_stream`)."""
    others = [k for k in range(t.dim()) if k not in (*action.batch_axes, action.axis, residual)]
    axes = [*action.batch_axes, *others, action.axis]
    if residual is None:
        return t.permute(axes)[..., None] if ones is None else t.permute(axes)[..., None] * ones
    letters = lambda ks: "".join(chr(97 + k) for k in ks)  # noqa: E731  (axis k is letter k; z: tokens)
    return torch.einsum(f"{letters(range(t.dim()))},{letters([residual])}z->{letters(axes)}z", t, x)


def map_sides(spec, params, x: torch.Tensor, group: str, rot: str, scale: float, ones=None) -> dict[str, torch.Tensor]:
    """The "g" and "inv_t" sides of a head-internal map on the attention input `x`, each `[kv, (q,) dh, N]`.

    A side is the affine map of x made of the tensors the group acts on with that `how` (the spec's
    actions): those the residual rotation `rot` acts on are contracted with x (`W_Q x`, `W_O^T x`), the
    others (biases) added. Every term moves by the group's element on that side, so their sum does.
    Terms the residual scale acts on (writers) are divided by `scale` (B's residual scale over A's)."""
    out: dict = {}
    for name, a in touching(spec, group).items():
        acts = spec.actions[name]
        h = _term(params[name], a, next((b.axis for b in acts if b.group == rot), None), x, ones)
        if spec.includes_residual_scale(b.group for b in acts):
            h = h / scale
        out[a.how] = out[a.how] + h if a.how in out else h
    return out


def in_a_order(t: torch.Tensor, p: torch.Tensor, inner: torch.Tensor | None) -> torch.Tensor:
    """B's per-head tensor `[kv, (q,) ...]` re-ordered as A's heads: KV group p[a], query head inner[p[a]][j]."""
    t = t[p]
    if inner is not None and t.dim() == 4:
        idx = inner[p].reshape(*inner.shape, 1, 1).expand(t.shape)
        t = torch.gather(t, 1, idx)
    return t


def _flat_q(t: torch.Tensor) -> torch.Tensor:
    """`[kv, q, dh, N] -> [kv, dh, q * N]` (query heads of a KV group side by side)."""
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1) if t.dim() == 4 else t


def _corr(ha: torch.Tensor, hb: torch.Tensor) -> torch.Tensor:
    za = (ha - ha.mean(1, keepdim=True)) / ha.std(1, keepdim=True).clamp_min(1e-12)
    zb = (hb - hb.mean(1, keepdim=True)) / hb.std(1, keepdim=True).clamp_min(1e-12)
    return za @ zb.T / max(ha.shape[1] - 1, 1)


def ffn_step(spec, chosen, g, fit, corr: torch.Tensor, rms_a: torch.Tensor, rms_b: torch.Tensor, i: int) -> None:
    """Layer i's FFN permutation and GLU scales from the hidden units' correlations `corr [n_A, n_B]` and RMS."""
    roles = spec.layer_roles(i)
    unit_step(chosen, g, fit, roles.ffn, roles.glu, corr, rms_a, rms_b, f"blocks.{i}.ffn")


def _ffn(spec, chosen, g, fit, acts_a, acts_b, i, params_a, params_b) -> None:
    if ("moe_x", i) in acts_a:
        expert_step(spec, chosen, g, fit, [acts_a[("moe_x", i)].T], [acts_b[("moe_x", i)].T], params_a, params_b, i)
        return
    ha, hb = acts_a[("ffn", i)], acts_b[("ffn", i)]
    rms = lambda h: h.pow(2).mean(1).sqrt().clamp_min(1e-300)  # noqa: E731
    ffn_step(spec, chosen, g, fit, _corr(ha, hb), rms(ha), rms(hb), i)


def writer_scale(spec, chosen, eps_a, eps_b) -> float:
    """B's residual scale relative to A's when it is being matched: `sqrt(eps_B / eps_A)` (writers move by
    the scale, the normalisation eps by its square, the normalised stream not at all), else 1."""
    if not spec.includes_residual_scale(chosen):
        return 1.0
    ok = eps_a is not None and eps_b is not None and float(eps_a) > 0 and float(eps_b) > 0
    return float(torch.sqrt(eps_b / eps_a)) if ok else 1.0


def head_perms(spec, chosen, g, sim: torch.Tensor, i: int) -> None:
    """Layer i's head (KV group) and query-head permutations from the overlap of attention patterns
    `sim [heads_A, heads_B]`."""
    roles = spec.layer_roles(i)
    top, inner = roles.heads, roles.query_heads
    s = spec.shape
    if top in chosen:
        g[top], inner_p = assign_heads(sim.reshape(s.n_kv_heads, s.q_per_kv, s.n_kv_heads, s.q_per_kv), inner is not None)
        if inner is not None:
            g[inner] = inner_p


def head_maps(spec, chosen, g, i: int, sides) -> None:
    """Layer i's QK and OV maps inside the matched heads; `sides(name, p, inner_p)` gives the solver's data
    `(Xa, Xb, Ya, Yb)` (each `[kv, dh, m]`, B's heads already in A's order)."""
    roles = spec.layer_roles(i)
    top, inner = roles.heads, roles.query_heads
    p, inner_p = g[top], (g[inner] if inner else None)
    for name in roles.head_maps:
        if name in chosen:
            g[name] = scatter(solve_map(spec.groups[name], *sides(name, p, inner_p)), p)


def side_data(h: dict, how: str, s) -> torch.Tensor:
    """One side of a map's data as the solver takes it, `[kv, dh, m]`; empty (m = 0) when no tensor is on it."""
    return _flat_q(h[how]) if how in h else torch.zeros(s.n_kv_heads, s.d_head, 0, dtype=G.DTYPE)


def _heads(model_a, model_b, spec, chosen, g, fit, acts_a, acts_b, i, rot) -> None:
    head_perms(spec, chosen, g, acts_a[("pattern", i)] @ acts_b[("pattern", i)].T, i)
    scale = writer_scale(spec, chosen, model_a.params.get("norm.eps"), model_b.params.get("norm.eps"))

    def sides(name, p, inner_p):
        ha = map_sides(spec, model_a.params, acts_a[("x_attn", i)], name, rot, 1.0)
        hb = map_sides(spec, model_b.params, acts_b[("x_attn", i)], name, rot, scale)
        hb = {k: in_a_order(v, p, inner_p) for k, v in hb.items()}
        return side_data(ha, "g", spec.shape), side_data(hb, "g", spec.shape), side_data(ha, "inv_t", spec.shape), \
            side_data(hb, "inv_t", spec.shape)

    head_maps(spec, chosen, g, i, sides)


def activation_match(a: Model, b: Model, batches: list[dict], families: list[str] | None = None,
                     max_tokens: int = 20000) -> MatchResult:
    """The element g making g·B's activations closest to A's (see the module docstring)."""
    start = time.perf_counter()
    spec = b.spec.restricted(families)
    chosen = set(spec.select(families))
    acts_a, acts_b = collect(a, batches, max_tokens), collect(b, batches, max_tokens)
    g = {n: G.identity(grp) for n, grp in spec.groups.items()}
    fit: dict = {}
    rot = ROTATION
    if rot in chosen:
        keys = [k for k in acts_a if k[0] == "norm"]
        c = sum(acts_a[k] @ acts_b[k].T for k in keys)
        g[rot] = best_rotation(spec.groups[rot], c)
        num = sum(float(((acts_a[k] - g[rot] @ acts_b[k]) ** 2).sum()) for k in keys)
        fit["residual_r2"] = 1 - num / sum(float((acts_a[k] ** 2).sum()) for k in keys)
    for i in range(spec.shape.n_layers):
        _heads(a, b, spec, chosen, g, fit, acts_a, acts_b, i, rot)
        _ffn(spec, chosen, g, fit, acts_a, acts_b, i, a.params, b.params)
    st = State(spec, a.params, b.params, {n: G.identity(x) for n, x in spec.groups.items()})
    history = [st.similarity()]
    st.g = g
    for name in spec.residual_scales(chosen):  # invisible to the data
        st.g = solve_scaling(st, name, None)
    st = State(spec, a.params, b.params, st.g)
    history.append(st.similarity())
    fit["tokens"] = int(acts_a[next(k for k in acts_a if k[0] in ("ffn", "moe_x"))].shape[1])
    return MatchResult(st.g, history, time.perf_counter() - start, 0, len(chosen), {"fit": fit})
