"""Data-free weight matching over the whole symmetry group, by block coordinate descent.

Objective (reported as `similarity = 1 - ||A - g·B||^2 / ||A||^2`, summed over every canonical
tensor but the normalisation eps): for the norm-preserving groups (permutations, the residual
rotation) minimising the distance is maximising `sum <A_t, (g·B)_t>`; for scales and invertible maps
the inner product is unbounded, and the least-squares form is the well-posed one (see `solvers`).

One sweep visits every block in turn (per layer: the attention groups together -- head permutation
with the query-head permutations inside KV groups, then the QK and OV maps -- then the FFN
permutation and the GLU scales), then the residual rotation and scale given all of them. Blocks are
read one at a time (`weight_match` takes checkpoints as well as dicts), so the residual step works
from sufficient statistics accumulated on the way (`residual.ResidualFit`). Each block step rebuilds
its cost from `spec.actions` with every other group of the current element applied, and solves it
by kind:

- head permutation: assignment on the similarity of the heads' QK and OV circuits (`costs.circuit_
  similarity`), which the head-internal maps leave unchanged, so heads are matched before their maps;
- QK / OV maps: balanced least squares inside each matched head, then each singular value set to
  its exact minimiser (`solvers.balanced_lstsq`), under the RoPE / clip_qkv constraints;
- other permutations: assignment on `sum_t A_t (B_t)^T` along the permuted axis;
- residual rotation: Procrustes over every reader and writer (fixing the all-ones vector for
  LayerNorm models), alternated with the residual scale's least squares; GLU scales: exact minimisers
  in closed form (roots of a quartic, `solvers.best_scale`: d on the up projection, 1/d on the down).

Why the circuits for the heads: starting from the identity, the per-head maps of a planted element
are unknown, and comparing raw W_Q's across heads would be meaningless; the circuits need only the
residual map, which the sweep finds first. The heads step is not an exact minimiser of the distance
(no closed form exists for the map with its inverse transpose); the acceptance rule below keeps
the objective monotone all the same.

Monotonicity: a block step's candidate is kept only if the exactly rounded sum (`math.fsum`) of the
squared distances of the tensors it touches decreases; the untouched terms are bitwise unchanged, so
the total never increases; the residual step is kept only if it lowers the total computed from the
statistics. The reported objective comes from those statistics (`||A||^2 + ||X||^2 - 2<A, X>`), so it
is exact to the rounding of that sum: about 1e-16 of `||A||^2` in float64 (1e-7 in float32), which
is the size of the wiggles once a sweep changes nothing. In the first sweep a group's cost uses only tensors whose other groups have
been solved already (e.g. the residual rotation is first found from the embeddings and the LM head),
so that the unsolved groups' identity guesses do not pollute it.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import torch

from .. import groups as G
from ..apply import apply
from ..spec import Spec
from . import costs
from .residual import ROTATION, SCALE, ResidualFit, sqdist, sqnorm
from .solvers import best_scale, linear_assignment, solve_map

HEAD_FAMILIES = ("head_perm", "qk_map", "ov_map")


@dataclass
class MatchResult:
    g: dict[str, torch.Tensor]
    history: list[float]  # similarity after sweep 0 (the starting element), 1, 2, ...
    seconds: float
    rejected: int = 0  # steps whose candidate would not have improved the objective
    steps: int = 0
    extra: dict = field(default_factory=dict)


def _schedule(spec: Spec, chosen: set[str]) -> list[list[str]]:
    """Steps of one sweep: lists of groups solved together (a layer's attention groups form one step)."""
    steps = [[n] for n, g in spec.groups.items() if g.layer is None and n in chosen]
    for i in range(spec.shape.n_layers):
        layer = [n for n, g in spec.groups.items() if g.layer == i and n in chosen]
        heads = [n for n in layer if spec.groups[n].family in HEAD_FAMILIES]
        if heads:
            steps.append(heads)
        steps += [[n] for n in layer if n not in heads]
    return steps


class _State:
    """The current element, and the squared distance of every tensor under it (kept up to date)."""

    def __init__(self, spec: Spec, A: dict, B: dict, g: dict):
        self.spec, self.A, self.B, self.g = spec, A, B, g
        self.names = [n for n, t in A.items() if t.dim() > 0]  # norm.eps moves with the scale: not a weight
        self.norm2 = math.fsum(sqnorm(A[n]) for n in self.names)
        self.terms = self._terms(self.names, g)

    def moved(self, names, g) -> dict:
        return apply(self.spec, g, {n: self.B[n] for n in names})

    def _terms(self, names, g) -> dict[str, float]:
        """Squared distance per tensor, one tensor at a time (peak memory: one moved tensor)."""
        out = {}
        for n in names:
            out[n] = sqdist(self.A[n], self.moved([n], g)[n])
        return out

    def similarity(self) -> float:
        return 1.0 - math.fsum(self.terms.values()) / self.norm2

    def offer(self, names: list[str], candidate: dict, judge=None) -> bool:
        """Keep `candidate` if it lowers the squared distance of `names` (exactly rounded sums).

        `names` must be every tensor the candidate changes; `judge` (default: all of them) are the
        ones whose distance decides (the first sweep judges on the tensors its cost could use).
        """
        new = self._terms(names, candidate)
        if not all(math.isfinite(v) for v in new.values()):
            return False
        judge = names if judge is None else [n for n in names if n in judge]
        if math.fsum(new[n] for n in judge) < math.fsum(self.terms[n] for n in judge):
            self.g = candidate
            self.terms.update(new)
            return True
        return False


def _without(g: dict, names) -> dict:
    out = dict(g)
    for n in names:
        out[n] = None
    return {k: v for k, v in out.items() if v is not None}


def _allowed(spec: Spec, group: str, solved: set[str], chosen: set[str]) -> set[str] | None:
    """First sweep: tensors whose other (chosen, non-scalar) groups are solved already; None = all."""
    ok = set()
    for name in costs.touching(spec, group):
        others = {a.group for a in spec.actions[name] if a.group != group}
        if all(o in solved or o not in chosen or spec.groups[o].kind == "scalar" for o in others):
            ok.add(name)
    return ok or None


def _scatter(x_a: torch.Tensor, perm: torch.Tensor | None) -> torch.Tensor:
    """A solution found in A's order, stored at B's indices (entry perm[i] gets x_a[i])."""
    if perm is None:
        return x_a
    out = torch.empty_like(x_a)
    out[perm] = x_a
    return out


# --- one step per group kind --------------------------------------------------------------------------


def _solve_scaling(st: _State, name: str, allowed) -> dict:
    """Scalar or diagonal: the exact minimiser entry by entry (`solvers.best_scale`), in A's order, then re-indexed."""
    grp = st.spec.groups[name]
    others = _without(st.g, [name])
    zero = torch.zeros((), dtype=G.DTYPE)
    p = q = s = t = zero
    for n in costs.touching(st.spec, name):  # accumulated one tensor at a time
        if n not in st.A or (allowed is not None and n not in allowed):
            continue
        sa, sb = costs.sides(st.spec, name, st.A, [n]), costs.sides(st.spec, name, st.moved([n], others), [n])
        for how in ("g", "inv_t"):
            if sa[how] is None:
                continue
            xa, xb = sa[how], sb[how]
            dims = tuple(range(xa.dim())) if grp.kind == "scalar" else -1
            if how == "g":
                p, q = p + (xb * xb).sum(dims), q + (xa * xb).sum(dims)
            else:
                s, t = s + (xb * xb).sum(dims), t + (xa * xb).sum(dims)
    perm = st.g[grp.indexed_by] if grp.indexed_by else None
    current = st.g[name] if perm is None else st.g[name][perm]  # in A's order
    d = best_scale(p, q, s, t, positive=grp.kind == "scalar" or "positive" in grp.constraints)
    d = torch.where(torch.isfinite(d), d, current)
    return {**st.g, name: _scatter(d, perm)}


def _solve_permutation(st: _State, name: str, allowed) -> dict:
    touched = [t for t in costs.touching(st.spec, name) if t in st.A]
    bp = st.moved(touched, _without(st.g, [name]))
    s = costs.gram_cross(st.spec, name, st.A, bp, allowed)
    flat = s.reshape(-1, *s.shape[-2:])
    p = torch.stack([linear_assignment(m) for m in flat]).reshape(s.shape[:-1])
    return {**st.g, name: p}


def _head_perms(st: _State, names: list[str], bp: dict, chosen: set[str]) -> dict:
    """Head (KV group) permutation and query-head permutations from circuit similarities."""
    spec = st.spec
    top = next(n for n in names if spec.groups[n].family == "head_perm" and not spec.groups[n].batch)
    inner = next((n for n in spec.groups if spec.groups[n].indexed_by == top and spec.groups[n].kind == "permutation"), None)
    maps = [n for n, g in spec.groups.items() if g.indexed_by == top and g.kind != "permutation"]
    sim = 0.0
    for m in maps:
        sa, sb = costs.sides(spec, m, st.A, keep_group=inner), costs.sides(spec, m, bp, keep_group=inner)
        q_axis = (lambda x: x) if inner is not None else (lambda x: x.unsqueeze(1))  # [h, q, n, m]
        sim = sim + costs.circuit_similarity(q_axis(sa["g"]), q_axis(sb["g"]), q_axis(sa["inv_t"]), q_axis(sb["inv_t"]))
    p, inner_p = assign_heads(sim, inner is not None)
    return {top: p} if inner is None else {top: p, inner: inner_p}


def assign_heads(sim: torch.Tensor, inner: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """KV-group permutation `p` and query-head permutations from `sim[a, j, b, k]` (A's head (a, j) vs B's (b, k)).

    Each pair of KV groups is scored by its best query-head assignment; the query-head permutations
    are returned indexed by B's KV group (as the spec's `qheads` group is).
    """
    n_h, q = sim.shape[0], sim.shape[1]
    value = torch.zeros(n_h, n_h, dtype=G.DTYPE)
    inner_p = torch.zeros(n_h, n_h, q, dtype=torch.long)
    for a in range(n_h):
        for b in range(n_h):
            s = sim[a, :, b, :]
            pi = linear_assignment(s) if inner else torch.arange(q)
            inner_p[a, b], value[a, b] = pi, s[torch.arange(q), pi].sum()
    p = linear_assignment(value)
    return p, _scatter(inner_p[torch.arange(n_h), p], p)


def _solve_heads(st: _State, names: list[str], allowed, chosen: set[str]) -> dict:
    """A layer's attention groups: permutations by circuits, then each map inside the matched heads."""
    spec = st.spec
    layer = spec.groups[names[0]].layer
    block = [n for n, g in spec.groups.items() if g.layer == layer and g.family in HEAD_FAMILIES]
    touched = sorted({t for n in block for t in costs.touching(spec, n)} & set(st.A))
    g0 = _without(st.g, block)
    perms = {n: st.g[n] for n in block if spec.groups[n].kind == "permutation"}
    if any(spec.groups[n].family == "head_perm" for n in names):
        perms = _head_perms(st, names, st.moved(touched, g0), chosen)
    cand = {**st.g, **perms}
    bq = st.moved(touched, {**g0, **perms})  # B's heads in A's order, maps not applied
    for m in names:
        grp = spec.groups[m]
        if grp.kind == "permutation":
            continue
        sa, sb = costs.sides(spec, m, st.A), costs.sides(spec, m, bq)
        found = solve_map(grp, *(x.to(G.DTYPE) for x in (sa["g"], sb["g"], sa["inv_t"], sb["inv_t"])))
        cand[m] = _scatter(found, perms[grp.indexed_by] if grp.indexed_by else None)
    return cand


# --- the loop ------------------------------------------------------------------------------------------


def _kind(spec: Spec, step: list[str]) -> str:
    grp = spec.groups[step[0]]
    if len(step) > 1 or grp.family in HEAD_FAMILIES:
        return "attention"
    return "permutation" if grp.kind == "permutation" else "scaling"


def _step(st: _State, step: list[str], solved: set[str], chosen: set[str], first: bool) -> bool:
    spec = st.spec
    kind = _kind(spec, step)
    allowed = _allowed(spec, step[0], solved, chosen) if first and len(step) == 1 else None
    if kind == "attention":
        cand = _solve_heads(st, step, allowed, chosen)
    elif kind == "permutation":
        cand = _solve_permutation(st, step[0], allowed)
    else:
        cand = _solve_scaling(st, step[0], allowed)
    touched = sorted({t for n in step for t in costs.touching(spec, n)} & set(st.names))
    return st.offer(touched, cand, allowed)


def descend(st: _State, chosen: set[str], first: bool, by_kind: dict) -> tuple[int, int]:
    """One sweep of coordinate descent over the chosen groups acting on `st`'s tensors: (steps, rejected)."""
    solved, count, rejected = set(), 0, 0
    for step in _schedule(st.spec, chosen):
        t0 = time.perf_counter()
        rejected += not _step(st, step, solved, chosen, first)
        kind = _kind(st.spec, step)
        by_kind[kind] = by_kind.get(kind, 0.0) + time.perf_counter() - t0
        solved.update(step)
        count += 1
    return count, rejected


def _sources(A, B, dtype):
    from ..model import InMemoryParts

    wrap = lambda x: InMemoryParts(x, dtype) if isinstance(x, dict) else x  # noqa: E731
    return wrap(A), wrap(B)


def weight_match(spec: Spec, A, B, families: list[str] | None = None, max_iters: int = 20,
                 tol: float = 1e-12, g0: dict | None = None, progress: bool = False,
                 dtype: torch.dtype = G.DTYPE) -> MatchResult:
    """The element g of the selected families making g·B closest to A.

    `A`, `B`: canonical parameter dicts, or anything with `part(key)` (a `model.LazyModel`), read one
    part at a time: peak memory is one block of each model (plus the embeddings), whatever the depth.
    One sweep visits every block (its attention, FFN and GLU groups given the current residual
    element, exactly as `descend` does in memory) while accumulating the residual statistics
    (`residual.ResidualFit`), then solves the residual rotation and scale given every block.
    In the first sweep the residual element comes from the embeddings and head alone, whose other
    groups are all known; the per-block groups of that sweep judge only the tensors whose other
    groups are solved. `dtype`: the precision of the algebra (float32: less memory and
    faster products at scale; the assignments cost the same).
    """
    from tqdm.auto import tqdm

    from ..model import part_keys

    start = time.perf_counter()
    src_a, src_b = _sources(A, B, dtype)
    spec = spec.restricted(families)  # residual_perm: the residual rotation restricted to permutations
    chosen = set(spec.select(families))
    g = {n: (g0[n] if g0 else G.identity(grp)) for n, grp in spec.groups.items()}
    run = _Run(spec, src_a, src_b, chosen, dict(g))
    fit_rot, fit_scale = ROTATION in chosen, SCALE in chosen
    keys = part_keys(spec.shape)

    # sweep 0: the starting objective, and the residual element from the ends alone
    total, ends = ResidualFit(spec), ResidualFit(spec)
    for key in tqdm(keys, desc="weight matching: start", disable=not progress, leave=False):
        run.start_part(key, total, ends)
    norm2 = total.norm2()
    history = [1.0 - total.distance(*run.residual()) / norm2]
    first = g0 is None
    if first and (fit_rot or fit_scale):
        with run.timer("rotation"):
            run.set_residual(*ends.solve(*run.residual(), fit_rot, fit_scale))
    restarted = False
    for it in tqdm(range(max_iters), desc="weight matching", disable=not progress):
        fit = ResidualFit(spec)
        for key in tqdm(keys, desc=f"sweep {it + 1}", disable=not progress, leave=False):
            run.sweep_part(key, fit, first)
        old = run.residual()
        if fit_rot or fit_scale:
            with run.timer("rotation"):
                new = fit.solve(*old, fit_rot, fit_scale)
            run.steps += 1
            if fit.distance(*new) < fit.distance(*old):
                run.set_residual(*new)
            else:
                run.rejected += 1
        history.append(1.0 - fit.distance(*run.residual()) / norm2)
        if first and history[-1] < history[0]:  # the initial sweep made things worse: start again
            run.g, restarted, history[-1] = dict(g), True, history[0]
        first = False
        if it > 0 and history[-1] - history[-2] <= tol * max(abs(history[-1]), 1e-30):
            break
    extra = {"restarted": restarted, "seconds_by_step_kind": run.seconds}
    return MatchResult(run.g, history, time.perf_counter() - start, run.rejected, run.steps, extra)


class _Run:
    """The state of one weight-matching run: the current element, and one method per part visited.

    Each part lives only inside the method that reads it, so at most one part of each model is held."""

    def __init__(self, spec: Spec, src_a, src_b, chosen: set[str], g: dict):
        self.spec, self.src_a, self.src_b, self.chosen, self.g = spec, src_a, src_b, chosen, g
        self.res_groups = [n for n in (ROTATION, SCALE) if n in spec.groups]
        self.steps = self.rejected = 0
        self.seconds: dict[str, float] = {}
        self.timer = _Timer(self.seconds)

    def residual(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.g[ROTATION], self.g.get(SCALE, torch.tensor(1.0, dtype=G.DTYPE))

    def set_residual(self, r: torch.Tensor, a: torch.Tensor) -> None:
        self.g[ROTATION] = r
        if SCALE in self.g:
            self.g[SCALE] = a

    def _read(self, key):
        from ..merge import check_same_tensors

        with self.timer("reading"):
            pa, pb = self.src_a.part(key), self.src_b.part(key)
        check_same_tensors(pa, pb)
        return pa, pb

    def _without_residual(self, pb: dict) -> dict:
        return apply(self.spec, {n: x for n, x in self.g.items() if n not in self.res_groups}, pb)

    def start_part(self, key, total: ResidualFit, ends: ResidualFit) -> None:
        pa, pb = self._read(key)
        with self.timer("residual statistics"):
            x = self._without_residual(pb)
            total.add(pa, x)
            if not isinstance(key, int):
                ends.add(pa, x)

    def sweep_part(self, key, fit: ResidualFit, first: bool) -> None:
        """A block's own groups given the residual element (one `descend`), then its residual statistics."""
        pa, pb = self._read(key)
        layer = {n for n in self.chosen if self.spec.groups[n].layer == key} if isinstance(key, int) else set()
        if layer:
            with self.timer("applying"):
                pr = apply(self.spec, {n: self.g[n] for n in self.res_groups}, pb)
            st = _State(self.spec, pa, pr, {n: x for n, x in self.g.items() if self.spec.groups[n].layer == key})
            n_steps, n_rej = descend(st, layer, first, self.seconds)
            self.steps, self.rejected = self.steps + n_steps, self.rejected + n_rej
            self.g.update(st.g)
            del pr, st
        with self.timer("residual statistics"):
            fit.add(pa, self._without_residual(pb))


class _Timer:
    """`with timer(kind):` adds the block's wall time to `seconds[kind]`."""

    def __init__(self, seconds: dict):
        self.seconds = seconds

    @contextlib.contextmanager
    def __call__(self, kind: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - t0
