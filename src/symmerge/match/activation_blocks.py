"""Activation matching's per-block groups solved given its residual rotation (`--blocks weight`, the default).

Why: every cost activation matching reads is blind to the groups solved beside it. The streams the
rotation is fitted on do not change under any per-block group, and the hidden units, attention patterns
and head-map sides the per-block groups are fitted on do not change under the rotation (each model runs in
its own coordinates). So the FFN and head permutations are chosen without asking whether, under the
rotation found, g·B's weights land near A's, which is what the interpolated model needs; and alternating the
activation steps changes nothing, each step's cost being independent of the others. On trained pairs the
rotation found from the streams is as good as weight matching's (or better), and the per-block groups are
what costs the barrier (benchmarks/activation_diagnosis.py). Here the per-block groups are re-solved by
weight matching (coordinate descent over every selected family but the residual rotation) from activation
matching's element, the rotation held: its coupling to the blocks then comes from the weights.

Where it fails: the result is no longer a function of the activations alone (it is the element of weight
matching's objective nearest activation matching's rotation); `--blocks activation` keeps the data-only
element. Planted copies: weight matching given the exact rotation recovers the planted per-block groups,
as from the identity (tests/test_activation_blocks.py).

`--blocks best` (the default) asks the data which of three elements to keep: the per-block groups given the
rotation (as above), weight matching started from activation matching's element (the rotation free too),
and weight matching from the identity. Each is a local optimum of weight matching's objective from another
start, and none is lowest on every trained pair; the one kept is the one whose merge (the midpoint of a pair,
the weighted average of many models) has the lowest stock loss on held-out batches (as many of the validation
split as the activations were taken on). Not on those batches themselves: an element fitted on them looks
better there than it is (Llama demo pair: 0.006 nats lower midpoint loss on them, 0.053 higher on the test
split). It costs two more weight matchings and three forwards of the merge; a choice on so few batches can
miss the test split's order where the candidates' losses are within their noise.
"""

from __future__ import annotations

import time

from ..algebra.families import RESIDUAL_PERM, RESIDUAL_ROTATION
from .weight import MatchResult, weight_match

#: the first is the default
BLOCKS = ("best", "weight", "activation")
#: `--blocks best`'s candidates, in the order a tie keeps
CANDIDATES = ("weight given the rotation", "weight from the activations' element", "weight from the identity")


def reads_held_out(blocks: str) -> bool:
    """Whether `blocks` (one of `BLOCKS`) reads held-out batches: only "best" judges its candidates' merges."""
    return blocks == BLOCKS[0]


def blocks_given_rotation(a, b, families: list[str] | None, found: MatchResult, max_iters: int = 20,
                          **weight_options) -> MatchResult:
    """`found` (activation matching's result) with every selected family but the residual rotation re-solved
    by weight matching from it; the rotation kept. `a`, `b`: what `weight_match` reads (parameter dicts,
    `Model`s or `LazyModel`s); `weight_options`: its precision, device and workers."""
    chosen = b.spec.families() if families is None else families  # None: every family, as `Spec.select`
    free = [f for f in chosen if f not in (RESIDUAL_ROTATION, RESIDUAL_PERM)]
    if not free:
        return found
    res = weight_match(b.spec, a, b, free, max_iters=max_iters, g0=found.g, **weight_options)
    extra = {**found.extra, "blocks": "weight", "blocks_sweeps": len(res.history) - 1,
             "blocks_objective": res.history, "blocks_seconds": res.seconds}
    history = [found.history[0], res.history[-1]]  # the weights' similarity before and after
    return MatchResult(res.g, history, found.seconds + res.seconds, found.rejected + res.rejected,
                       found.steps + res.steps, extra)


def per_block(a, b, families: list[str] | None, found: MatchResult, blocks: str, loss, max_iters: int = 20,
              **weight_options) -> MatchResult:
    """Activation matching's element `found` finished as `blocks` says (`BLOCKS`, module docstring).

    loss(g) -> float: the stock loss of the merge with `g` acting on `b` (the lower the better), read only by
    "best"; the report's extra then holds every candidate's loss and the one kept."""
    if blocks == "activation":
        return found
    given = blocks_given_rotation(a, b, families, found, max_iters, **weight_options)
    if blocks == "weight":
        return given
    t0 = time.perf_counter()
    cands = {CANDIDATES[0]: given,
             CANDIDATES[1]: weight_match(b.spec, a, b, families, max_iters=max_iters, g0=found.g, **weight_options),
             CANDIDATES[2]: weight_match(b.spec, a, b, families, max_iters=max_iters, **weight_options)}
    losses = {name: float(loss(res.g)) for name, res in cands.items()}
    kept = min(CANDIDATES, key=lambda name: (losses[name], CANDIDATES.index(name)))
    extra = {**given.extra, "blocks": "best", "blocks_candidates": losses, "blocks_kept": kept,
             "blocks_choice_seconds": time.perf_counter() - t0}
    res = cands[kept]
    return MatchResult(res.g, [found.history[0], res.history[-1]], given.seconds + extra["blocks_choice_seconds"],
                       res.rejected, res.steps, extra)
