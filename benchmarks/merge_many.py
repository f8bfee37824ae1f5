"""Merging many independently trained models (issue 14): average_excess and simplex_barrier of plain
averaging, weight matching and learned/dual matching, and the cost of one round of N-model weight matching
against N pairwise weight matchings of the same models, side by side in one run.

    python benchmarks/merge_many.py --models M1 M2 M3 M4 --data PATH --out DIR [--methods weight,dual]
        [--steps 150] [--batch-size 16] [--test-batches 8] [--simplex-points 8] [--json F]

Two models of different widths (a width pair) are expanded into the wider one ("plain" is then the
expanded narrow model averaged without alignment). Everything goes through the library calls the CLI
makes (`merge_models`, `many_barrier`); the barrier is taken on the test split.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def barrier_row(paths, batches, simplex_points: int) -> dict:
    from symmerge.barrier_many import many_barrier
    from symmerge.model import load_model

    r = many_barrier([load_model(p) for p in paths], batches, points=3, simplex_points=simplex_points, progress=False)
    return {k: r[k] for k in ("endpoint_losses", "average_loss", "average_loss_se", "average_excess", "simplex_barrier",
                              "pairwise_max", "average_accuracy_drop", "seconds")}


def pairwise_cost(paths) -> dict:
    """N pairwise weight matchings (model i to model i+1, every default family, from the identity), streamed."""
    from symmerge.match.weight import weight_match
    from symmerge.model import LazyModel

    models = [LazyModel(p) for p in paths]
    fams = models[0].spec.default_families()
    t0 = time.perf_counter()
    sweeps = []
    for i in range(len(models)):
        res = weight_match(models[0].spec, models[(i + 1) % len(models)], models[i], fams)
        sweeps.append(len(res.history) - 1)
    return {"seconds": time.perf_counter() - t0, "iterations": sweeps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--methods", default="weight,dual")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--train-batches", type=int, default=16)
    ap.add_argument("--val-batches", type=int, default=4)
    ap.add_argument("--test-batches", type=int, default=8)
    ap.add_argument("--simplex-points", type=int, default=8)
    ap.add_argument("--max-rounds", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)

    from symmerge.data import load_batches
    from symmerge.match.registry import Data
    from symmerge.merge_many import merge_models

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    first = args.models[0]
    test = load_batches(first, args.data, "test", args.batch_size, None, args.test_batches)
    data = Data(load_batches(first, args.data, "train", args.batch_size, None, args.train_batches),
                load_batches(first, args.data, "validation", args.batch_size, None, args.val_batches))
    rows = {"plain": barrier_row(args.models, test, args.simplex_points)}
    print("plain", json.dumps(rows["plain"]), flush=True)
    report = {"models": args.models, "data": args.data, "rows": rows, "runs": {}}
    for method in args.methods.split(","):
        opts = {"max_rounds": args.max_rounds, "steps": args.steps, "lr": args.lr, "val_batches": args.val_batches}
        rep = merge_models(args.models, out / f"{method}-merged", method=method, aligned=out / f"{method}-aligned",
                           force=True, opts=opts, data=data)
        aligned = [out / f"{method}-aligned" / str(i + 1) for i in range(len(args.models))]
        rows[method] = barrier_row(aligned, test, args.simplex_points)
        keep = ("objective", "rounds", "seconds", "round_seconds", "updates_not_kept", "objective_before",
                "objective_after", "best_step", "gauge", "expanded")
        report["runs"][method] = {k: rep[k] for k in keep if k in rep}
        if "weight_matching" in rep:
            report["runs"][method]["weight_matching"] = {k: rep["weight_matching"][k]
                                                         for k in ("rounds", "seconds", "round_seconds")}
        print(method, json.dumps(rows[method]), json.dumps(report["runs"][method]), flush=True)
        if method == "weight":  # cost: one round of N-model matching vs N pairwise matchings, same process
            pair = pairwise_cost(args.models)
            rounds = rep["round_seconds"]
            report["cost"] = {"pairwise_n_matchings_seconds": pair["seconds"], "pairwise_iterations": pair["iterations"],
                              "many_round_seconds": rounds,
                              "ratio_round2_to_pairwise": rounds[1] / pair["seconds"] if len(rounds) > 1 else None,
                              "ratio_round1_to_pairwise": rounds[0] / pair["seconds"]}
            print("cost", json.dumps(report["cost"]), flush=True)
    for method in rows:
        if method != "plain":
            rows[method]["excess_over_plain"] = rows[method]["average_excess"] / rows["plain"]["average_excess"]
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(json.dumps({m: (r["average_excess"], r["simplex_barrier"]) for m, r in rows.items()}))


if __name__ == "__main__":
    main()
