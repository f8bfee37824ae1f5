"""Weight matching of many models into one shared coordinate system (MergeMany over the whole group).

Models P_1..P_n with merge weights w (non-negative, summing to 1) and elements g_1..g_n; X_i = g_i·P_i
and M = sum_i w_i X_i. The objective, reported per round, is the weighted similarity to the mean

    similarity = 1 - sum_i w_i ||X_i - M||^2 / sum_i w_i ||P_i||^2

(canonical tensors of dimension > 0, as pairwise weight matching; the denominator is the inputs' and
does not move). Since sum_i w_i ||X_i - M||^2 = sum_{i<j} w_i w_j ||X_i - X_j||^2, the terms that depend
on X_i are w_i (1 - w_i) ||X_i - M_-i||^2 plus a constant, with M_-i the weighted mean of the others:
matching model i to its leave-one-out mean with the pairwise matcher (`weight.weight_match`, every
selected family) is coordinate descent on this objective.

Schedule: models are visited in an order drawn from `seed`. Round 1 starts from the identity: the
first model of the order is the reference and each next one is matched to the mean of those already
visited (a pairwise problem with a sharp target, where matching from the identity recovers planted
elements); the round is kept only if the objective, computed exactly (`math.fsum`) over every model,
did not decrease. Each later round visits every model in a fresh order and matches it to its
leave-one-out mean, starting from its current element. There the objective moves by exactly

    w_i (1 - w_i) (||X_i - M_-i||^2 - ||X_i' - M_-i||^2) / sum_j w_j ||P_j||^2

when X_i becomes X_i' (the decomposition above: the others' spread about M_-i does not change), and the
two distances are the pairwise matcher's own start and end: no pass over the other models is needed. A
new element is kept only if that gain is not negative, so the history never decreases. Rounds stop when
one improves the objective by at most `tol` relative (`ROUND_TOL` by default; the benchmarks'
README shows what later rounds still change), or after `max_rounds`; `ManyResult.converged` says which.

Residual scale: where the selection leaves the residual scale out (the default, `Spec.default_families`),
the inputs are first brought to one normalisation eps, the first input's: model i's writers are multiplied
by a_i = sqrt(eps_1 / eps_i) and its eps by a_i^2 (`scale_gauge`). The scale is an exact symmetry that moves
the eps with it, so this picks one point of every model's scale orbit: a copy of model 1 at another scale
(its eps moved with it) comes back to model 1's scale, while models of one eps are left as they are.
Unmatched, such a copy would leave the mean short of model 1's function (an average of streams at
different scales is not a rescaled stream, and the head maps absorb part of the scale, an OV map trading
V against the scaled O); and every aligned model keeps one eps, so that their plain average is the mean.
The element of model i carries a_i as its residual scale, and the objective is that of the elements so
completed. A fitted scale (`--groups all`) is left to the matcher.

Cost of a round: round 1's matches run as pairwise matchings; a later round's matches are bounded so that
the round costs no more than round 1 per match (`later_match_bounds`: round 1's mean sweeps per match at most,
and a sweep worth less than the stop rule's share of the round ends its match). Run to the pairwise matcher's
own stop rule instead, a later round can cost more sweeps than round 1 while gaining less.

Memory: each match forms its target, the mean of the others, once (one read and one `apply` of
each other model) into a `part_cache.PartCache`, which every sweep of the match then reads as a
pairwise match reads its first model; the mean is kept on disk when the models stream from checkpoints,
so that the resident memory is one part (embeddings, a block, the head) of each model plus one part of
the mean, whatever the depth (the temporary folder holds one model in the algebra's dtype), and in
memory when the models are in memory already.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..algebra import groups as G
from ..algebra.apply import apply
from ..algebra.spec import Spec
from ..runtime.threads import one_thread
from ..store.model import as_parts, in_memory
from ..store.parts import Parts, part_keys
from .norms import sqdist, sqnorm
from .part_cache import PartCache
from .weight import weight_match

#: the rounds' stop rule: a round that improves the objective by at most this much, relative, is the last
#: (`merge --round-tol`; the registry reads this default)
ROUND_TOL = 1e-4


class MeanParts(Parts):
    """The weighted mean of `g_j·P_j` over the models `keep`, served part by part.

    Where the models of `keep` all weigh 0 (a merge weight of 1 elsewhere), the mean is uniform over them:
    such models do not enter the objective, and any shared coordinates do for them."""

    def __init__(self, spec: Spec, sources: list, elements: list[dict], weights: list[float], keep: list[int],
                 dtype: torch.dtype = G.DTYPE):
        total = math.fsum(weights[j] for j in keep)
        self.spec, self.sources, self.elements, self.dtype = spec, sources, elements, dtype
        self.terms = [(j, weights[j] / total if total > 0 else 1.0 / len(keep)) for j in keep]

    def part(self, key) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for j, w in self.terms:
            moved = apply(self.spec, self.elements[j], self.sources[j].part(key))
            for name, t in moved.items():
                t = t.to(self.dtype)
                out[name] = w * t if name not in out else out[name] + w * t
        return out


def objective_terms(spec: Spec, sources: list, elements: list[dict], weights: list[float]) -> tuple[float, float]:
    """(sum_i w_i ||g_i·P_i - M||^2, sum_i w_i ||P_i||^2), streamed one part of every model at a time."""
    sources = [as_parts(s) for s in sources]
    spread, norm2 = [], []
    for key in part_keys(spec.shape):
        parts = [src.part(key) for src in sources]
        moved = [apply(spec, g, p) for g, p in zip(elements, parts)]
        for name, t in parts[0].items():
            if t.dim() == 0:  # norm.eps moves with the scale: not a weight
                continue
            mean = sum(w * m[name].to(G.DTYPE) for w, m in zip(weights, moved))
            for w, p, m in zip(weights, parts, moved):
                spread.append(w * sqdist(m[name].to(G.DTYPE), mean))
                norm2.append(w * sqnorm(p[name].to(G.DTYPE)))
    return math.fsum(spread), math.fsum(norm2)


def objective(spec: Spec, sources: list, elements: list[dict], weights: list[float]) -> float:
    """1 - sum_i w_i ||g_i·P_i - M||^2 / sum_i w_i ||P_i||^2, streamed one part of every model at a time."""
    spread, norm2 = objective_terms(spec, sources, elements, weights)
    return 1.0 - spread / norm2


@dataclass
class Step:
    """One model's match: its new element, the seconds it took and, where the matcher knows it exactly, the
    objective's change from the current element (None: `rounds` recomputes the objective over every model)."""

    g: dict[str, torch.Tensor]
    seconds: float
    gain: float | None = None
    sweeps: int = 0  # the pairwise matcher's sweeps (weight matching; 0 where the matcher has none)


