"""Activation matching: the same groups as weight matching, found from both models' activations on data.

Activations come from forward hooks on the stock HF model of each checkpoint's canonical export
(`model.build_hf_model`), so readers see the normalised stream. For each group:

- residual rotation: Procrustes between the normalised streams (every norm's output, all layers):
  the normalised stream of g·B is `O` times B's (normalisation removes the residual scale);
- FFN permutation: assignment on the correlation of hidden units (the down projection's input),
  on |correlation| when GLU scales (which may flip signs) are matched too; GLU scale: sign of the
  correlation times the ratio of the units' RMS (exact for a planted scale, never near 0);
- head permutation: assignment on the overlap of attention patterns, which the QK and OV maps
  leave unchanged (query heads inside KV groups as in weight matching);
- QK map: balanced least squares (`solvers.solve_map`) between the matched heads' queries (the
  "g" side) and keys ("inv_t"), taken before RoPE (the maps commute with it) from the captured
  attention input and the canonical weights; OV map: the same balanced least squares between the
  values `W_V x` ("g" side: `N W_V`) and `W_O^T x` ("inv_t" side: `W_O N^{-1}` gives `N^{-T} W_O^T x`),
  x the normalised stream the attention reads (exact for a planted element: B's stream is `R^T` A's;
  B's writers carry the residual scale, divided out as `sqrt(eps_B / eps_A)` when it is matched).
  Fitting the values (or head outputs) alone is one-sided: least squares shrinks N for weakly related
  models and W_O's `N^{-1}` then blows up (two digit ViTs, seeds 0/1: barrier 3.58 with every family
  but the residual scale, 0.35 with both sides; the weight-matching maps given the same rotation and
  heads gave 0.39);
- groups the data cannot see (the residual scale: normalisation hides it) are set by the weight-matching
  step given the rest.

Activations are kept in memory (at most `max_tokens` tokens): meant for samples of a few thousand tokens.
"""

from __future__ import annotations

import re
import time

import torch

from .. import SymmergeError
from .. import groups as G
from ..model import Model, build_hf_model, export_state_dict
from .solvers import best_rotation, linear_assignment, solve_map
from .weight import MatchResult
from .weight_state import State, scatter
from .weight_steps import assign_heads, solve_scaling

#: per adapter: modules whose outputs are normalised streams, whose input is the FFN hidden vector,
#: and whose input is the concatenated head outputs ({i} is the layer)
MODULES = {
    "gpt2": (r"transformer\.(h\.\d+\.ln_[12]|ln_f)", "transformer.h.{i}.mlp.c_proj", "transformer.h.{i}.attn.c_proj"),
    "gpt_neox": (r"gpt_neox\.(layers\.\d+\.(input_layernorm|post_attention_layernorm)|final_layer_norm)",
                 "gpt_neox.layers.{i}.mlp.dense_4h_to_h", "gpt_neox.layers.{i}.attention.dense"),
    "llama": (r"model\.(layers\.\d+\.(input_layernorm|post_attention_layernorm)|norm)",
              "model.layers.{i}.mlp.down_proj", "model.layers.{i}.self_attn.o_proj"),
    "olmo": (r"model\.(layers\.\d+\.(input_layernorm|post_attention_layernorm)|norm)",
             "model.layers.{i}.mlp.down_proj", "model.layers.{i}.self_attn.o_proj"),
    "vit": (r"vit\.(layers\.\d+\.layernorm_(before|after)|layernorm)", "vit.layers.{i}.mlp.fc2",
            "vit.layers.{i}.attention.o_proj"),
}
#: the norm whose output the attention reads, per adapter (for queries, keys and values)
ATTN_NORM = {"gpt2": "transformer.h.{i}.ln_1", "gpt_neox": "gpt_neox.layers.{i}.input_layernorm",
             "llama": "model.layers.{i}.input_layernorm", "olmo": "model.layers.{i}.input_layernorm",
             "vit": "vit.layers.{i}.layernorm_before"}


def _hf_model(model: Model):
    config, sd = export_state_dict(model, dtype=torch.float64)
    config._attn_implementation = "eager"  # attention patterns are only returned by the eager path
    return build_hf_model(config, sd, model.shape.hf_class)


