"""Why weight matching leaves most of a width pair's barrier: the weight-space similarity and the test barrier
of weight matching's element against those of a dual run's element, and of weight matching started from the
dual element (each family alone, then all of them).

    PYTHONPATH=src python benchmarks/width_weight_diagnosis.py NARROW WIDE DUAL DATA [--batch-size 64] [--max-batches 156]

NARROW is expanded into WIDE's config (`store.expansion`, as `align` does); DUAL is the output folder of
`symmerge align NARROW WIDE --method dual` (its A and B: the expansion and WIDE, each under its own element;
the barrier and the similarity depend only on B's element relative to A's, since every element acts linearly
on the parameters). The similarity is weight matching's objective, `1 - ||A - g.B||^2 / ||A||^2` over the
canonical tensors, for the element as found (no sweep). "started from the dual element" runs weight matching
(at most `--sweeps` sweeps) over one family, or over the default families, from the dual pair. The barrier
is the 11-point test-loss barrier of `symmerge.evaluation.barrier_pair.barrier` on the same test batches
for every row. Where weight matching's sweeps raise the dual element's similarity and its barrier with it,
the weight-space objective and the function disagree on this pair.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import record
import torch

from symmerge.algebra.elements import identity_element
from symmerge.data.batches import load_batches
from symmerge.evaluation.barrier_pair import barrier
from symmerge.match.weight import weight_match
from symmerge.match.weight_state import State
from symmerge.store.expansion import widest
from symmerge.store.model import load_model

COLUMNS = ["element", "weight similarity", "barrier", "at λ", "seconds"]


def float64(params: dict) -> dict:
    return {k: v.double() for k, v in params.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("narrow", "wide", "dual", "data"):
        ap.add_argument(name)
    for flag, default in (("--batch-size", 64), ("--max-batches", 156), ("--sweeps", 3), ("--threads", 1)):
        ap.add_argument(flag, type=int, default=default)
    record.add_argument(ap, "width_weight_diagnosis")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    wide, narrow = widest(load_model(args.wide), load_model(args.narrow), "WIDE", "NARROW")
    da, db = load_model(Path(args.dual) / "A"), load_model(Path(args.dual) / "B")
    test = load_batches(args.wide, args.data, "test", batch_size=args.batch_size, max_batches=args.max_batches)
    spec, fams = wide.spec, wide.spec.default_families()
    identity = identity_element(spec)
    rows = []

    def row(name, a, b, g, seconds=0.0):
        moved = b.moved(g)
        similarity = State(spec, float64(a.params), float64(moved.params), identity).similarity()  # weight matching's objective
        r = barrier(a, moved, test, points=11, progress=False)
        rows.append([name, f"{similarity:.3f}", f"{r['barrier']:.4f}", f"{r['barrier_lambda']:.1f}", f"{seconds:.1f}"])
        print("| " + " | ".join(rows[-1]) + " |", flush=True)

    print(f"NARROW={args.narrow} WIDE={args.wide}: {len(test)} test batches of {args.batch_size}")
    print("| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|")
    row("the bare expansion (identity)", narrow, wide, identity)
    t0 = time.perf_counter()
    wm = weight_match(spec, narrow.params, wide.params, fams).g
    row("weight matching", narrow, wide, wm, time.perf_counter() - t0)
    row("the dual run's element", da, db, identity)
    for fam in [*fams, None]:
        t0 = time.perf_counter()
        g = weight_match(spec, da.params, db.params, [fam] if fam else fams, g0=identity, max_iters=args.sweeps).g
        what = fam or "every default family"
        row(f"weight matching from the dual element: {what}, {args.sweeps} sweeps", da, db, g, time.perf_counter() - t0)
    key = f"{Path(args.narrow).name} into {Path(args.wide).name}"
    title = f"{key}, {len(test)} test batches of {args.batch_size}"
    record.save(args.results, "width_weight_diagnosis", key, title, [record.table("test barrier", COLUMNS, rows)],
                notes=f"dual element from {record.portable(args.dual)}")


if __name__ == "__main__":
    main()