@dataclass
class ManyResult:
    elements: list[dict[str, torch.Tensor]]  # g_i, acting on model i
    history: list[float]  # the objective before round 1 (identity elements), then after each round
    orders: list[list[int]]  # the visiting order of each round
    seconds: float
    rejected: int = 0  # model updates not kept (they would have lowered the objective)
    pairwise_seconds: float = 0.0  # time inside the pairwise matcher
    extra: dict = field(default_factory=dict)
    round_seconds: list[float] = field(default_factory=list)  # each round's time, its objectives included
    round_sweeps: list[int] = field(default_factory=list)  # each round's sweeps of the pairwise matcher
    converged: bool = False  # the last round gained at most `tol` (False: `max_rounds` stopped it)
    tol: float = ROUND_TOL


def rounds(n: int, value_of: Callable[[list[dict]], float], match: Callable, identity: dict, max_rounds: int = 10,
           seed: int = 0, tol: float = ROUND_TOL, progress: bool = False, desc: str = "merge rounds") -> ManyResult:
    """The schedule of the module docstring for any matcher: `match(i, keep, elements, g0)` returns a `Step`
    (model i's element bringing it to the weighted mean of `g_j·P_j` over `keep`), starting from `g0` where
    the matcher takes a start (None: from the identity); `value_of(elements)` is the objective (higher is
    better), recomputed over every model where a later round's `Step` has no exact gain. A new element is
    kept only if the objective does not decrease, so the history never decreases."""
    from ..runtime.progress import tqdm

    start = time.perf_counter()
    elements = [dict(identity) for _ in range(n)]
    history = [value_of(elements)]
    gen = torch.Generator().manual_seed(seed)
    orders, rejected, inner, took, sweeps, converged = [], 0, 0.0, [], [], False
    for rnd in tqdm(range(max_rounds), desc=desc, disable=not progress):
        t_round = time.perf_counter()
        order = torch.randperm(n, generator=gen).tolist()
        orders.append(order)
        sweeps.append(0)
        if rnd == 0:  # each model to the mean of those visited before it, from the identity
            trial = [dict(identity) for _ in range(n)]
            for k, i in enumerate(order[1:], start=1):
                step = match(i, order[:k], trial, None)
                trial[i], inner, sweeps[-1] = step.g, inner + step.seconds, sweeps[-1] + step.sweeps
            value = value_of(trial)
            if value >= history[-1]:
                elements = trial
            else:
                rejected, value = rejected + 1, history[-1]
        else:  # each model to the mean of all the others, from its current element
            value = history[-1]
            for i in order:
                step = match(i, [j for j in range(n) if j != i], elements, elements[i])
                inner, sweeps[-1] = inner + step.seconds, sweeps[-1] + step.sweeps
                trial = [*elements[:i], step.g, *elements[i + 1:]]
                new = value + step.gain if step.gain is not None else value_of(trial)
                if new >= value:
                    elements, value = trial, new
                else:
                    rejected += 1
        history.append(value)
        took.append(time.perf_counter() - t_round)
        if rnd > 0 and history[-1] - history[-2] <= tol * max(abs(history[-1]), 1e-30):
            converged = True
            break
    return ManyResult(elements, history, orders, time.perf_counter() - start, rejected, inner, round_seconds=took,
                      round_sweeps=sweeps, converged=converged, tol=tol)


