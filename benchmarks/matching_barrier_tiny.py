"""Barrier before and after weight / activation matching on two tiny GPT-2 trained on Tiny Shakespeare.

Same models, data and barrier harness as `learned_barrier_tiny.py` (train them with the commands in
its docstring); here B is aligned to A by `weight_match` (data-free) and by `activation_match`
(train windows), over all groups and over permutations only, and the 11-point loss barrier of the
linear path A -> g·B is measured on held-out test windows.

    python benchmarks/matching_barrier_tiny.py runs/ts-char-tiny-seed0 runs/ts-char-tiny-seed1 ../shared/data/tinyshakespeare.txt
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("data")
    ap.add_argument("--threads", type=int, default=1)
    record.add_argument(ap, "matching_barrier_tiny")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    a, b = load_model(args.a), load_model(args.b)
    train = load_batches(args.a, args.data, "train", batch_size=32, max_batches=8)
    test = load_batches(args.a, args.data, "test", batch_size=64, max_batches=8)

    rows = []

    def test_barrier(pb, name="plain averaging", groups="-", seconds="-", similarity="-") -> str:
        r = barrier(a, dataclasses.replace(b, params=pb), test, points=11, progress=False)
        rows.append([name, groups, seconds, similarity, f"{r['barrier']:.4f}", f"{r['loss'][5]:.3f}"])
        return f"test barrier {r['barrier']:.4f} (L(0) {r['loss'][0]:.3f}, L(0.5) {r['loss'][5]:.3f}, L(1) {r['loss'][-1]:.3f})"

    print(f"plain averaging: {test_barrier(b.params)}", flush=True)
    perms = ["head_perm", "ffn_perm"]
    for name, fams in (("all groups", None), ("permutations", perms)):
        t0 = time.perf_counter()
        r = weight_match(b.spec, a.params, b.params, fams, max_iters=20)
        print(f"weight matching, {name}: {len(r.history) - 1} sweeps, {time.perf_counter() - t0:.1f} s, similarity "
              f"{r.history[0]:.4f} -> {r.history[-1]:.4f}; "
              + test_barrier(apply(b.spec, r.g, b.params), f"weight matching ({len(r.history) - 1} sweeps)", name,
                             f"{time.perf_counter() - t0:.1f} s", f"{r.history[-1]:.4f}"), flush=True)
        t0 = time.perf_counter()
        r = activation_match(a, b, train, fams)
        seconds = f"{time.perf_counter() - t0:.1f} s"
        print(f"activation matching, {name}: {seconds}, {r.extra['fit'].get('tokens')} tokens, weight similarity "
              f"{r.history[-1]:.4f}; "
              + test_barrier(apply(b.spec, r.g, b.params), "activation matching", name, seconds, f"{r.history[-1]:.4f}"),
              flush=True)
    key = f"{Path(args.a).name} vs {Path(args.b).name}"
    record.save(args.results, "matching_barrier_tiny", key, key, [record.table(
        "barriers", ["alignment", "groups", "time", "weight similarity", "test barrier", "L(0.5)"], rows)])


if __name__ == "__main__":
    main()
