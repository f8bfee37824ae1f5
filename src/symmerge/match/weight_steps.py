"""The steps of one weight-matching sweep (see `weight.py` for the method): which groups are solved
together, and one solver per kind of step, each returning a candidate element for `State.offer`.

Each step rebuilds its cost from `spec.actions` with every other group of the current element applied.
"""

from __future__ import annotations

import time

import torch

from ..algebra import groups as G
from ..algebra.elements import reindex, unindex
from ..algebra.spec import Spec
from . import costs
from .solvers import assignment_minimising, best_scale, linear_assignment, minimising_costs, solve_map
from .weight_products import cross, operand
from .weight_state import State, scatter, without


def schedule(spec: Spec, chosen: set[str]) -> list[list[str]]:
    """Steps of one sweep: lists of groups solved together (a layer's attention groups form one step; so do a
    mixture of experts' expert permutation and the FFN permutations inside the experts, when both are chosen)."""
    steps = [[n] for n, g in spec.groups.items() if g.layer is None and n in chosen]
    for i in range(spec.shape.n_layers):
        layer = [n for n, g in spec.groups.items() if g.layer == i and n in chosen]
        heads = [n for n in layer if spec.in_head_circuit(n)]
        roles = spec.layer_roles(i)
        experts = [roles.experts, roles.ffn] if roles.experts in layer and roles.ffn in layer else []
        steps += [s for s in (heads, experts) if s]
        steps += [[n] for n in layer if n not in heads and n not in experts]
    return steps


def _allowed(spec: Spec, group: str, solved: set[str], chosen: set[str]) -> set[str] | None:
    """First sweep: tensors whose other (chosen, non-scalar) groups are solved already; None = all."""
    ok = set()
    for name in costs.touching(spec, group):
        others = {a.group for a in spec.actions[name] if a.group != group}
        if all(o in solved or o not in chosen or not spec.groups[o].structure.acts_on_axis for o in others):
            ok.add(name)
    return ok or None


# --- one step per group kind --------------------------------------------------------------------------


def solve_scaling(st: State, name: str, allowed) -> dict:
    """Scalar or diagonal: the exact minimiser entry by entry (`solvers.best_scale`), in A's order, then re-indexed."""
    grp = st.spec.groups[name]
    others = without(st.g, [name])
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
            dims = tuple(range(xa.dim())) if not grp.structure.acts_on_axis else -1
            if how == "g":
                p, q = p + (xb * xb).sum(dims), q + (xa * xb).sum(dims)
            else:
                s, t = s + (xb * xb).sum(dims), t + (xa * xb).sum(dims)
    current = reindex(st.spec, name, st.g[name], st.g)  # in A's order
    d = best_scale(p, q, s, t, positive=grp.structure.positive)
    d = torch.where(torch.isfinite(d), d, current)
    return {**st.g, name: unindex(st.spec, name, d, st.g)}


def _solve_permutation(st: State, name: str, allowed) -> dict:
    touched = [t for t in costs.touching(st.spec, name) if t in st.A]
    bp = st.moved(touched, without(st.g, [name]))
    s = costs.gram_cross(st.spec, name, st.A, bp, allowed, st.products)
    del bp  # memory: at 7B shape the FFN tensors moved (0.5 GiB), the cost (0.5 GiB) and its float64 form (0.9 GiB)
    lead = s.shape[:-1]
    cost = [minimising_costs(m) for m in s.reshape(-1, *s.shape[-2:])]
    eps = torch.finfo(s.dtype).eps
    del s  # the assignments hold only the float64 costs
    p = torch.stack([assignment_minimising(c, eps) for c in cost]).reshape(lead)
    return {**st.g, name: unindex(st.spec, name, p, st.g)}  # batched by a permutation (an expert's units): B's order