def collect(model: Model, batches: list[dict], max_tokens: int = 20000) -> dict:
    """Activations `[features, tokens]` (float64) of one model on the batches, keyed by kind and layer."""
    arch = model.adapter.name
    if arch not in MODULES:
        raise SymmergeError(f"activation matching has no module table for {arch}; use --method weight")
    norms, ffn_in, attn_in = MODULES[arch]
    hf = _hf_model(model)
    s = model.shape
    wanted_in = {ffn_in.format(i=i): ("ffn", i) for i in range(s.n_layers)}
    wanted_in.update({attn_in.format(i=i): ("z", i) for i in range(s.n_layers)})
    wanted_out = {ATTN_NORM[arch].format(i=i): ("x_attn", i) for i in range(s.n_layers)}
    store: dict = {}
    mask_now: list = [None]

    def keep(key, t):  # t: [batch, seq, features] -> [features, tokens]
        t = t.detach().to(torch.float64)
        flat = t.reshape(-1, t.shape[-1]) if mask_now[0] is None else t[mask_now[0]]
        store.setdefault(key, []).append(flat.T)

    hooks = []
    for name, mod in hf.named_modules():
        if re.fullmatch(norms, name):
            hooks.append(mod.register_forward_hook(lambda m, i, o, n=name: keep(("norm", n), o)))
        if name in wanted_out:
            hooks.append(mod.register_forward_hook(lambda m, i, o, k=wanted_out[name]: keep(k, o)))
        if name in wanted_in:
            hooks.append(mod.register_forward_pre_hook(lambda m, i, k=wanted_in[name]: keep(k, i[0])))
    found = {n for n, _ in hf.named_modules()}
    missing = sorted((set(wanted_in) | set(wanted_out)) - found)
    if missing or not any(re.fullmatch(norms, n) for n in found):
        raise SymmergeError(f"activation matching: {hf.__class__.__name__} has no module {missing[:1] or norms}; "
                            "this transformers version names its modules differently, use --method weight")
    try:
        with torch.no_grad():
            for batch in batches:
                inputs = {k: (v.to(torch.float64) if v.is_floating_point() else v) for k, v in batch.items() if k != "labels"}
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
        if k[0] == "ffn":
            return sum(x.shape[1] for x in v)
    return 0


# --- solving ---------------------------------------------------------------------------------------------


def _head_acts(model: Model, acts: dict, i: int) -> dict[str, torch.Tensor]:
    """Pre-RoPE queries `[kv, q, dh, N]`, keys and values `[kv, dh, N]`, head outputs `[kv, q, dh, N]`."""
    p, s = model.params, model.shape
    x = acts[("x_attn", i)]  # [d, N]
    a = lambda n: p[f"blocks.{i}.attn.{n}"]  # noqa: E731
    q = torch.einsum("kjed,dn->kjen", a("W_Q"), x) + a("b_Q")[..., None]
    k = torch.einsum("ked,dn->ken", a("W_K"), x) + a("b_K")[..., None]
    v = torch.einsum("ked,dn->ken", a("W_V"), x) + a("b_V")[..., None]
    z = acts[("z", i)].reshape(s.n_kv_heads, s.q_per_kv, s.d_head, -1)  # HF head order: h = kv * q_per_kv + j
    o = torch.einsum("kjde,dn->kjen", a("W_O"), x)  # W_O^T on the normalised stream: moves by N^{-T}
    return {"q": q, "k": k, "v": v, "z": z, "o": o}


def _in_a_order(t: torch.Tensor, p: torch.Tensor, inner: torch.Tensor | None) -> torch.Tensor:
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


def _layer(spec, i, kind):
    return next((n for n, g in spec.groups.items() if g.layer == i and g.family == kind and not (
        kind == "head_perm" and g.batch)), None)


def _ffn(spec, chosen, g, fit, acts_a, acts_b, i) -> None:
    ffn, glu = _layer(spec, i, "ffn_perm"), _layer(spec, i, "glu_scale")
    ha, hb = acts_a[("ffn", i)], acts_b[("ffn", i)]
    corr = _corr(ha, hb)
    use_glu = glu is not None and glu in chosen
    if ffn in chosen:
        g[ffn] = linear_assignment(corr.abs() if use_glu else corr)
        fit[f"blocks.{i}.ffn_mean_matched_correlation"] = float(corr[torch.arange(len(g[ffn])), g[ffn]].abs().mean())
    if use_glu:
        p = g[ffn]
        rms = lambda h: h.pow(2).mean(1).sqrt().clamp_min(1e-300)  # noqa: E731
        d = torch.sign(corr[torch.arange(len(p)), p]) * rms(ha) / rms(hb[p])
        g[glu] = scatter(torch.where(d == 0, torch.ones_like(d), d), p)