def later_match_bounds(g0, max_iters: int, state: dict, tol: float, n: int, pair_weight: float,
                       norm2: float | None) -> tuple[int, float]:
    """(sweeps at most, least gain of a sweep) for one match of `weight_match_many`.

    Round 1's matches (from the identity, `g0` None) run as pairwise matchings do. A later round must cost no
    more than round 1 per match, whatever the models, so each of its matches (from its current element) is
    bounded twice: by round 1's mean sweeps per match (rounded up), and by the round's stop rule, shared out:
    a sweep that raises the N-model objective by at most `tol |objective| / n` ends the match, since n such
    sweeps together gain no more than the amount at which `rounds` stops. In squared-distance units of the
    match, where the objective moves by `w_i (sum_keep w_j) delta / sum_j w_j ||P_j||^2` (`pair_weight` the
    product of the weights)."""
    if g0 is None or not state["first_sweeps"]:
        return max_iters, 0.0
    first = state["first_sweeps"]
    iters = max(1, min(max_iters, math.ceil(sum(first) / len(first))))
    if tol <= 0 or norm2 is None:
        return iters, 0.0
    share = tol * max(abs(state["value"]), 1e-30) / n
    return iters, (share * norm2 / pair_weight if pair_weight > 0 else math.inf)


def scale_gauge(spec: Spec, sources: list, families: list[str] | None) -> list[float] | None:
    """Each model's residual scale a_i = sqrt(eps_1 / eps_i), which brings every model to the first one's
    normalisation eps (the scale moves the eps by a^2; module docstring); None where the spec has no residual
    scale or the selection fits it. Models of one eps (independent models of one config) get a_i = 1."""
    if not spec.residual_scales(spec.groups) or spec.includes_residual_scale(spec.select(families)):
        return None
    eps = [float(src.part("final")["norm.eps"]) for src in sources]
    return [math.sqrt(eps[0] / e) if e > 0 and eps[0] > 0 else 1.0 for e in eps]


def scale_element(spec: Spec, a: float) -> dict[str, torch.Tensor]:
    """The element of the residual scale `a` alone."""
    name = spec.residual_scales(spec.groups)[0]
    return {name: G.identity(spec.groups[name]) * a}


