"""Does the validation barrier rank a run's candidate states as unseen data does?

A dual run on a trained pair (seeds 0 and 1 of a `pairs.py` name) evaluates its path every `--eval-every`
steps on the validation batches and keeps the best state. Here every such evaluation is also made on the
test split (the same objective: the 11-point barrier above the straight line, on `--test-batches` batches of
16 windows), so each candidate state has both figures. The record gives the Spearman rank correlation of the
two over the candidates, the test barrier of the state validation chose and the lowest test barrier of any
candidate (the chooser's regret), for the validation split of `--data` and, with `--val-data`, for another
file. The run is the library's own (`symmerge.api.align`, in memory); only the evaluation is observed.

    python benchmarks/pairs.py neox-char-demo
    python benchmarks/validation_ranking.py neox-char-demo --steps 1200 --eval-every 75
"""

from __future__ import annotations

import argparse
import time

import pairs
import record

from symmerge.api import align
from symmerge.data.batches import load_batches
from symmerge.match import learn_loop
from symmerge.match.options import DualOptions

COLUMNS = ["validation data", "candidates", "Spearman ρ (validation, test)", "test barrier of the chosen state",
           "lowest test barrier", "regret", "chosen step", "seconds"]


def ranks(xs: list[float]) -> list[float]:
    """Average ranks (ties share their mean rank)."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else float("nan")


def observed_run(a: str, b: str, data: str, test: list[dict], options: DualOptions) -> tuple[list[dict], int]:
    """Run dual matching; every validation also scored on `test`: [{step, validation, test}], the chosen step."""
    seen: list[dict] = []
    real = learn_loop.Run._evaluate
    test_ends: dict[str, list[float]] = {}

    def evaluate(self, step: int) -> None:
        real(self, step)
        obj = self.objective
        if "ends" not in test_ends:
            test_ends["ends"] = self.group.curve(self.learner, test, obj.ends)
        entry = obj.entry(test_ends["ends"], self.group.curve(self.learner, test, obj.inner))
        seen.append({"step": step, "validation": obj.value(self.meta["history"][-1]), "test": obj.value(entry)})

    learn_loop.Run._evaluate = evaluate
    try:
        result = align(a, b, method="dual", options=options, data=data, progress=False)
    finally:
        learn_loop.Run._evaluate = real
    return seen, result.report["best_step"]


def row(label: str, seen: list[dict], chosen: int, seconds: float) -> list[str]:
    ok = [s for s in seen if s["validation"] is not None and s["test"] is not None]
    pick = next(s for s in seen if s["step"] == chosen)
    low = min(s["test"] for s in ok)
    rho = spearman([s["validation"] for s in ok], [s["test"] for s in ok])
    return [label, str(len(ok)), f"{rho:.3f}", f"{pick['test']:.4f}", f"{low:.4f}", f"{pick['test'] - low:.4f}",
            str(chosen), f"{seconds:.0f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a pairs.py name, trained at seeds 0 and 1")
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--data-root", default="../shared/data")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--eval-every", type=int, default=75)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--test-batches", type=int, default=55)
    ap.add_argument("--val-data", default=None, help="also rank with this file as --val-data")
    record.add_argument(ap, "validation_ranking")
    args = ap.parse_args()
    (a, _), (b, _) = pairs.commands(args.name, (0, 1), args.runs, args.data_root)
    data = f"{args.data_root}/tinyshakespeare.txt"
    test = load_batches(a, data, "test", 16, max_batches=args.test_batches)
    rows, history = [], {}
    for label, val_data in [("validation split of --data", None)] + ([("--val-data " + record.portable(args.val_data),
                                                                       args.val_data)] if args.val_data else []):
        opts = DualOptions(steps=args.steps, eval_every=args.eval_every, lr=args.lr, val_data=val_data,
                           lam_sampling="uniform")
        t0 = time.perf_counter()
        seen, chosen = observed_run(a, b, data, test, opts)
        rows.append(row(label, seen, chosen, time.perf_counter() - t0))
        history[label] = seen
        print(rows[-1], flush=True)
    notes = (f"{args.name}, seeds 0 and 1; dual matching {args.steps} steps at lr {args.lr:g}, every {args.eval_every} "
             f"steps an evaluation (the candidates); test: {len(test)} batches of 16 windows. Per candidate (step: "
             "validation, test): " + "; ".join(f"{k}: " + ", ".join(f"{s['step']}: {s['validation']:.4f}, {s['test']:.4f}"
                                                                       for s in v) for k, v in history.items()))
    record.save(args.results, "validation_ranking", args.name, f"{args.name}: validation against test ranking",
                [record.table(args.name, COLUMNS, rows)], commands=[record.command()], notes=notes)


if __name__ == "__main__":
    main()
