"""Activation matching of a mixture of experts' layer: the expert permutation, then the FFN permutation and GLU
scale inside each matched pair of experts (the groups of `spec_experts.py`), from the experts' hidden units.

The stock forward runs each expert only on the tokens routed to it, so the hidden vector of one expert is not
defined on every token. Here every expert runs densely on every token the layer reads: expert e's hidden
units are `h_e = act(W_gate[e] x) * (W_in[e] x)` (the canonical readers, the norm's weight folded in) on the
normalised stream x the router and the experts read (captured at the mixture's input, `HookPoints.moe_input`).
Why this is the right data: under a planted element of the exact group, B's expert `p(a)` computes on
`R^T x` exactly A's expert a's units, permuted inside the expert and scaled by the GLU scale, on every token,
routed or not; so the correlations below are ±1 on the planted pairs.

- cost between A's expert a and B's expert b: the value of the best assignment of b's units to a's on their
  correlations over the tokens (on |correlation| when the GLU scales, which may flip signs, are matched too),
  which does not depend on the order of either expert's units;
- the expert permutation: the assignment on these values;
- inside each matched pair: the unit assignment found for the pair; the GLU scale as for a dense FFN
  (`unit_step`): the sign of the correlation times the ratio of the units' RMS;
- a shared expert (Qwen2-MoE) as a dense FFN (`unit_step`), its hidden units computed from the same input.

Memory: the correlations are accumulated (`activation_stats.FfnMoments`, batch by batch) for one block of
`chunk` experts of A against one block of `chunk` of B at a time, the hidden units recomputed per block, and
each pair's assignment taken before the next block; held at once: `(chunk d_mlp)^2` co-moments, one batch's
hidden units of `2 chunk` experts, and per pair of experts its value, unit assignment and matched
correlations (`E^2 d_mlp` numbers). The element does not depend on `chunk` (each pair's statistics are those
of the pair alone), up to the rounding of sums taken in another order.
"""

from __future__ import annotations

import torch
from transformers.activations import ACT2FN

from ..algebra import groups as G
from ..algebra.elements import unindex
from .activation_stats import FfnMoments
from .solvers import linear_assignment
from .weight_state import scatter

#: bound on the co-moments held at once (entries of `[chunk d_mlp, chunk d_mlp]`): `chunk` is the largest
#: number of experts whose block fits it (at least 1)
MOMENT_ENTRIES = 1 << 26


