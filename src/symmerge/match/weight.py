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
  similarity`), which the head-internal maps leave unchanged, so heads are matched before their maps
  (under RoPE the QK circuits are compared rotary pair by rotary pair: only equal frequencies can be
  aligned by a map that commutes with the rotations);
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

Where each part lives: `weight_steps` (the schedule of a sweep and one solver per kind of step),
`weight_state` (the current element with its per-tensor distances and the acceptance rule),
`weight_stream` (one part of each model at a time, the residual statistics), `timer`; this module
holds the result type and the outer loop over sweeps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..algebra import groups as G
from ..algebra.spec import Spec
from ..runtime.threads import one_thread
from . import near_ties
from .residual import ROTATION, SCALE
from .weight_stream import StreamRun, sources

#: blocks solved at once when `weight_match(workers=0)`: at most this many, however many threads there are
MAX_AUTO_WORKERS = 4


@dataclass
class MatchResult:
    g: dict[str, torch.Tensor]
    history: list[float]  # similarity after sweep 0 (the starting element), 1, 2, ...
    seconds: float
    rejected: int = 0  # steps whose candidate would not have improved the objective
    steps: int = 0
    extra: dict = field(default_factory=dict)


def weight_match(spec: Spec, A, B, families: list[str] | None = None, max_iters: int = 20,
                 tol: float = 1e-12, g0: dict | None = None, progress: bool = False,
                 dtype: torch.dtype = G.DTYPE, products: str | None = None,
                 device: torch.device | str | None = None, min_gain: float = 0.0, workers: int = 0) -> MatchResult:
    """The element g of the selected families making g·B closest to A.

    `A`, `B`: canonical parameter dicts or `model.Model`s (read through a view in `dtype`), or anything that
    serves parts (`parts.Parts`: a `model.LazyModel`, a mean), read one part at a time: peak memory is one
    block of each model (plus the embeddings), whatever the depth.
    One sweep visits every block (its attention, FFN and GLU groups given the current residual
    element, exactly as `weight_steps.descend` does in memory) while accumulating the residual statistics
    (`residual.ResidualFit`), then solves the residual rotation and scale given every block.
    In the first sweep the residual element comes from the embeddings and head alone, whose other
    groups are all known; the per-block groups of that sweep judge only the tensors whose other
    groups are solved. `dtype`: the precision of the algebra (float32: less memory and
    faster products at scale; the assignments cost the same). `products`: "bfloat16" computes the cost
    matrices that propose assignments from bfloat16 operands (`weight_products`; faster on CPUs with
    AMX; candidates are still judged exactly); None: in `dtype`. `device` (None: the CPU): where the large
    products run (B's blocks under the residual rotation, the assignment costs, the residual
    cross-covariances) and the Procrustes solves; the parts are read, the assignments solved and the
    element kept on the CPU, so a GPU changes only where the products run (and their summation order).
    `min_gain`: from a given `g0`, also stop after a sweep that lowers the squared distance by at most this
    much (many-model rounds bound their matches by it, `many.weight_match_many`); 0: the `tol` rule alone.
    `workers`: blocks solved at once within a sweep, each on one thread (`weight_stream.StreamRun.sweep`;
    memory up to that many blocks of both models); 0: torch's thread count, at most `MAX_AUTO_WORKERS`.

    Thread count: the whole computation runs under `threads.one_thread`, so the element, the history and
    every discrete choice are bit for bit the same at any thread count and any `workers` on one machine
    and torch build (not across CPU models or builds, nor between the CPU and a GPU `device`, whose
    products sum in another order). `extra["near_ties"]`: how many discrete choices were decided by a margin
    within rounding error, and the smallest margins (`near_ties`): where they are many, another machine
    may find another element.
    """
    with one_thread() as threads, near_ties.recording() as ties:
        workers = workers or min(threads, MAX_AUTO_WORKERS)
        res = _weight_match(spec, A, B, families, max_iters, tol, g0, progress, dtype, products, device, min_gain,
                            workers)
    res.extra["near_ties"] = ties.report()
    return res


def _weight_match(spec, A, B, families, max_iters, tol, g0, progress, dtype, products, device, min_gain,
                  workers) -> MatchResult:
    from ..runtime.progress import tqdm
    from ..store.parts import part_keys

    start = time.perf_counter()
    src_a, src_b = sources(A, B, dtype)
    spec = spec.restricted(families)  # residual_perm: the residual rotation restricted to permutations
    chosen = set(spec.select(families))
    g = {n: (g0[n] if g0 else G.identity(grp)) for n, grp in spec.groups.items()}
    device = None if device is None else torch.device(device)
    run = StreamRun(spec, src_a, src_b, chosen, dict(g), None if products == "exact" else products, device)
    fit_rot, fit_scale = ROTATION in chosen, SCALE in chosen
    keys = part_keys(spec.shape)

    # sweep 0: the starting objective, and the residual element from the ends alone
    total, ends = run.fit(), run.fit()
    for key in tqdm(keys, desc="weight matching: start", disable=not progress, leave=False):
        run.start_part(key, total, ends)
    norm2 = total.norm2()
    distances = [total.distance(*run.residual())]  # ||A - g.B||^2 after each sweep (0: the start)
    history = [1.0 - distances[0] / norm2]
    first = g0 is None
    if first and (fit_rot or fit_scale):
        with run.timer("rotation"):
            run.set_residual(*ends.solve(*run.residual(), fit_rot, fit_scale))
    del total, ends  # memory: two d x d float64 pairs (0.5 GiB at d = 4096) no sweep reads
    restarted = False
    for it in tqdm(range(max_iters), desc="weight matching", disable=not progress):
        fit = run.new_fit()
        swept = [k for k in keys if k not in run.fixed_parts]
        with tqdm(total=len(swept), desc=f"sweep {it + 1}", disable=not progress, leave=False) as bar:
            run.sweep(swept, fit, first, workers, bar.update)
        old = run.residual()
        if fit_rot or fit_scale:
            with run.timer("rotation"):
                new = fit.solve(*old, fit_rot, fit_scale)
            run.steps += 1
            if fit.distance(*new) < fit.distance(*old):
                run.set_residual(*new)
            else:
                run.rejected += 1
        distances.append(fit.distance(*run.residual()))
        history.append(1.0 - distances[-1] / norm2)
        if first and history[-1] < history[0]:  # the initial sweep made things worse: start again
            run.g, restarted, history[-1], distances[-1] = dict(g), True, history[0], distances[0]
        first = False
        if it > 0 and history[-1] - history[-2] <= tol * max(abs(history[-1]), 1e-30):
            break
        if min_gain > 0 and g0 is not None and distances[-2] - distances[-1] <= min_gain:
            break
    extra = {"restarted": restarted, "seconds_by_step_kind": run.seconds, "distances": distances, "norm2": norm2}
    return MatchResult(run.g, history, time.perf_counter() - start, run.rejected, run.steps, extra)
