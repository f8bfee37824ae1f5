"""Activation matching of many models, streamed one part of each model at a time (`merge --method activation`).

The schedule is `many.rounds`'s: model i is matched (`activation_stream.activation_match_streaming`, from
scratch, one block of each side at a time) to the leave-one-out mean of the others, whose activations come
from running it; the objective is minus the stock HF loss of the weighted average (higher is better, never
decreasing) on the held-out batches where there are some (those `--blocks best` chooses on: the matches never
fit them, and they are as many as the choice reads, where the training batches of a learner's start can be
every window of the split), else on the batches the activations are taken on.

Every model is read in its own precision and computed on in float64, as a model read whole into memory at
that precision is (`parts.Served`, the cast `parts.InMemoryParts` makes). Each mean (the target of a match, the
average whose loss is the objective) is formed once per use into a `part_cache.PartCache`, part by part
(`many.MeanParts`): on disk when some model streams from its checkpoint (a `LazyModel`), in memory when all
are in memory already. The matcher reads the target as it reads a checkpoint, and the loss runs the stock
forward block by block on it (`parts_forward.PartsForward`). Held at any time: one part of each model, one
part of the mean, the matcher's streams and statistics or the forward's ends and one block; never a whole
model, whatever the depth. The temporary folder takes one model in float64.

Invariant: the elements and objectives are those of the whole models in memory (the same tensors, in the
same operations), so the merge's outputs do not depend on whether the inputs stream.
"""

from __future__ import annotations

import time

import torch

from ..algebra import groups as G
from ..store.model import as_parts, in_memory
from ..store.parts import Served, part_keys
from .activation_blocks import BLOCKS, per_block
from .many import ROUND_TOL, ManyResult, MeanParts, Step, rounds
from .part_cache import PartCache
from .parts_forward import PartsForward


def _sources(models: list) -> list[Served]:
    """Each model (a `Model`, a `LazyModel`, an expanded one) served part by part in float64."""
    return [Served(m, as_parts(m), G.DTYPE) for m in models]


def _mean(sources: list[Served], elements: list[dict], weights: list[float], keep: list[int], on_disk: bool) -> PartCache:
    """The weighted mean of `g_j·P_j` over `keep`, formed once into a cache (close it when done)."""
    first = sources[0]
    cache = PartCache(part_keys(first.shape), on_disk, strides=True)  # the layouts of the mean in memory
    try:
        return cache.fill(MeanParts(first.spec, sources, elements, weights, keep).part)
    except BaseException:
        cache.close()
        raise


def average_loss(models: list, elements: list[dict], weights: list[float], batches: list[dict],
                 forward: PartsForward | None = None, on_disk: bool | None = None, dtype: torch.dtype | None = None,
                 device=None) -> float:
    """The stock HF loss of the weighted average of `g_i·P_i` on `batches` (mean over batches), streamed;
    `forward` a `PartsForward` of the first model (default: one in `dtype` on `device`, else the CPU in
    float64); `on_disk`: where the average is kept while it runs (None: on disk when some model streams from
    its checkpoint)."""
    sources = _sources(models)
    forward = forward or PartsForward(sources[0], dtype or torch.float64, device)
    on_disk = not all(in_memory(m) for m in models) if on_disk is None else on_disk
    with _mean(sources, elements, weights, list(range(len(models))), on_disk) as mean:
        return forward.mean_loss(mean, batches)


def activation_match_many(models: list, weights: list[float], batches: list[dict], families: list[str] | None = None,
                          max_rounds: int = 10, seed: int = 0, tol: float = ROUND_TOL, progress: bool = False,
                          device=None, dtype: torch.dtype | None = None, on_disk: bool | None = None,
                          blocks: str = BLOCKS[0], held_out: list[dict] | None = None) -> ManyResult:
    """Activation matching of many models (`Model`s or `LazyModel`s of one shape), by the schedule of
    `many.rounds` (see the module docstring). `device`, `dtype`: where the forwards (matching's and the
    objective's) run and their working precision (default: the CPU, float64); the statistics are summed in
    float64. `on_disk`: where each mean is kept (None: on disk when some model streams from its checkpoint).
    `blocks`: how each match's per-block groups are finished (`activation_blocks.BLOCKS`; "best" by the loss of
    the weighted average with the candidate in model i's place). Both that choice and the objective read the
    `held_out` batches, else `batches`."""
    from .activation_stream import activation_match_streaming

    spec = models[0].spec.restricted(families)
    sources = _sources(models)
    on_disk = not all(in_memory(m) for m in models) if on_disk is None else on_disk
    forward = PartsForward(sources[0], dtype or torch.float64, device)

    def match(i, keep, elements, g0):
        t0 = time.perf_counter()
        with _mean(sources, elements, weights, keep, on_disk) as mean:
            target = Served(sources[0], mean)
            res = activation_match_streaming(target, sources[i], batches, families, device=device, forward=dtype)
            res = per_block(target, sources[i], families, res, blocks,
                            lambda g: -value([g if j == i else e for j, e in enumerate(elements)]))
        return Step(res.g, time.perf_counter() - t0)

    choose_on = held_out or batches

    def value(elements):
        with _mean(sources, elements, weights, list(range(len(models))), on_disk) as mean:
            return -forward.mean_loss(mean, choose_on)

    identity = {name: G.identity(grp) for name, grp in spec.groups.items()}
    return rounds(len(models), value, match, identity, max_rounds, seed, tol, progress, "activation merge rounds")