def with_scales(spec: Spec, elements: list[dict], scales: list[float] | None) -> list[dict]:
    """The elements acting on the inputs: each one found on the inputs brought to one residual scale, composed
    with its model's scale from `scale_gauge` (None: the elements as they are)."""
    if scales is None:
        return elements
    name = spec.residual_scales(spec.groups)[0]
    grp = spec.groups[name]
    return [{**g, name: G.compose(grp, g[name], scale_element(spec, a)[name])} for g, a in zip(elements, scales)]


class ScaledParts(Parts):
    """A source served part by part with the residual scale `a` applied (`scale_gauge`)."""

    def __init__(self, spec: Spec, source, a: float):
        self.spec, self.source, self.element = spec, source, scale_element(spec, a)

    def part(self, key) -> dict[str, torch.Tensor]:
        return apply(self.spec, self.element, self.source.part(key))


def weight_match_many(spec: Spec, sources: list, weights: list[float], families: list[str] | None = None,
                      max_rounds: int = 10, max_iters: int = 20, seed: int = 0, tol: float = ROUND_TOL,
                      dtype: torch.dtype = G.DTYPE, progress: bool = False, products: str | None = None,
                      cache_on_disk: bool | None = None) -> ManyResult:
    """The elements bringing every model of `sources` (canonical dicts, `Model`s or `LazyModel`s of one shape) into
    shared coordinates, by the schedule in the module docstring; `weights` sum to 1; `products` as
    `weight.weight_match`'s. `cache_on_disk`: where each match's target mean is kept (None: on disk when
    some source streams from a checkpoint, in memory when all are in memory)."""
    inputs = [as_parts(s, dtype) for s in sources]
    on_disk = (not all(in_memory(s) for s in sources)) if cache_on_disk is None else cache_on_disk
    scales = scale_gauge(spec, inputs, families)
    srcs = inputs if scales is None else [s if a == 1.0 else ScaledParts(spec, s, a) for s, a in zip(inputs, scales)]
    norm2 = {}  # sum_j w_j ||P_j||^2, from the first objective (it does not move)
    state = {"value": None, "first_sweeps": []}  # the objective as `rounds` keeps it; round 1's sweeps per match

    def value_of(elements):
        spread, norm2["all"] = objective_terms(spec, inputs, with_scales(spec, elements, scales), weights)
        value = 1.0 - spread / norm2["all"]
        state["value"] = value if state["value"] is None else max(state["value"], value)  # round 1 kept if not lower
        return value

    def match(i, keep, elements, g0):
        t0 = time.perf_counter()
        others = math.fsum(weights[j] for j in keep)
        iters, min_gain = later_match_bounds(g0, max_iters, state, tol, len(srcs), weights[i] * others, norm2.get("all"))
        with PartCache(part_keys(spec.shape), on_disk) as target:
            target.fill(MeanParts(spec, srcs, elements, weights, keep, dtype).part)
            res = weight_match(spec, target, srcs[i], families, iters, g0=g0, dtype=dtype, products=products,
                               min_gain=min_gain)
        d = res.extra["distances"]  # to the mean of `keep`: at g0 (or the identity), and at the end
        gain = weights[i] * others * (d[0] - d[-1]) / norm2["all"] if len(keep) == len(srcs) - 1 else None
        if g0 is None:
            state["first_sweeps"].append(len(res.history) - 1)
        elif gain is not None and gain >= 0:  # kept by `rounds` (a gain below 0 is not)
            state["value"] += gain
        return Step(res.g, time.perf_counter() - t0, gain, len(res.history) - 1)

    identity = {name: G.identity(grp) for name, grp in spec.groups.items()}
    with one_thread():  # the objectives and means too: the rounds' choices do not depend on the thread count
        res = rounds(len(srcs), value_of, match, identity, max_rounds, seed, tol, progress)
    res.elements = with_scales(spec, res.elements, scales)
    if scales is not None:
        res.extra["scale_gauge"] = scales
    return res
