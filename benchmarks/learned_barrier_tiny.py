"""Barrier before and after learned / dual matching on two tiny GPT-2 trained on Tiny Shakespeare.

Each method runs twice: from the identity, and from the weight-matching solution
(`symmerge.match.weight.weight_match`, all families), as the method intends. The barrier is measured by
main's harness (`symmerge.evaluation.barrier_pair.barrier`, 11 points) on held-out test windows; learning uses the
train split and tracks the validation split.

    python benchmarks/pairs.py gpt2-char-tiny      # the pair: runs/ts-char-tiny-seed{0,1}
    python benchmarks/learned_barrier_tiny.py runs/ts-char-tiny-seed0 runs/ts-char-tiny-seed1 \\
        ../shared/data/tinyshakespeare.txt --steps 1500 --lr 2e-2
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
from symmerge.match.learn_config import LearnConfig
from symmerge.match.learned import learn
from symmerge.match.weight import weight_match
from symmerge.store.model import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--threads", type=int, default=1)
    record.add_argument(ap, "learned_barrier_tiny")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    a, b = load_model(args.a), load_model(args.b)
    train = load_batches(args.a, args.data, "train", batch_size=32, max_batches=200)
    val = load_batches(args.a, args.data, "validation", batch_size=64, max_batches=4)
    test = load_batches(args.a, args.data, "test", batch_size=64, max_batches=8)

    rows = []

    def test_barrier(pa, pb, name="plain averaging", start="-") -> str:
        r = barrier(dataclasses.replace(a, params=pa), dataclasses.replace(b, params=pb), test, points=11, progress=False)
        rows.append([name, start, f"{r['barrier']:.4f}"])
        return f"test barrier {r['barrier']:.4f} (L(0) {r['loss'][0]:.3f}, L(0.5) {r['loss'][5]:.3f}, L(1) {r['loss'][-1]:.3f})"

    print(f"plain averaging: {test_barrier(a.params, b.params)}", flush=True)
    t0 = time.perf_counter()
    wm = weight_match(a.spec, a.params, b.params).g
    seconds = time.perf_counter() - t0
    print(f"weight matching ({seconds:.1f} s): {test_barrier(a.params, apply(b.spec, wm, b.params), 'weight matching')}",
          flush=True)
    for start, init in (("identity", None), ("weight matching", wm)):
        for method in ("learned", "dual"):
            t0 = time.perf_counter()
            cfg = LearnConfig(method=method, steps=args.steps, lr=args.lr, eval_every=50, lam_sampling="uniform",
                              progress=False)
            r = learn(a, b, train, val, cfg, init=init)
            pa = apply(a.spec, r.elements["A"], a.params) if "A" in r.elements else a.params
            pb = apply(b.spec, r.elements["B"], b.params)
            rep = r.report
            print(f"{method} from {start}: {rep['steps']} steps in {time.perf_counter() - t0:.0f} s, validation barrier "
                  f"{rep['barrier_before']:.4f} -> {rep['barrier_after']:.4f} (best step {rep['best_step']}); "
                  f"{test_barrier(pa, pb, method, start)}", flush=True)
    key = f"{Path(args.a).name} vs {Path(args.b).name}, {args.steps} steps, lr {args.lr:g}"
    record.save(args.results, "learned_barrier_tiny", key, key, [record.table(
        "test barrier", ["alignment", "start", f"{args.steps} steps, lr {args.lr:g}"], rows)])


if __name__ == "__main__":
    main()