def _head_perms(st: State, names: list[str], bp: dict, chosen: set[str]) -> dict:
    """Head (KV group) permutation and query-head permutations from circuit similarities."""
    spec = st.spec
    roles = spec.layer_roles(spec.groups[names[0]].layer)
    top, inner = roles.heads, roles.query_heads
    sim = 0.0
    for m in roles.head_maps:
        sa, sb = costs.sides(spec, m, st.A, keep_group=inner), costs.sides(spec, m, bp, keep_group=inner)
        q_axis = (lambda x: x) if inner is not None else (lambda x: x.unsqueeze(1))  # [h, q, n, m]
        sim = sim + costs.circuit_similarity(q_axis(sa["g"]), q_axis(sb["g"]), q_axis(sa["inv_t"]), q_axis(sb["inv_t"]),
                                             st.products, spec.groups[m].pairing)  # RoPE: per-pair circuits
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
    return p, scatter(inner_p[torch.arange(n_h), p], p)


def _solve_heads(st: State, names: list[str], allowed, chosen: set[str]) -> dict:
    """A layer's attention groups: permutations by circuits, then each map inside the matched heads."""
    spec = st.spec
    layer = spec.groups[names[0]].layer
    block = [n for n, g in spec.groups.items() if g.layer == layer and spec.in_head_circuit(n)]
    touched = sorted({t for n in block for t in costs.touching(spec, n)} & set(st.A))
    g0 = without(st.g, block)
    perms = {n: st.g[n] for n in block if spec.groups[n].structure.index_vector}
    if any(spec.is_head_permutation(n) for n in names):
        perms = _head_perms(st, names, st.moved(touched, g0), chosen)
    cand = {**st.g, **perms}
    bq = st.moved(touched, {**g0, **perms})  # B's heads in A's order, maps not applied
    for m in names:
        grp = spec.groups[m]
        if grp.structure.index_vector:
            continue
        sa, sb = costs.sides(spec, m, st.A), costs.sides(spec, m, bq)
        found = _solve_map_in_chunks(grp, sa["g"], sb["g"], sa["inv_t"], sb["inv_t"])
        cand[m] = scatter(found, perms[grp.indexed_by] if grp.indexed_by else None)
    return cand


def _solve_experts(st: State, names: list[str], allowed) -> dict:
    """A mixture of experts' expert permutation and the FFN permutations inside the experts, from a cost between
    whole experts that does not depend on the order of their units: each pair (A's expert a, B's expert b) is
    scored by the best assignment of b's units to a's (the FFN permutation's cost, `sum_t A_t B_t^T` over the
    unit axis, restricted to the pair) plus the similarity of their router rows; experts are assigned on these
    scores, then each matched pair keeps its unit assignment (as `assign_heads` does for query heads). `allowed`
    (the first sweep): the tensors the scores may use (None: all)."""
    spec = st.spec
    roles = spec.layer_roles(spec.groups[names[0]].layer)
    touched = sorted({t for n in (roles.experts, roles.ffn) for t in costs.touching(spec, n)} & set(st.A))
    bp = st.moved(touched, without(st.g, [roles.experts, roles.ffn]))  # B's experts and units in B's order
    use = [t for t in st.A if allowed is None or t in allowed]
    units = [(costs.along(st.A[t], a), costs.along(bp[t], a)) for t, a in costs.touching(spec, roles.ffn).items()
             if t in use]
    xa, xb = (torch.cat([u[k] for u in units], -1) for k in (0, 1))  # [E, d_mlp, m]
    rows = [(costs.along(st.A[t], a), costs.along(bp[t], a)) for t, a in costs.touching(spec, roles.experts).items()
            if t in use and not any(b.group == roles.ffn for b in spec.actions[t])]  # the router: [E, m']
    router = sum((ra @ rb.T for ra, rb in rows), torch.zeros(xa.shape[0], xa.shape[0], dtype=xa.dtype))
    n = xa.shape[0]
    value, inner = torch.zeros(n, n, dtype=G.DTYPE), torch.zeros(n, n, xa.shape[1], dtype=torch.long)
    for a in range(n):
        sims = cross(operand(xa[a], st.products).unsqueeze(0), operand(xb, st.products), st.products)
        for b in range(n):  # sims[b]: A's expert a's units against B's expert b's, [d_mlp, d_mlp]
            inner[a, b] = linear_assignment(sims[b])
            value[a, b] = sims[b][torch.arange(xa.shape[1]), inner[a, b]].sum() + router[a, b]
    p = linear_assignment(value)
    return {**st.g, roles.experts: p, roles.ffn: scatter(inner[torch.arange(n), p], p)}


