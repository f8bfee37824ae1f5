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
"""

from __future__ import annotations

from ..algebra.families import RESIDUAL_PERM, RESIDUAL_ROTATION
from .weight import MatchResult, weight_match

BLOCKS = ("weight", "activation")


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
