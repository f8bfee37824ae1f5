"""Which family makes activation matching trail weight matching: the barrier of weight matching's element with
one family at a time taken from activation matching's, and of each method's groups re-solved by the other.

    PYTHONPATH=src python benchmarks/activation_diagnosis.py A B DATA [--batch-size 16] [--max-batches 16]

Both elements are over every family but the residual scale (the CLI default). Families are swapped whole:
"FFN" is the FFN permutation with the GLU scale, "heads" the head and query-head permutations with the QK
and OV maps (the maps are indexed by the head permutation, so they only make sense with it). "weight
matching given X" runs weight matching (at most 20 sweeps) over the other families from activation
matching's element, X held fixed. Activation matching reads `--act-batches` training batches of the same
size; the barrier is the 11-point test-loss barrier of `symmerge.evaluation.barrier_pair.barrier` on the
same test batches for every row. The last row is what `align --method activation` keeps by default (`--blocks
best`: of the rows "weight matching given activation matching's residual rotation", "... started from
activation matching" and "weight matching", the one whose midpoint has the lowest loss on as many validation
batches).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import record
import torch

from symmerge.algebra.elements import identity_element
from symmerge.algebra.families import FFN_PERM, GLU_SCALE, HEAD_CIRCUIT, RESIDUAL_ROTATION
from symmerge.data.batches import load_batches
from symmerge.evaluation.barrier_pair import barrier
from symmerge.match.activation import activation_match
from symmerge.match.activation_blocks import per_block
from symmerge.match.activation_many import average_loss
from symmerge.match.weight import weight_match
from symmerge.store.model import load_model

PARTS = {"residual rotation": {RESIDUAL_ROTATION}, "FFN": {FFN_PERM, GLU_SCALE},
         "heads": set(HEAD_CIRCUIT)}
COLUMNS = ["element", "barrier", "acc. barrier", "L(0.5)", "seconds"]


def families_of(spec, kinds: set[str]) -> set[str]:
    """The groups whose family is one of `kinds`."""
    return {n for n, g in spec.groups.items() if g.family in kinds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("a", "b", "data"):
        ap.add_argument(name)
    for flag, default in (("--batch-size", 16), ("--max-batches", 16), ("--act-batches", 8), ("--threads", 1)):
        ap.add_argument(flag, type=int, default=default)
    record.add_argument(ap, "activation_diagnosis")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    a, b = load_model(args.a), load_model(args.b)
    test = load_batches(args.a, args.data, "test", batch_size=args.batch_size, max_batches=args.max_batches)
    train = load_batches(args.a, args.data, "train", batch_size=args.batch_size, max_batches=args.act_batches)
    spec, fams = b.spec, b.spec.default_families()
    rows = []

    def row(name, g, seconds=0.0):
        r = barrier(a, b.moved(g), test, points=11, progress=False)
        rows.append([name, f"{r['barrier']:.4f}", f"{r['accuracy_barrier']:.4f}", f"{r['loss'][5]:.3f}",
                     f"{seconds:.1f}"])
        print("| " + " | ".join(rows[-1]) + " |", flush=True)

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0

    print(f"A={args.a} B={args.b}: {len(test)} test batches of {args.batch_size}")
    print("| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|")
    wm, s = timed(lambda: weight_match(spec, a.params, b.params, fams, max_iters=20).g)
    row("weight matching", wm, s)
    am, s = timed(lambda: activation_match(a, b, train, fams).g)
    row("activation matching", am, s)
    for part, kinds in PARTS.items():
        names = families_of(spec, kinds)
        row(f"weight matching, {part} from activation matching", {n: (am[n] if n in names else wm[n]) for n in wm})
    rot = families_of(spec, PARTS["residual rotation"])
    row("activation matching, residual rotation from weight matching", {n: (wm[n] if n in rot else am[n]) for n in am})
    for part in PARTS:
        held = families_of(spec, PARTS[part])
        free = [f for f in fams if not families_of(spec, {f}) <= held]
        g, s = timed(lambda free=free: weight_match(spec, a.params, b.params, free, max_iters=20, g0=am).g)
        row(f"weight matching given activation matching's {part}", g, s)
    g, s = timed(lambda: weight_match(spec, a.params, b.params, fams, max_iters=20, g0=am).g)
    row("weight matching started from activation matching", g, s)
    identity = identity_element(spec)
    held = load_batches(args.a, args.data, "validation", batch_size=args.batch_size, max_batches=args.act_batches)
    chosen, s = timed(lambda: per_block(a, b, fams, activation_match(a, b, train, fams), "best",
                                        lambda g: average_loss([a, b], [identity, g], [0.5, 0.5], held)))
    row(f"the default (--blocks best): {chosen.extra['blocks_kept']}", chosen.g, s)
    key = f"{Path(args.a).name} vs {Path(args.b).name}"
    title = f"{key}, {len(test)} test batches of {args.batch_size}, activation matching on {len(train)} training batches"
    record.save(args.results, "activation_diagnosis", key, title, [record.table("test barrier", COLUMNS, rows)])


if __name__ == "__main__":
    main()
