"""Exact solvers for one group given all the others, one per group kind. Pure functions over float64 tensors.

Notation: `Xa`, `Xb` are the tensors on the side the element acts on as `G` ("g"), flattened to
`[*batch, n, m]` (the group's axis second to last); `Ya`, `Yb` the side it acts on as `G^{-T}`
("inv_t"). A is the target, B the model being moved.

- permutations: `linear_assignment` maximises `sum_i S[i, p[i]]` (scipy's Jonker-Volgenant
  `linear_sum_assignment`; see benchmarks/assignment.py for the pure-torch auction it beat);
- orthogonal maps: `procrustes` maximises `tr(O^T C)` (polar factor of C), optionally fixing the
  all-ones vector (LayerNorm models): `O = 11^T/n + U R U^T`, Procrustes for `R` in the complement;
- scalars and diagonals: the exact minimiser of `||d Xb - Xa||^2 + ||Yb / d - Ya||^2` per entry
  (`best_scale`: a real root of a quartic);
- invertible maps (QK, OV): the exact objective `||G Xb - Xa||^2 + ||G^{-T} Yb - Ya||^2` is not
  convex in G and has no closed form. Step 1, the *balanced least squares*

      min_G  ||G Xb - Xa||^2 + ||G^T Ya - Yb||^2

  measures the reader-side error in B's frame (`Yb ≈ G^T Ya` is `Ya ≈ G^{-T} Yb` multiplied through
  by G^T): linear in G, uses both sides (fitting the Q side alone would ignore K, and be singular
  when Q is rank-deficient), and exact whenever an exact G exists. Its normal equations are the
  Sylvester equation `G (Xb Xb^T) + (Ya Ya^T) G = Xa Xb^T + Ya Yb^T`, solved in the eigenbases of
  the two PSD Gram matrices: unique as soon as one of them is positive definite. Step 2 keeps G's
  singular vectors and sets each singular value to its exact minimiser of the true objective
  (separable in them): this restores the balance between the two sides, since the balanced form
  alone lets G shrink towards 0 for weakly related models (G = 0 costs it little), which the true
  objective punishes through G^{-T}. The result is never worse on the true objective than the balanced
  form's G (one of the choices step 2 minimises over). Where it fails: nothing makes it better than the
  element the descent holds already, so the descent still judges every step on the objective
  (`weight_state.State`) and keeps the old element when a step does not improve it.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ..algebra.groups import DTYPE, ones_complement_basis, orthogonal_fixing_ones
from . import near_ties
from .weight_products import on_device


def linear_assignment(score: torch.Tensor) -> torch.Tensor:
    """`p` (int64 `[n]`) maximising `sum_i score[i, p[i]]` over permutations."""
    return assignment_minimising(minimising_costs(score), torch.finfo(score.dtype).eps)


def minimising_costs(score: torch.Tensor) -> np.ndarray:
    """`-score` in float64 on the CPU: what scipy's `maximize=True` negates internally, made in one copy
    (scipy then takes it without another; at n = 11,008 each copy is 0.9 GiB). A caller that drops `score`
    before `assignment_minimising` holds only this copy during the solve."""
    cost = torch.empty(score.shape, dtype=torch.float64)
    cost.copy_(score.detach())
    return cost.neg_().cpu().numpy()  # a CPU tensor already: .cpu() returns it, no copy


def assignment_minimising(cost: np.ndarray, eps: float = float(np.finfo(np.float64).eps)) -> torch.Tensor:
    """`p` (int64 `[n]`) minimising `sum_i cost[i, p[i]]` (float64 `cost`, C-contiguous: solved without a copy).
    Inside `near_ties.recording()` the choice's margin is recorded, `eps` being the machine epsilon of the
    numbers the costs were computed in."""
    rows, cols = linear_sum_assignment(cost)
    p = np.empty(len(rows), dtype=np.int64)
    p[rows] = cols
    if near_ties.active():
        near_ties.note("assignment", near_ties.swap_margin(cost, p), eps)
    return torch.from_numpy(p)


def best_rotation(group, c: torch.Tensor, device: torch.device | None = None, c_abs: torch.Tensor | None = None) -> torch.Tensor:
    """The member of an orthogonal `group` maximising `tr(O^T c) + tr(|O|^T c_abs)`: the solver its kind names
    (Procrustes, Procrustes fixing the all-ones vector, or, over (signed) permutation matrices, an assignment).
    `c_abs`: the cross-covariance of the tensors the group acts on by `|O|` (post-norm weights), which only
    signed permutation groups have. `device`: where a Procrustes solve runs (the result comes back to c's)."""
    solver = group.structure.solver
    if solver == "signed_assignment":
        return signed_assignment(c, c_abs)
    if c_abs is not None:
        assert solver == "assignment_matrix", "only (signed) permutation matrices act by |O|"
        c = c + c_abs  # |P| = P
    if solver == "assignment_matrix":  # the assignment runs on the CPU wherever c is
        return ROTATION_SOLVERS[solver](c)
    return on_device(ROTATION_SOLVERS[solver], device, c)


def procrustes(c: torch.Tensor, fixes_ones: bool = False) -> torch.Tensor:
    """Orthogonal `O` maximising `tr(O^T c)`; with `fixes_ones`, over the maps with `O 1 = 1` (on c's device)."""
    if fixes_ones:
        u = ones_complement_basis(c.shape[-1]).to(c.device)  # [n, n-1]
        return orthogonal_fixing_ones(procrustes(u.T @ c @ u))
    w, _, vh = torch.linalg.svd(c)
    return w @ vh


def _sylvester_psd(gx: torch.Tensor, gy: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """Solve `G gx + gy G = rhs` for PSD `gx`, `gy` (batched) in their eigenbases."""
    lx, ux = torch.linalg.eigh(gx)
    ly, uy = torch.linalg.eigh(gy)
    denom = ly.clamp_min(0).unsqueeze(-1) + lx.clamp_min(0).unsqueeze(-2)  # [.., i (gy), j (gx)]
    floor = torch.finfo(DTYPE).eps * denom.amax(dim=(-1, -2), keepdim=True).clamp_min(1e-300)
    rot = uy.transpose(-1, -2) @ rhs @ ux
    # an eigenpair with no data on either side (denominator below the floor) leaves its entry
    # undetermined: 0, not rounding noise divided by the floor (`balanced_lstsq` completes it)
    sol = torch.where(denom >= floor, rot / denom.clamp_min(floor), torch.zeros_like(rot))
    return uy @ sol @ ux.transpose(-1, -2)


def best_scale(p, q, s, t, positive: bool = False) -> torch.Tensor:
    """Exact minimiser over `d != 0` of `f(d) = p d^2 - 2 q d + s / d^2 - 2 t / d` (elementwise).

    This is `||d xb - xa||^2 + ||yb / d - ya||^2` up to constants, with p = |xb|^2, q = <xa, xb>,
    s = |yb|^2, t = <ya, yb>: the true objective of one scale acting by d on one side and 1/d on the
    other. With s > 0 and p > 0, f -> inf at 0 and at infinity, so the minimiser is a real root of
    `f'(d) d^3 / 2 = p d^4 - q d^3 + t d - s` (found as companion-matrix eigenvalues). One-sided
    cases are linear least squares. NaN where no minimiser exists (e.g. positive and q <= 0, s = 0).
    """
    p, q, s, t = (torch.as_tensor(v, dtype=DTYPE) for v in (p, q, s, t))
    p, q, s, t = torch.broadcast_tensors(p, q, s, t)
    out = torch.full(p.shape, float("nan"), dtype=DTYPE)
    tiny = torch.finfo(DTYPE).tiny
    only_g, only_inv, both = (s <= tiny) & (p > tiny), (p <= tiny) & (s > tiny), (p > tiny) & (s > tiny)
    out[only_g] = q[only_g] / p[only_g]
    out[only_inv] = s[only_inv] / t[only_inv]
    if both.any():
        pb, qb, sb, tb = p[both], q[both], s[both], t[both]
        comp = torch.zeros(pb.shape[0], 4, 4, dtype=DTYPE)  # companion of d^4 + c3 d^3 + c1 d + c0
        comp[:, 1, 0] = comp[:, 2, 1] = comp[:, 3, 2] = 1.0
        comp[:, 0, 3], comp[:, 1, 3], comp[:, 3, 3] = sb / pb, -tb / pb, qb / pb
        roots = torch.linalg.eigvals(comp)  # [k, 4]
        real = roots.real
        ok = (roots.imag.abs() <= 1e-7 * roots.abs().clamp_min(1e-300)) & (real != 0)
        if positive:
            ok &= real > 0
        d = torch.where(ok, real, torch.ones_like(real))
        f = pb[:, None] * d**2 - 2 * qb[:, None] * d + sb[:, None] / d**2 - 2 * tb[:, None] / d
        f = torch.where(ok, f, torch.full_like(f, float("inf")))
        best = f.argmin(-1)
        out[both] = torch.where(ok.any(-1), d.gather(-1, best[:, None])[:, 0], torch.full_like(pb, float("nan")))
    if positive:
        out = torch.where(out > 0, out, torch.full_like(out, float("nan")))
    return out


def exact_diagonal(xa, xb, ya, yb, positive: bool = False) -> torch.Tensor:
    """Diagonal `d [*batch, n]` minimising `||diag(d) xb - xa||^2 + ||diag(1/d) yb - ya||^2` exactly."""
    dot = lambda u, v: (u * v).sum(-1) if u is not None else torch.zeros(())  # noqa: E731
    return best_scale(dot(xb, xb), dot(xa, xb), dot(yb, yb), dot(ya, yb), positive)


def balanced_lstsq(xa, xb, ya, yb) -> torch.Tensor:
    """Invertible `G [*batch, n, n]`: balanced least squares, then exact singular values.

    1. `G0` minimises `||G xb - xa||^2 + ||G^T ya - yb||^2` (Sylvester; linear, exact when an exact G
       exists). 2. With `G0 = U diag(s) V^T`, `G^{-T} = U diag(1/s) V^T` for G = U diag(s) V^T, so the
       true objective `||G xb - xa||^2 + ||G^{-T} yb - ya||^2` is separable in the singular values
       and each is set to its exact minimiser (`best_scale`). Step 2 keeps G well-conditioned: the
       balanced form alone shrinks G towards 0 when A and B are weakly correlated (G = 0 costs it
       nothing), which the true objective punishes through G^{-T}.

    Where B has no data in some directions (an expanded model's zero-padded head dimensions), both steps
    are wrong in the full space and the map is solved on B's data directions instead (`_on_data`).
    """
    t = lambda m: m.transpose(-1, -2)  # noqa: E731
    g0 = _sylvester_psd(xb @ t(xb), ya @ t(ya), xa @ t(xb) + ya @ t(yb))
    u, sv, vh = torch.linalg.svd(g0)
    xa_, xb_, ya_, yb_ = t(u) @ xa, vh @ xb, t(u) @ ya, vh @ yb
    s_new = exact_diagonal(xa_, xb_, ya_, yb_)
    s_new = torch.where(torch.isfinite(s_new), s_new, sv)
    return _on_data(u @ torch.diag_embed(s_new) @ vh, xa, xb, ya, yb)


def _split_basis(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthonormal bases ([n, r], [n, n - r]) of the directions the columns of x [n, m] reach and of those
    no column reaches."""
    lam, vec = torch.linalg.eigh(x @ x.T)
    empty = lam <= torch.finfo(DTYPE).eps * lam.amax().clamp_min(torch.finfo(DTYPE).tiny) * x.shape[0]
    return vec[:, ~empty], vec[:, empty]


def _on_data(g: torch.Tensor, xa, xb, ya, yb) -> torch.Tensor:
    """G re-solved where B has no data on either side in directions V0 (unchanged where B has data in every
    direction).

    B's data span V1 [n, r]; G acts on B only through `W = G V1` (the "g" side, `G xb = W V1^T xb`) and
    `Z = G^{-T} V1` (the "inv_t" side), and any pair with `W^T Z = I_r` is some invertible G's:
    `G = W V1^T + C V0^T` with C a basis of Z's orthogonal complement (then `G^T Z = V1`). The full-space
    solve cannot see that: its inverse side is pinned by how G is completed on V0, so against a wide model
    with data everywhere (nothing to complete onto) it left Z in B's own r directions and the candidate
    was far worse than the identity (and often rejected, with the layer's head permutation). The pair is
    solved by `_reduced_map`."""
    out = g.clone()
    flat = lambda t: t.reshape(-1, *t.shape[-2:])  # noqa: E731
    for i, (ai, bi, ci, di) in enumerate(zip(flat(xa), flat(xb), flat(ya), flat(yb))):
        v1, v0 = _split_basis(torch.cat([bi, di], -1))
        if v0.shape[1] > 0:
            flat(out)[i] = _reduced_map(ai, v1.T @ bi, ci, v1.T @ di, v1, v0)
    return out


def _pair_objective(w, z, xa, xb1, ya, yb1) -> float:
    return float(((w @ xb1 - xa) ** 2).sum() + ((z @ yb1 - ya) ** 2).sum())


def _other_side(w: torch.Tensor, target: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
    """The exact minimiser of `||z data - target||^2` over z [n, r] with `w^T z = I_r` (w [n, r] of full
    column rank): `z = w (w^T w)^{-1} + P K`, P a basis of w's orthogonal complement, K least squares."""
    n, r = w.shape
    part = w @ torch.linalg.inv(w.T @ w)
    perp = torch.linalg.svd(w, full_matrices=True)[0][:, r:]  # [n, n - r]
    k = perp.T @ (target - part @ data) @ torch.linalg.pinv(data)
    return part + perp @ k


def _reduced_map(xa, xb1, ya, yb1, v1, v0, iters: int = 50, rtol: float = 1e-12) -> torch.Tensor:
    """The invertible G acting on B's data directions V1 only (`_on_data`): the pair (W, Z), W^T Z = I,
    minimising `||W xb1 - xa||^2 + ||Z yb1 - ya||^2` (xb1, yb1: B's data in V1's coordinates).

    Two starts, the better kept: the balanced least squares on V1 with exact singular values (Z = W^{-T} on
    W's range, as `balanced_lstsq`), and the balanced W with Z its exact best (exact for a planted
    element); then W and Z alternate, each the exact minimiser given the other (`_other_side`), so the
    objective only falls. V0 goes to Z's orthogonal complement (a zero head, r = 0: the identity)."""
    n, r = xa.shape[0], v1.shape[1]
    if r == 0:
        return torch.eye(n, dtype=xa.dtype)
    w0 = _sylvester_psd(xb1 @ xb1.T, ya @ ya.T, xa @ xb1.T + ya @ yb1.T)  # [n, r]
    u, s, vt = torch.linalg.svd(w0, full_matrices=False)
    s_new = exact_diagonal(u.T @ xa, vt @ xb1, u.T @ ya, vt @ yb1)
    s_new = torch.where(torch.isfinite(s_new) & (s_new != 0), s_new, torch.where(s > 0, s, torch.ones_like(s)))
    starts = [(u * s_new @ vt, u / s_new @ vt)]
    if float(s.min()) > torch.finfo(DTYPE).eps * float(s.max()) * n:
        starts.append((w0, _other_side(w0, ya, yb1)))
    f = lambda p: _pair_objective(*p, xa, xb1, ya, yb1)  # noqa: E731
    w, z = min(starts, key=f)
    best, scale = f((w, z)), float((xa ** 2).sum() + (ya ** 2).sum())
    for _ in range(iters):
        z2 = _other_side(w, ya, yb1)
        w2 = _other_side(z2, xa, xb1)
        now = f((w2, z2))
        if not now < best:
            break
        w, z, gained, best = w2, z2, best - now, now
        if gained <= rtol * scale:
            break
    c = torch.linalg.svd(z, full_matrices=True)[0][:, r:]  # [n, n - r]: Z's orthogonal complement
    return w @ v1.T + c @ v0.T


def _rope_pairs_lstsq(xa, xb, ya, yb, pairing):
    """Scaled rotations `a I + b J` on each pair: decoupled 2-parameter least squares."""
    pxa, _ = pairing.pair_rows(xa)
    pxb, jxb = pairing.pair_rows(xb)
    pya, jya = pairing.pair_rows(ya)
    pyb, jyb = pairing.pair_rows(yb)
    dot = lambda u, v: (u * v).sum((-1, -2))  # noqa: E731
    den = dot(pxb, pxb) + dot(pya, pya)  # <X, JX> = 0, so the normal equations are diagonal
    empty = den <= torch.finfo(DTYPE).tiny  # a pair with no data (zero-padded heads): the identity
    den = torch.where(empty, torch.ones_like(den), den)
    a = torch.where(empty, torch.ones_like(den), (dot(pxb, pxa) + dot(pya, pyb)) / den)
    b = torch.where(empty, torch.zeros_like(den), (dot(jxb, pxa) - dot(jya, pyb)) / den)  # (aI + bJ)^T = aI - bJ
    # keep the angle, re-solve the radius r of r R exactly ((r R)^{-T} = R / r): as in balanced_lstsq
    r = torch.sqrt(a * a + b * b).clamp_min(torch.finfo(DTYPE).tiny)
    c, sn = a / r, b / r
    rxb = c[..., None, None] * pxb + sn[..., None, None] * jxb  # R xb on each pair
    ryb = c[..., None, None] * pyb + sn[..., None, None] * jyb
    r_new = best_scale(dot(pxb, pxb), dot(pxa, rxb), dot(pyb, pyb), dot(pya, ryb))
    r_new = torch.where(torch.isfinite(r_new), r_new, r)
    return r_new * c, r_new * sn


def rope_lstsq(group, xa, xb, ya, yb) -> torch.Tensor:
    """The balanced least squares over maps that commute with RoPE (see `rotary.Pairing.blocks`).

    The maps are block diagonal (one 2x2 block per rotary pair, one full block on the other dims),
    so the objective splits into independent blocks.
    """
    r, n = group.rotary_dims, group.size
    a, b = _rope_pairs_lstsq(xa, xb, ya, yb, group.pairing)
    free = balanced_lstsq(xa[..., r:, :], xb[..., r:, :], ya[..., r:, :], yb[..., r:, :]) if n > r else \
        torch.zeros(*xa.shape[:-2], 0, 0, dtype=DTYPE)
    return group.pairing.blocks(n, a, b, free)


def signed_permutation(c: torch.Tensor) -> torch.Tensor:
    """Signed permutation matrices `S [*batch, n, n]` maximising `tr(S^T c)`."""
    flat = c.reshape(-1, *c.shape[-2:])
    out = torch.zeros_like(flat)
    for k, m in enumerate(flat):
        p = linear_assignment(m.abs())
        rows = torch.arange(m.shape[0])
        out[k, rows, p] = torch.where(m[rows, p] < 0, -1.0, 1.0).to(DTYPE)
    return out.reshape(c.shape)


def signed_rope(group, xa, xb, ya, yb) -> torch.Tensor:
    """clip_qkv with RoPE: a quarter turn on each rotary pair, a signed permutation on the other dims.

    These maps are orthogonal (`S^{-T} = S`), so the best one maximises `<Xa, S Xb> + <Ya, S Yb>`.
    """
    r, n = group.rotary_dims, group.size
    pxa, _ = group.pairing.pair_rows(xa)
    pxb, jxb = group.pairing.pair_rows(xb)
    pya, _ = group.pairing.pair_rows(ya)
    pyb, jyb = group.pairing.pair_rows(yb)
    dot = lambda u, v: (u * v).sum((-1, -2))  # noqa: E731
    ca, cb = dot(pxa, pxb) + dot(pya, pyb), dot(pxa, jxb) + dot(pya, jyb)  # value = a ca + b cb
    turns = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]], dtype=DTYPE)
    best = (turns[:, 0] * ca.unsqueeze(-1) + turns[:, 1] * cb.unsqueeze(-1)).argmax(-1)
    a, b = turns[best, 0], turns[best, 1]
    t = lambda m: m.transpose(-1, -2)  # noqa: E731
    c_free = xa[..., r:, :] @ t(xb[..., r:, :]) + ya[..., r:, :] @ t(yb[..., r:, :])
    free = signed_permutation(c_free) if n > r else torch.zeros(*xa.shape[:-2], 0, 0, dtype=DTYPE)
    return group.pairing.blocks(n, a, b, free)


def _signed_map(group, xa, xb, ya, yb) -> torch.Tensor:
    """clip_qkv without RoPE: the signed permutation maximising `<Xa, S Xb> + <Ya, S Yb>` (`S^{-T} = S`)."""
    t = lambda m: m.transpose(-1, -2)  # noqa: E731
    return signed_permutation(xa @ t(xb) + ya @ t(yb))


def signed_assignment(c: torch.Tensor, c_abs: torch.Tensor | None = None) -> torch.Tensor:
    """The signed permutation matrix `S` maximising `tr(S^T c) + tr(|S|^T c_abs)`: entry (i, j) with sign s gains
    `s c[i, j] + c_abs[i, j]`, best with `s = sign(c[i, j])`, so the assignment maximises `|c| + c_abs`."""
    score = c.abs() if c_abs is None else c.abs() + c_abs
    p = linear_assignment(score)
    rows = torch.arange(c.shape[0])
    out = torch.zeros_like(c)
    out[rows, p] = torch.where(c[rows, p] < 0, -1.0, 1.0).to(c.dtype)
    return out


def pair_signs(group, xa, xb, ya, yb) -> torch.Tensor:
    """QK-norm: the ±1 diagonal, equal on each rotary pair, maximising `<Xa, S Xb> + <Ya, S Yb>` (`S^{-T} = S`):
    the objective is a sum over dimensions (over pairs, for the rotary ones), each maximised by its sign."""
    c = (xa * xb).sum(-1) + (ya * yb).sum(-1)  # [*batch, n]: the gain of +1 on each dimension
    if group.pairing is not None:
        f, s = group.pairing.first, group.pairing.second
        pair = c[..., f] + c[..., s]
        c = c.clone()
        c[..., f], c[..., s] = pair, pair
    return torch.diag_embed(torch.where(c < 0, -1.0, 1.0).to(DTYPE))


#: the solver each kind names (`kinds.Kind.solver`), for orthogonal groups given `c` ...
ROTATION_SOLVERS = {
    "procrustes": procrustes,
    "procrustes_fixing_ones": lambda c: procrustes(c, True),
    "assignment_matrix": lambda c: torch.nn.functional.one_hot(linear_assignment(c), c.shape[-1]).to(c.dtype),
}
#: ... and for invertible groups given both sides
MAP_SOLVERS = {
    "balanced_lstsq": lambda group, xa, xb, ya, yb: balanced_lstsq(xa, xb, ya, yb),
    "rope_lstsq": rope_lstsq,
    "signed_permutation": _signed_map,
    "signed_rope": signed_rope,
    "pair_signs": pair_signs,
}


def solve_map(group, xa, xb, ya, yb) -> torch.Tensor:
    """The best element of an invertible group (batched) given both sides: the solver its kind names."""
    return MAP_SOLVERS[group.structure.solver](group, xa, xb, ya, yb)
