"""Whether weight matching's failure on a width pair lies in the expansion or in the pair: weight matching of two
narrow models at their own width, of the same two expanded into a wide config, and of the first narrow model into
a model trained at that width.

    PYTHONPATH=src python benchmarks/width_weight_control.py NARROW NARROW2 WIDE DATA [--batch-size 64] [--max-batches 156]

Rows (each: the 11-point test-loss barrier of the identity and of `weight_match`'s element over the default
families from the identity, as `symmerge align --method weight` finds it, their ratio, and weight matching's
objective `1 - ||A - g.B||^2 / ||A||^2`):

- NARROW and NARROW2 at their width: what weight matching does on a pair of that recipe;
- the expansions of NARROW and NARROW2 into WIDE's config (`store.expansion.widest`, as `align` expands): both
  compute their narrow functions exactly, in a d-dimensional subspace of the wide residual stream with zero
  padded units and head dimensions. Weight matching sees the wide shape, the expansion's reader and writer
  scales and every padded slot; if its ratio stays near the first row's, none of these is what fails;
- NARROW into WIDE (the width pair `align` is given): the identity here is the bare expansion.

Where the second row keeps the first row's ratio and the third does not, what weight matching cannot align is
the trained wide model's use of the extra width, not the expansion (docs/limitations.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import record
import torch

from symmerge.algebra.elements import identity_element
from symmerge.data.batches import load_batches
from symmerge.evaluation.barrier_pair import barrier
from symmerge.match.weight import weight_match
from symmerge.store.expansion import widest
from symmerge.store.model import load_model

COLUMNS = ["pair", "identity", "weight matching", "weight / identity", "weight similarity"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("narrow", "narrow2", "wide", "data"):
        ap.add_argument(name)
    for flag, default in (("--batch-size", 64), ("--max-batches", 156), ("--threads", 1)):
        ap.add_argument(flag, type=int, default=default)
    record.add_argument(ap, "width_weight_control")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    test = load_batches(args.wide, args.data, "test", batch_size=args.batch_size, max_batches=args.max_batches)
    n1, n2 = Path(args.narrow).name, Path(args.narrow2).name
    wide, narrow, narrow2 = load_model(args.wide), load_model(args.narrow), load_model(args.narrow2)
    expanded, expanded2 = widest(wide, narrow, "WIDE", "NARROW")[1], widest(wide, narrow2, "WIDE", "NARROW2")[1]
    pairs = [(f"{n1} and {n2}", narrow, narrow2),
             (f"{n1} and {n2}, both expanded into {Path(args.wide).name}'s config", expanded, expanded2),
             (f"{n1} into {Path(args.wide).name}", expanded, wide)]
    rows = []
    for name, a, b in pairs:
        spec = b.spec
        plain = barrier(a, b.moved(identity_element(spec)), test, points=11, progress=False)["barrier"]
        found = weight_match(spec, a.params, b.params, spec.default_families())
        wm = barrier(a, b.moved(found.g), test, points=11, progress=False)["barrier"]
        rows.append([name, f"{plain:.4f}", f"{wm:.4f}", f"{wm / plain:.3f}", f"{found.history[-1]:.3f}"])
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
    key = f"{n1} and {n2} into {Path(args.wide).name}"
    record.save(args.results, "width_weight_control", key, f"{key}, {len(test)} test batches of {args.batch_size}",
                [record.table("weight matching with and without the width", COLUMNS, rows)],
                notes="test-loss barriers per image, 11 points; weight matching over the default families from the "
                      "identity")


if __name__ == "__main__":
    main()