def expert_chunk(n_experts: int, d_mlp: int) -> int:
    """Experts per block so that a block pair's co-moments hold at most `MOMENT_ENTRIES` numbers (at least 1)."""
    return max(1, min(n_experts, int((MOMENT_ENTRIES ** 0.5) // d_mlp)))


def unit_step(chosen, g, fit, perm: str | None, scale: str | None, corr: torch.Tensor, rms_a: torch.Tensor,
              rms_b: torch.Tensor, label: str) -> None:
    """A dense FFN's unit permutation `perm` and GLU scale `scale` (where chosen) into `g`, from the hidden units'
    correlations `corr [n_A, n_B]` and RMS: the assignment on the correlations (their magnitudes when the scale,
    which may flip signs, is matched too), then each unit's sign times the ratio of the units' RMS; the mean
    matched |correlation| goes to `fit` as `{label}_mean_matched_correlation`."""
    use_scale = scale is not None and scale in chosen
    if perm in chosen:
        g[perm] = linear_assignment(corr.abs() if use_scale else corr)
        fit[f"{label}_mean_matched_correlation"] = float(corr[torch.arange(len(g[perm])), g[perm]].abs().mean())
    if use_scale:
        p = g[perm]
        d = torch.sign(corr[torch.arange(len(p)), p]) * rms_a / rms_b[p]
        g[scale] = scatter(torch.where(d == 0, torch.ones_like(d), d), p)


def shared_hidden(params: dict, i: int, x: torch.Tensor, act) -> torch.Tensor:
    """Hidden units of layer i's shared expert on every token of `x [tokens, d]`: `[tokens, d_shared]`."""
    w = lambda n: params[f"blocks.{i}.moe.W_shared_{n}"].to(device=x.device, dtype=x.dtype)  # noqa: E731
    return act(x @ w("gate").T) * (x @ w("in").T)


def expert_hidden(params: dict, i: int, x: torch.Tensor, experts: range, act) -> torch.Tensor:
    """Hidden units of layer i's `experts` on every token of `x [tokens, d]`: `[tokens, len(experts) d_mlp]`
    (expert by expert, each expert's units in its own order), in x's dtype and on its device."""
    p = f"blocks.{i}.moe"
    sl = slice(experts.start, experts.stop)
    w = lambda n: params[f"{p}.{n}"][sl].to(device=x.device, dtype=x.dtype)  # noqa: E731  [c, d_mlp, d]
    h = act(torch.einsum("td,cmd->tcm", x, w("W_gate"))) * torch.einsum("td,cmd->tcm", x, w("W_in"))
    return h.reshape(x.shape[0], -1)


def expert_step(spec, chosen, g, fit, xs_a: list, xs_b: list, params_a: dict, params_b: dict, i: int,
                chunk: int | None = None) -> None:
    """Layer i's expert permutation, FFN permutations and GLU scales into `g` (see the module docstring).

    `xs_a`, `xs_b`: the mixture's input on the same tokens, block by block (`[tokens, d]` each, in the
    precision the statistics are summed in); `params_a`, `params_b`: the layer's canonical tensors."""
    roles, s = spec.layer_roles(i), spec.shape
    e, m = s.n_experts, s.d_mlp
    use_glu = roles.glu is not None and roles.glu in chosen
    free_units = roles.ffn in chosen
    act = ACT2FN[s.activation]
    chunk = chunk or expert_chunk(e, m)
    value = torch.zeros(e, e, dtype=G.DTYPE)
    inner = torch.zeros(e, e, m, dtype=torch.long)
    matched = torch.zeros(e, e, m, dtype=G.DTYPE)  # the correlation of each unit of a with its match in b
    rms_a, rms_b = torch.zeros(e, m, dtype=G.DTYPE), torch.zeros(e, m, dtype=G.DTYPE)
    blocks = [range(k, min(k + chunk, e)) for k in range(0, e, chunk)]
    for ea in blocks:
        for eb in blocks:
            mom = FfnMoments()
            for xa, xb in zip(xs_a, xs_b):
                mom.add(expert_hidden(params_a, i, xa, ea, act), expert_hidden(params_b, i, xb, eb, act))
            corr, ra, rb = (t.cpu().to(G.DTYPE) for t in mom.correlation())
            corr = corr.reshape(len(ea), m, len(eb), m)
            rms_a[ea.start:ea.stop], rms_b[eb.start:eb.stop] = ra.reshape(-1, m), rb.reshape(-1, m)
            for x, a in enumerate(ea):
                for y, b in enumerate(eb):
                    c = corr[x, :, y, :]  # A's expert a's units against B's expert b's, [d_mlp, d_mlp]
                    sim = c.abs() if use_glu else c
                    inner[a, b] = linear_assignment(sim)
                    value[a, b] = sim[torch.arange(m), inner[a, b]].sum()
                    units = inner[a, b] if free_units else torch.arange(m)
                    matched[a, b] = c[torch.arange(m), units]
    p = linear_assignment(value) if roles.experts in chosen else torch.arange(e)
    if roles.experts in chosen:
        g[roles.experts] = p
    units = inner[torch.arange(e), p] if free_units else torch.arange(m).expand(e, m)  # [E, d_mlp], A's order
    if free_units:
        g[roles.ffn] = scatter(units, p)
    corr = matched[torch.arange(e), p]  # [E, d_mlp], A's experts and units
    fit[f"blocks.{i}.ffn_mean_matched_correlation"] = float(corr.abs().mean())
    if use_glu:
        d = torch.sign(corr) * rms_a / torch.gather(rms_b[p], 1, units)
        g[roles.glu] = unindex(spec, roles.glu, torch.where(d == 0, torch.ones_like(d), d), g)
    if roles.shared is not None and (roles.shared in chosen or roles.shared_glu in chosen):
        mom = FfnMoments()
        for xa, xb in zip(xs_a, xs_b):
            mom.add(shared_hidden(params_a, i, xa, act), shared_hidden(params_b, i, xb, act))
        corr, ra, rb = (t.cpu().to(G.DTYPE) for t in mom.correlation())
        unit_step(chosen, g, fit, roles.shared, roles.shared_glu, corr, ra, rb, f"blocks.{i}.shared")
