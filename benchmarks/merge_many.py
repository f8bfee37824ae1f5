"""Merging many independently trained models (issue 14): average_excess and simplex_barrier of plain
averaging, weight matching and learned/dual matching, and the cost (time and peak memory) of one round of
N-model weight matching against N pairwise weight matchings of the same models, side by side in one run.

    python benchmarks/merge_many.py --models M1 M2 M3 M4 --data PATH --out DIR [--methods weight,learned,dual]
        [--steps 150] [--lr 5e-3] [--learned-steps N] [--learned-lr R] [--batch-size 16] [--train-batches 16] [--test-batches 8]
        [--simplex-points 8] [--also-tol 0] [--memory] [--cost-only] [--json F]

Two models of different widths (a width pair) are expanded into the wider one ("plain" is then the
expanded narrow model averaged without alignment). Everything goes through the library calls the CLI
makes (`registry.align_many`, `merge_models`, `many_barrier`); the barrier is taken on the test split.
Weight matching runs once; its elements are written and learned and dual start from them
(`merge_models(start=...)`).

Cost, in this process, one after the other: N pairwise weight matchings (model i to model i+1, default
families, from the identity, streamed from the checkpoints) against each round of the N-model matching
(streamed too; its target means on disk). `--memory`: the peak resident memory of one pairwise matching
and of the whole N-model matching (every round), each in a fresh subprocess whose peak is reset
(`/proc/self/clear_refs`) once the models are opened, so that what is measured is the matching alone.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import record
import torch


def barrier_row(paths, batches, simplex_points: int) -> dict:
    """`many_barrier` on the test batches, with the standard error of the average's excess taken per batch
    (paired: the endpoints' losses on the same batch subtracted)."""
    from symmerge.evaluation.barrier_many import many_barrier, mix
    from symmerge.evaluation.forward import StockForward, mean_se
    from symmerge.store.model import load_model
    from symmerge.workflows.merge_many import check_models

    models = [load_model(p) for p in paths]
    r = many_barrier(models, batches, points=3, simplex_points=simplex_points, progress=False)
    models, _ = check_models(models, [str(p) for p in paths])
    ev, n = StockForward(models[0]), len(models)
    w = [1.0 / n] * n
    per = [[ev.mean_loss(mix(models, [float(j == i) for j in range(n)]), [b]) for b in batches] for i in range(n)]
    avg = [ev.mean_loss(mix(models, w), [b]) for b in batches]
    excess = [a - math.fsum(wi * per[i][k] for i, wi in enumerate(w)) for k, a in enumerate(avg)]
    out = {k: r[k] for k in ("endpoint_losses", "average_loss", "average_loss_se", "average_excess", "simplex_barrier",
                             "pairwise_max", "average_accuracy", "average_accuracy_drop", "seconds")}
    out["average_excess_paired_se"] = mean_se(excess)
    return out


def pairwise_cost(paths, families: list[str] | None = None) -> dict:
    """N pairwise weight matchings (model i to model i+1, `families` or every default family, from the identity),
    streamed."""
    from symmerge.match.weight import weight_match
    from symmerge.store.model import LazyModel
    from symmerge.workflows.merge_many import check_models

    models, _ = check_models([LazyModel(p) for p in paths], [str(p) for p in paths])  # a width pair: expanded
    fams = families or models[0].spec.default_families()
    t0 = time.perf_counter()
    sweeps = []
    for i in range(len(models)):
        res = weight_match(models[0].spec, models[(i + 1) % len(models)], models[i], fams)
        sweeps.append(len(res.history) - 1)
    return {"seconds": time.perf_counter() - t0, "sweeps": sweeps}


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_child(kind: str, paths: list[str], max_rounds: int) -> None:
    """In a fresh process: open the models, reset the peak, run one pairwise matching (`pairwise`) or the
    N-model matching (`many`), print the resident memory before and the peak (KiB) as JSON."""
    from symmerge.match.many import weight_match_many
    from symmerge.match.weight import weight_match
    from symmerge.store.model import LazyModel
    from symmerge.workflows.merge_many import check_models

    torch.set_num_threads(1)
    models, _ = check_models([LazyModel(p) for p in paths], paths)
    spec = models[0].spec
    fams = spec.default_families()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
    before = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    if kind == "pairwise":
        res = weight_match(spec, models[0], models[1], fams)
        extra = {"sweeps": len(res.history) - 1}
    else:
        res = weight_match_many(spec, models, [1 / len(models)] * len(models), fams, max_rounds=max_rounds)
        extra = {"rounds": len(res.history) - 1}
    print(json.dumps({"kind": kind, "rss_before_kib": before, "peak_kib": _rss_kib("VmHWM"),
                      "seconds": time.perf_counter() - t0, **extra}))


def memory(paths: list[str], max_rounds: int) -> dict:
    out = {}
    for kind in ("pairwise", "many"):
        cmd = [sys.executable, __file__, "--memory-child", kind, "--models", *map(str, paths), "--data", "-", "--out", "-",
               "--max-rounds", str(max_rounds)]
        run = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[kind] = json.loads(run.stdout.strip().splitlines()[-1])
    p, m = out["pairwise"], out["many"]
    out["peak_ratio_many_to_pairwise"] = m["peak_kib"] / p["peak_kib"]
    out["increment_kib"] = {k: out[k]["peak_kib"] - out[k]["rss_before_kib"] for k in ("pairwise", "many")}
    return out


def record_result(args, rows: dict, report: dict) -> None:
    """This run's barriers (and cost, memory) as a record of benchmarks/results/merge_many.json."""
    key = f"{' '.join(Path(m).name for m in args.models)}, methods {args.methods}" + (", cost only" if args.cost_only else "")
    tables = []
    if rows:
        def cell(name):
            r = rows[name]
            ratio = f" ({r['excess_over_plain']:.2f})" if "excess_over_plain" in r else ""
            return (f"{r['average_excess']:.4f} ± {r['average_excess_paired_se']:.4f} / {r['simplex_barrier']:.4f}"
                    f"{ratio}")
        tables.append(record.table("excess ± paired s.e. / simplex barrier (excess ratio to plain)",
                                   ["method", "excess / simplex"], [[m, cell(m)] for m in rows]))
    if "cost" in report:
        c = report["cost"]
        tables.append(record.table("cost of a round", ["N pairwise, s (sweeps)", "round 1, 2, ... s",
                                                       "ratio: round 1 / later rounds", "sweeps per round"], [[
            f"{c['pairwise_n_matchings_seconds']:.2f} ({sum(c['pairwise_sweeps'])})",
            ", ".join(f"{s:.2f}" for s in c["many_round_seconds"]),
            f"{c['ratio_round1']:.2f} / " + ", ".join(f"{s:.2f}" for s in c["ratio_later_rounds"]),
            ", ".join(map(str, c["many_round_sweeps"]))]]))
    if "memory" in report:
        tables.append(record.table("peak resident memory", ["what", "figures"],
                                   [[k, json.dumps(v)] for k, v in report["memory"].items()]))
    record.save(args.results, "merge_many", key, key, tables)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--methods", default="weight,dual")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--learned-steps", type=int, default=None, help="learned: steps (default: --steps)")
    ap.add_argument("--learned-lr", type=float, default=None, help="learned: rate (default: --lr)")
    ap.add_argument("--eval-every", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--train-batches", type=int, default=16)
    ap.add_argument("--val-batches", type=int, default=4)
    ap.add_argument("--test-batches", type=int, default=8)
    ap.add_argument("--simplex-points", type=int, default=8)
    ap.add_argument("--max-rounds", type=int, default=10)
    ap.add_argument("--round-tol", type=float, default=None, help="default: the registry's")
    ap.add_argument("--also-tol", type=float, default=None, help="also a weight row with this --round-tol "
                    "(e.g. 0: every round up to --max-rounds), to see what the stop rule leaves")
    ap.add_argument("--memory", action="store_true", help="also the peak RSS of a pairwise and an N-model matching")
    ap.add_argument("--families", default=None, help="comma-separated families for every method (default: the "
                    "spec's default families)")
    ap.add_argument("--cost-only", action="store_true", help="only the cost of the rounds against N pairwise "
                    "matchings (no barrier rows, nothing written but the JSON)")
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None)
    record.add_argument(ap, "merge_many")
    args = ap.parse_args()
    if args.memory_child:
        return memory_child(args.memory_child, args.models, args.max_rounds)
    torch.set_num_threads(1)

    from symmerge.data.batches import load_batches
    from symmerge.match import registry
    from symmerge.workflows.merge_many import merge_models

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    first = args.models[0]
    test = load_batches(first, args.data, "test", args.batch_size, None, args.test_batches)
    data = registry.Data(load_batches(first, args.data, "train", args.batch_size, None, args.train_batches),
                         load_batches(first, args.data, "validation", args.batch_size, None, args.val_batches))
    rows = {} if args.cost_only else {"plain": barrier_row(args.models, test, args.simplex_points)}
    print("plain", json.dumps(rows.get("plain")), flush=True)
    report = {"models": args.models, "data": args.data, "args": vars(args), "rows": rows, "runs": {}}
    opts = {"max_rounds": args.max_rounds, "round_tol": args.round_tol, "steps": args.steps, "lr": args.lr,
            "val_batches": args.val_batches, "eval_every": args.eval_every}
    weight = None
    for method in ["weight", *(m for m in args.methods.split(",") if m != "weight")]:
        t0 = time.perf_counter()
        if method == "weight":  # timed alone: the rounds, then the pairwise matchings beside them
            from symmerge.store.model import LazyModel
            from symmerge.workflows.merge_many import check_models

            lazy, _ = check_models([LazyModel(p) for p in args.models], list(args.models))
            fams = args.families.split(",") if args.families else lazy[0].spec.default_families()
            weight = registry.align_many("weight", lazy, [1 / len(lazy)] * len(lazy), fams, opts=opts)
            pair = pairwise_cost(args.models, fams)
            rs = weight.figures["round_seconds"]
            report["cost"] = {"pairwise_n_matchings_seconds": pair["seconds"], "pairwise_sweeps": pair["sweeps"],
                              "many_round_seconds": rs, "ratio_round1": rs[0] / pair["seconds"],
                              "ratio_later_rounds": [r / pair["seconds"] for r in rs[1:]],
                              "ratio_mean_later_round": (sum(rs[1:]) / len(rs[1:]) / pair["seconds"]
                                                         if len(rs) > 1 else None),
                              "many_round_sweeps": weight.figures["round_sweeps"]}
            per_sweep = pair["seconds"] / sum(pair["sweeps"])  # one pairwise sweep, streamed
            report["cost"]["ratio_per_sweep"] = [r / max(k, 1) / per_sweep for r, k in zip(rs, weight.figures["round_sweeps"])]
            print("cost", json.dumps(report["cost"]), flush=True)
            report["runs"]["weight"] = {k: weight.figures[k] for k in ("objective", "rounds", "converged", "round_tol")}
            if args.cost_only:
                break
        own = {**opts, **({"steps": args.learned_steps or args.steps, "lr": args.learned_lr or args.lr}
                          if method == "learned" else {})}
        rep = merge_models(args.models, out / f"{method}-merged", method=method, aligned=out / f"{method}-aligned",
                           families=args.families.split(",") if args.families else "default", force=True, opts=own,
                           data=data, start=weight)
        aligned = [out / f"{method}-aligned" / str(i + 1) for i in range(len(args.models))]
        rows[method] = barrier_row(aligned, test, args.simplex_points)
        keep = ("objective", "rounds", "converged", "round_tol", "seconds", "round_seconds", "updates_not_kept",
                "objective_before", "objective_after", "best_step", "gauge", "expanded", "time_s", "settings")
        report["runs"][method] = {k: rep[k] for k in keep if k in rep}
        report["runs"][method]["wall_s"] = time.perf_counter() - t0
        if "history" in rep:
            report["runs"][method]["validation_history"] = [(h["step"], h["objective"]) for h in rep["history"]]
        print(method, json.dumps(rows[method]), json.dumps(report["runs"][method]), flush=True)
    if args.also_tol is not None:  # the stop rule against more rounds: the same merge, another tolerance
        name = f"weight_tol{args.also_tol:g}"
        rep = merge_models(args.models, out / f"{name}-merged", aligned=out / f"{name}-aligned", force=True,
                           opts={**opts, "round_tol": args.also_tol})
        rows[name] = barrier_row([out / f"{name}-aligned" / str(i + 1) for i in range(len(args.models))], test,
                                 args.simplex_points)
        report["runs"][name] = {k: rep[k] for k in ("objective", "rounds", "converged", "round_tol", "round_seconds")}
        print(name, json.dumps(rows[name]), json.dumps(report["runs"][name]), flush=True)
    if args.memory:
        report["memory"] = memory(args.models, args.max_rounds)
        print("memory", json.dumps(report["memory"]), flush=True)
    for method in rows:
        if method != "plain":
            rows[method]["excess_over_plain"] = rows[method]["average_excess"] / rows["plain"]["average_excess"]
            rows[method]["simplex_over_plain"] = rows[method]["simplex_barrier"] / rows["plain"]["simplex_barrier"]
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    record_result(args, rows, report)
    print(json.dumps({m: (r["average_excess"], r["simplex_barrier"]) for m, r in rows.items()}))


if __name__ == "__main__":
    main()