def _writer_scale(a: Model, b: Model, chosen) -> float:
    """B's residual scale relative to A's when it is being matched: `sqrt(eps_B / eps_A)` (writers move by
    the scale, the normalisation eps by its square, the normalised stream not at all), else 1."""
    if not any(n in chosen and g.family == "residual_scale" for n, g in b.spec.groups.items()):
        return 1.0
    ea, eb = a.params.get("norm.eps"), b.params.get("norm.eps")
    ok = ea is not None and eb is not None and float(ea) > 0 and float(eb) > 0
    return float(torch.sqrt(eb / ea)) if ok else 1.0


def _heads(model_a, model_b, spec, chosen, g, fit, acts_a, acts_b, i) -> None:
    top = _layer(spec, i, "head_perm")
    inner = next((n for n, x in spec.groups.items() if x.indexed_by == top and x.kind == "permutation"), None)
    s = model_a.shape
    if top in chosen:
        sim = (acts_a[("pattern", i)] @ acts_b[("pattern", i)].T).reshape(s.n_kv_heads, s.q_per_kv, s.n_kv_heads, s.q_per_kv)
        g[top], inner_p = assign_heads(sim, inner is not None)
        if inner is not None:
            g[inner] = inner_p
    p, inner_p = g[top], (g[inner] if inner else None)
    ha, hb = _head_acts(model_a, acts_a, i), _head_acts(model_b, acts_b, i)
    hb["o"] = hb["o"] / _writer_scale(model_a, model_b, chosen)
    hb = {k: _in_a_order(v, p, inner_p) for k, v in hb.items()}
    for fam, g_side, inv_side in (("qk_map", ("q",), ("k",)), ("ov_map", ("v",), ("o",))):
        name = _layer(spec, i, fam)
        if name is None or name not in chosen:
            continue
        side = lambda h, keys: torch.cat([_flat_q(h[k]) for k in keys], -1) if keys else \
            torch.zeros(s.n_kv_heads, s.d_head, 0, dtype=G.DTYPE)  # noqa: E731
        found = solve_map(spec.groups[name], side(ha, g_side), side(hb, g_side), side(ha, inv_side), side(hb, inv_side))
        g[name] = scatter(found, p)


def activation_match(a: Model, b: Model, batches: list[dict], families: list[str] | None = None,
                     max_tokens: int = 20000) -> MatchResult:
    """The element g making g·B's activations closest to A's (see the module docstring)."""
    start = time.perf_counter()
    spec = b.spec.restricted(families)
    chosen = set(spec.select(families))
    acts_a, acts_b = collect(a, batches, max_tokens), collect(b, batches, max_tokens)
    g = {n: G.identity(grp) for n, grp in spec.groups.items()}
    fit: dict = {}
    rot = "residual.rotation" if "residual.rotation" in spec.groups else None
    if rot in chosen:
        keys = [k for k in acts_a if k[0] == "norm"]
        c = sum(acts_a[k] @ acts_b[k].T for k in keys)
        g[rot] = best_rotation(spec.groups[rot], c)
        num = sum(float(((acts_a[k] - g[rot] @ acts_b[k]) ** 2).sum()) for k in keys)
        fit["residual_r2"] = 1 - num / sum(float((acts_a[k] ** 2).sum()) for k in keys)
    for i in range(spec.shape.n_layers):
        _heads(a, b, spec, chosen, g, fit, acts_a, acts_b, i)
        _ffn(spec, chosen, g, fit, acts_a, acts_b, i)
    st = State(spec, a.params, b.params, {n: G.identity(x) for n, x in spec.groups.items()})
    history = [st.similarity()]
    st.g = g
    for name in [n for n in chosen if spec.groups[n].family == "residual_scale"]:  # invisible to the data
        st.g = solve_scaling(st, name, None)
    st = State(spec, a.params, b.params, st.g)
    history.append(st.similarity())
    fit["tokens"] = int(acts_a[next(k for k in acts_a if k[0] == "ffn")].shape[1])
    return MatchResult(st.g, history, time.perf_counter() - start, 0, len(chosen), {"fit": fit})
