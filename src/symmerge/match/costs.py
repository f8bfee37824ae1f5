"""Cost matrices for one group, built from the spec's actions (git-re-basin style: the other groups applied).

Every function takes canonical parameter dicts `A` (target) and `B` (B with every *other* group of
the current element already applied) and reads which tensors, axes and sides a group touches from
`spec.actions`; nothing here knows an architecture.
"""

from __future__ import annotations

import torch

from ..algebra.rotary import Pairing
from ..algebra.spec import Action, Spec
from .weight_products import EXACT, cross, operand


def touching(spec: Spec, group: str) -> dict[str, Action]:
    """Canonical tensors the group acts on, with the action ("sq" actions are config values, left out)."""
    out = {}
    for name, acts in spec.actions.items():
        for a in acts:
            if a.group == group and a.how != "sq":
                out[name] = a
    return out


def along(t: torch.Tensor, action: Action, keep: tuple[int, ...] = ()) -> torch.Tensor:
    """`t` as `[*batch, *keep, n, m]`: batch axes, then `keep` axes, then the group's axis, the rest flattened."""
    lead = (*action.batch_axes, *keep, action.axis)
    x = torch.movedim(t, lead, tuple(range(len(lead))))
    return x.reshape(*x.shape[: len(lead)], -1)


def gram_cross(spec: Spec, group: str, A: dict, B: dict, names=None, products=EXACT) -> torch.Tensor:
    """`sum_t A_t B_t^T` along the group's axis (`[*batch, n, n]`); `names` restricts the tensors.

    One product over every tensor at once (the tensors side by side along m), in the precision
    `products` names (`weight_products.cross`); with bf16 products each tensor is rounded before the
    tensors are put side by side (the same operands, in half the memory)."""
    xa, xb = [], []
    for name, a in touching(spec, group).items():
        if (names is not None and name not in names) or name not in A:
            continue
        xa.append(operand(along(A[name], a), products))
        xb.append(operand(along(B[name], a), products))
    if not xa:
        return None
    return cross(torch.cat(xa, -1), torch.cat(xb, -1), products)


def sides(spec: Spec, group: str, P: dict, names=None, keep_group: str | None = None):
    """The "g" and "inv_t" sides of a group, each `[*batch, n, m]` (tensors concatenated along m).

    With `keep_group` (the query-head permutation inside a KV group), tensors it acts on keep that
    axis: the sides are then `[*batch, q, n, m]`, with q = 1 for tensors shared by the query heads.
    """
    out = {"g": [], "inv_t": []}
    for name, a in touching(spec, group).items():
        if (names is not None and name not in names) or name not in P:
            continue
        keep = tuple(b.axis for b in spec.actions[name] if b.group == keep_group)
        x = along(P[name], a, keep)
        if keep_group is not None and not keep:
            x = x.unsqueeze(len(a.batch_axes))
        out[a.how].append(x)
    q = max((x.shape[len(a.batch_axes)] for x in out["g"] + out["inv_t"]), default=1) if keep_group else 0
    res = {}
    for how, xs in out.items():
        if keep_group is not None:
            xs = [x.expand(*x.shape[:-3], q, *x.shape[-2:]) for x in xs]
        res[how] = torch.cat(xs, dim=-1) if xs else None
    return res


def circuit_similarity(xa, xb, ya, yb, products=EXACT, pairing: Pairing | None = None) -> torch.Tensor:
    """`S[a, j, b, k] = <Xa_aj^T Ya_aj, Xb_bk^T Yb_bk>_F` for sides `[heads, q, n, m]`.

    The circuits `X^T Y` (e.g. W_Q^T W_K, or V^T O^T) are unchanged by the head-internal map
    (`(G X)^T (G^{-T} Y) = X^T Y`). They are never formed: `<X^T Y, X'^T Y'> = tr((X X'^T)(Y' Y^T))`,
    a sum over the entrywise product of two n x n cross-Gram matrices, each pair of heads' taken from
    one product of every row of A's side with every row of B's (`weight_products.cross`, in the
    precision `products` names).

    With `pairing` (a QK map that must commute with RoPE, `algebra.rotary`) the head computes
    `sum_k cos(r w_k) C_k + sin(r w_k) D_k` at offset r, with each rotary pair's circuits
    `C_k = X_k^T Y_k` and `D_k = X_k^T J Y_k`, and the pass-through dimensions' circuit as above. Only
    those circuits are invariant under the constrained map, and only same-frequency terms can be made
    to agree, so S sums `<C_k, C'_k> + <D_k, D'_k>` over pairs (what the offsets' average weighs them
    by) plus the pass-through circuits' product. Without it, frequencies would be compared across
    pairs (the unconstrained circuit `sum_k C_k`), which no RoPE-commuting map can align.
    """
    h, q, n, _ = xa.shape
    grams = []
    for sa, sb in ((xa, xb), (ya, yb)):  # rows (a, j, i) of A by rows (b, k, n) of B
        c = cross(sa.reshape(h * q * n, -1), sb.reshape(h * q * n, -1), products)
        grams.append(c.reshape(h, q, n, h, q, n))
    g1, g2 = grams
    if pairing is None:
        return (g1 * g2).sum((2, 5))  # [heads, q, heads, q]
    r, f, s = pairing.dims, pairing.first, pairing.second
    free = (g1[:, :, r:, :, :, r:] * g2[:, :, r:, :, :, r:]).sum((2, 5))

    def block(g, i, j):  # pair k of A's head against pair k of B's: [pairs, heads, q, heads, q]
        return g[:, :, i, :, :, j]

    # <C, C'> + <D, D'> on one pair is (g_ff + g_ss)(h_ff + h_ss) + (g_fs - g_sf)(h_fs - h_sf)
    trace = (block(g1, f, f) + block(g1, s, s)) * (block(g2, f, f) + block(g2, s, s))
    twist = (block(g1, f, s) - block(g1, s, f)) * (block(g2, f, s) - block(g2, s, f))
    return free + (trace + twist).sum(0)
