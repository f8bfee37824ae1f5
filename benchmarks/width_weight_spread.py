"""How much of a width pair's barrier weight matching leaves depends on the pair, and its objective does not rank
its own local minima: weight matching of several narrow models into one wide model, then of the first narrow
model again from random starting elements.

    PYTHONPATH=src python benchmarks/width_weight_spread.py WIDE DATA NARROW [NARROW ...] [--restarts 6]

Each NARROW is expanded into WIDE's config (`store.expansion.widest`, as `align` does) and matched by
`weight_match` over the default families from the identity, as `symmerge align --method weight` does; the
table gives the 11-point test-loss barrier of the bare expansion (the identity) and of weight matching's
element, their ratio and weight matching's objective (`1 - ||A - g.B||^2 / ||A||^2`, higher is closer).
The restarts run weight matching on the first NARROW from `random_element` over the residual rotation and the
head and FFN permutations (generator seeds 0, 1, ...). Where the restarts' objectives lie close together and
their barriers far apart, no better minimum of the weight-space objective would be a better alignment of
that pair; where the ratio differs widely across narrow seeds, one pair's figure is not the method's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import record
import torch

from symmerge.algebra.elements import identity_element, random_element
from symmerge.algebra.spec import FFN_PERM, HEAD_PERM, RESIDUAL_ROTATION
from symmerge.data.batches import load_batches
from symmerge.evaluation.barrier_pair import barrier
from symmerge.match.weight import weight_match
from symmerge.store.expansion import widest
from symmerge.store.model import load_model

PAIRS = ["narrow", "bare expansion", "weight matching", "weight / bare", "weight similarity"]
RESTARTS = ["start", "weight similarity", "barrier", "weight / bare"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wide")
    ap.add_argument("data")
    ap.add_argument("narrow", nargs="+")
    for flag, default in (("--batch-size", 64), ("--max-batches", 156), ("--restarts", 6), ("--threads", 1)):
        ap.add_argument(flag, type=int, default=default)
    record.add_argument(ap, "width_weight_spread")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    test = load_batches(args.wide, args.data, "test", batch_size=args.batch_size, max_batches=args.max_batches)

    def loss_barrier(a, b, g) -> float:
        return barrier(a, b.moved(g), test, points=11, progress=False)["barrier"]

    pairs, restarts = [], []
    for i, path in enumerate(args.narrow):
        wide, narrow = widest(load_model(args.wide), load_model(path), "WIDE", "NARROW")
        spec = wide.spec
        families = spec.default_families()
        bare = loss_barrier(narrow, wide, identity_element(spec))
        found = weight_match(spec, narrow.params, wide.params, families)
        wm = loss_barrier(narrow, wide, found.g)
        pairs.append([Path(path).name, f"{bare:.4f}", f"{wm:.4f}", f"{wm / bare:.3f}", f"{found.history[-1]:.3f}"])
        print("| " + " | ".join(pairs[-1]) + " |", flush=True)
        if i:
            continue
        restarts.append(["the identity (as align does)", f"{found.history[-1]:.3f}", f"{wm:.4f}", f"{wm / bare:.3f}"])
        for seed in range(args.restarts):
            g0 = random_element(spec, torch.Generator().manual_seed(seed), [RESIDUAL_ROTATION, HEAD_PERM, FFN_PERM])
            again = weight_match(spec, narrow.params, wide.params, families, g0=g0)
            b = loss_barrier(narrow, wide, again.g)
            restarts.append([f"random element, seed {seed}", f"{again.history[-1]:.3f}", f"{b:.4f}", f"{b / bare:.3f}"])
            print("| " + " | ".join(restarts[-1]) + " |", flush=True)
    key = f"into {Path(args.wide).name}"
    title = f"{len(args.narrow)} narrow models into {Path(args.wide).name}, {len(test)} test batches of {args.batch_size}"
    record.save(args.results, "width_weight_spread", key, title,
                [record.table("weight matching of each narrow model", PAIRS, pairs),
                 record.table(f"weight matching of {Path(args.narrow[0]).name} from other starts", RESTARTS, restarts)],
                notes="test-loss barriers per image, 11 points; weight matching over the default families")


if __name__ == "__main__":
    main()
