"""Where a learned path's barrier lives: the same aligned pair's barrier on training, held-out validation
and test data.

    PYTHONPATH=src python benchmarks/barrier_by_split.py A B DATA [--row dual] [--seed 0] [--steps 1600]
        [--lr 5e-3] [--lam-range 0.4,0.6] [--lam-sampling uniform] [--val-points 5] [--batch-size 64]
        [--train-batches 400] [--val-batches 16] [--eval-batches 140]

Learns one `reproduction_table.py` row exactly as that script does (same seed, data and settings give
the same elements), then measures the 11-point barrier on three sets of `--eval-batches` batches:
the first training batches the elements were learned on, validation batches after the first
`--val-batches` (which chose the best state, so they are excluded), and the test split. A barrier that
is zero on training and held-out validation data but not on test says the test split differs from
the data the path was fitted on, not that the elements overfit their batches.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import record
import torch
from reproduction_table import ROWS, families_for, learn_row, path_barrier, weight_start

from symmerge.data.batches import load_batches
from symmerge.evaluation.forward import StockForward
from symmerge.match.learn_config import LAM_SAMPLING
from symmerge.store.model import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("data")
    ap.add_argument("--row", default="dual", choices=[k for k, v in ROWS.items() if v[1] in ("learned", "dual")])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1600)
    ap.add_argument("--lr", type=float, default=5e-3, help="the row's learning rate")
    ap.add_argument("--lam-range", default="0.4,0.6")
    ap.add_argument("--lam-sampling", choices=LAM_SAMPLING, default="uniform")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--val-points", type=int, default=5, help="λ grid of the validation barrier (endpoints included)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--train-batches", type=int, default=400)
    ap.add_argument("--val-batches", type=int, default=16, help="validation batches that choose the best state")
    ap.add_argument("--eval-batches", type=int, default=140, help="batches per split for the barriers")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="append the result as one JSON line here")
    record.add_argument(ap, "barrier_by_split")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    a, b = load_model(args.a), load_model(args.b)
    bs, k = args.batch_size, args.eval_batches
    train = load_batches(args.a, args.data, "train", batch_size=bs, max_batches=args.train_batches)
    val_all = load_batches(args.a, args.data, "validation", batch_size=bs, max_batches=args.val_batches + k)
    val, held_out = val_all[:args.val_batches], val_all[args.val_batches:]
    test = load_batches(args.a, args.data, "test", batch_size=bs, max_batches=k)
    if len(held_out) < k or len(train) < k:
        raise SystemExit(f"not enough data for {k} evaluation batches of {bs} in every split; lower --eval-batches")

    _, _, drop, add, _ = ROWS[args.row]
    fams = families_for(b.spec, drop, add)
    pa, pb, r = learn_row(args, args.row, args.seed, args.lr, a, b, fams, weight_start(a, b, fams), train, val)
    evaluator = StockForward(a)
    out = {"row": args.row, "seed": args.seed, "args": vars(args), "validation_barrier_used": r.report["barrier_after"]}
    print(f"{args.row}, seed {args.seed}: validation barrier (the {args.val_batches} choosing batches) "
          f"{r.report['barrier_before']:.4f} -> {r.report['barrier_after']:.4f}")
    print("| split | barrier ± s.e. | peak λ | L(0) | L(0.5) | L(1) |\n|---|---|---|---|---|---|")
    rows = []
    for name, batches in (("train (learned on)", train[:k]), ("validation, held out", held_out), ("test", test)):
        res = path_barrier(evaluator, pa, pb, batches)
        out[name] = {key: res[key] for key in ("barrier", "barrier_se", "barrier_lambda", "loss")}
        rows.append([name, f"{res['barrier']:.4f} ± {res['barrier_se']:.4f}", f"{res['barrier_lambda']:.1f}",
                     f"{res['loss'][0]:.4f}", f"{res['loss'][5]:.4f}", f"{res['loss'][-1]:.4f}"])
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
    key = f"{Path(args.a).name} vs {Path(args.b).name}, {args.row}, seed {args.seed}, λ {args.lam_range}"
    record.save(args.results, "barrier_by_split", key, key, [record.table(
        "barrier by split", ["split", "barrier ± s.e.", "peak λ", "L(0)", "L(0.5)", "L(1)"], rows)],
        f"validation barrier on the {args.val_batches} choosing batches {r.report['barrier_before']:.4f} -> "
        f"{r.report['barrier_after']:.4f}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(out, default=str) + "\n")


if __name__ == "__main__":
    main()
