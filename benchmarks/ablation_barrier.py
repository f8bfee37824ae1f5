"""Test-loss barrier of plain averaging, weight matching (all groups, and with each group switched off)
and activation matching, for one independently trained pair.

    PYTHONPATH=src python benchmarks/ablation_barrier.py A B DATA [--batch-size 8] [--max-batches 8]

Weight matching runs over every family but the residual scale (the CLI default; see
pair.py) unless a row says otherwise; a model with SwiGLU (a `glu_scale` family) gets a
"GLU scaling off" row too. The barrier is the 11-point test-loss barrier of
`symmerge.evaluation.barrier_pair.barrier` on the same test batches for every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import record
import torch

from symmerge.algebra.apply import apply
from symmerge.data.batches import load_batches
from symmerge.evaluation.barrier_pair import barrier
from symmerge.match.activation import activation_match
from symmerge.match.weight import weight_match
from symmerge.store.model import load_model

OFF = {"FFN permutation off": ["ffn_perm"], "head permutation off": ["head_perm"],
       "head-internal maps off": ["qk_map", "ov_map"], "residual rotation off": ["residual_rotation"],
       "GLU scaling off": ["glu_scale"]}


COLUMNS = ["alignment", "barrier", "acc. barrier", "L(0)", "L(0.5)", "L(1)", "matching s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("data")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-batches", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-activation", action="store_true")
    ap.add_argument("--activation-only", action="store_true", help="only the plain-averaging and activation rows")
    record.add_argument(ap, "ablation_barrier")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    a, b = load_model(args.a), load_model(args.b)
    test = load_batches(args.a, args.data, "test", batch_size=args.batch_size, max_batches=args.max_batches)
    default = b.spec.default_families()
    rows = []

    def row(name, pb, seconds=0.0):
        r = barrier(a, dataclasses.replace(b, params=pb), test, points=11, progress=False)
        rows.append([name, f"{r['barrier']:.4f}", f"{r['accuracy_barrier']:.4f}", f"{r['loss'][0]:.3f}",
                     f"{r['loss'][5]:.3f}", f"{r['loss'][-1]:.3f}", f"{seconds:.1f}"])
        print("| " + " | ".join(rows[-1]) + " |", flush=True)

    print(f"A={args.a} B={args.b} data={args.data}: {len(test)} test batches of {args.batch_size}")
    print("| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|")
    row("plain averaging", b.params)
    runs = [("weight matching (all but scale)", default), ("weight matching, all incl. residual scale", None)]
    runs += [(f"weight matching, {k}", [f for f in default if f not in v]) for k, v in OFF.items()
             if any(f in default for f in v)]
    for name, fams in [] if args.activation_only else runs:
        t0 = time.perf_counter()
        r = weight_match(b.spec, a.params, b.params, fams, max_iters=20)
        row(name, apply(b.spec, r.g, b.params), time.perf_counter() - t0)
    if not args.no_activation:
        train = load_batches(args.a, args.data, "train", batch_size=args.batch_size, max_batches=8)
        t0 = time.perf_counter()
        r = activation_match(a, b, train, default)
        row("activation matching (all but scale)", apply(b.spec, r.g, b.params), time.perf_counter() - t0)
    key = f"{Path(args.a).name} vs {Path(args.b).name}, {len(test)} test batches of {args.batch_size}"
    record.save(args.results, "ablation_barrier", key, key, [record.table("test barrier", COLUMNS, rows)])


if __name__ == "__main__":
    main()