#: KV groups whose maps are solved at once (`_solve_map_in_chunks`)
MAP_CHUNK = 8


def _solve_map_in_chunks(grp, xa, xb, ya, yb, chunk: int | None = None) -> torch.Tensor:
    """`solve_map` over the leading (KV group) axis, `chunk` groups at a time, each chunk in float64.

    Each group's map is solved from its own rows alone, so the chunks give the batched solve's maps; what
    changes is memory: the float64 copies and the solvers' temporaries of `chunk` KV groups at a time,
    instead of every group's at once."""
    chunk = chunk or MAP_CHUNK
    n = xa.shape[0]
    parts = [solve_map(grp, *(x[i:i + chunk].to(G.DTYPE) for x in (xa, xb, ya, yb))) for i in range(0, n, chunk)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


# --- one sweep ----------------------------------------------------------------------------------------


#: the kinds of step, which pick the solver and name the reports' `seconds_by_step_kind` entries
ATTENTION, EXPERTS, PERMUTATION, SCALING = "attention", "experts", "permutation", "scaling"


def _step_kind(spec: Spec, step: list[str]) -> str:
    """ATTENTION for a layer's head circuit (one step, `_solve_heads`); for one other group, PERMUTATION when
    its kind's solver (`kinds.Kind.solver`) is the assignment (the FFN permutation), SCALING otherwise
    (the GLU scales' closed form)."""
    grp = spec.groups[step[0]]
    if spec.in_head_circuit(step[0]):
        return ATTENTION
    if len(step) > 1:
        return EXPERTS
    return PERMUTATION if grp.structure.solver == "assignment" else SCALING


def _step(st: State, step: list[str], solved: set[str], chosen: set[str], first: bool) -> bool:
    spec = st.spec
    step_kind = _step_kind(spec, step)
    allowed = _allowed(spec, step[0], solved, chosen) if first and len(step) == 1 else None
    if first and step_kind == EXPERTS:  # the tensors that neither an unsolved GLU scale nor another group touches
        allowed = set().union(*(_allowed(spec, n, solved | set(step), chosen) or costs.touching(spec, n) for n in step))
    if step_kind == ATTENTION:
        cand = _solve_heads(st, step, allowed, chosen)
    elif step_kind == EXPERTS:
        cand = _solve_experts(st, step, allowed)
    elif step_kind == PERMUTATION:
        cand = _solve_permutation(st, step[0], allowed)
    else:
        cand = solve_scaling(st, step[0], allowed)
    touched = sorted({t for n in step for t in costs.touching(spec, n)} & set(st.names))
    return st.offer(touched, cand, allowed)


def descend(st: State, chosen: set[str], first: bool, seconds_by_step_kind: dict) -> tuple[int, int]:
    """One sweep of coordinate descent over the chosen groups acting on `st`'s tensors: (steps, rejected).
    Each step's wall time is added to `seconds_by_step_kind[its step kind]`."""
    solved, count, rejected = set(), 0, 0
    for step in schedule(st.spec, chosen):
        t0 = time.perf_counter()
        rejected += not _step(st, step, solved, chosen, first)
        step_kind = _step_kind(st.spec, step)
        seconds_by_step_kind[step_kind] = seconds_by_step_kind.get(step_kind, 0.0) + time.perf_counter() - t0
        solved.update(step)
        count += 1
    return count, rejected
