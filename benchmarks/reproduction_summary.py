"""Summarise `reproduction_table.py --json` files: per row, each seed's test barrier ± its standard error
(best validation step), the mean over seeds ± its spread over seeds, and ± the test-sampling error of
that mean (the seeds share the test batches: the spread over test batches of each batch's gap at the
peak, averaged over seeds), the mean accuracy barrier, and (first seed) the permutation entries that
learning reassigned. Prints a markdown table per file.

    python benchmarks/reproduction_summary.py runs/pub_vit.jsonl [more.jsonl ...]
"""

from __future__ import annotations

import argparse
import json

from reproduction_table import ROWS, row_lr, seed_mean


def rows(path: str) -> dict[tuple, list[dict]]:
    """JSON lines grouped by (row, learning rate); weight-only rows have no learning rate. Lines written
    before the rate was recorded get it from the run's arguments as `run_row` chose it."""
    out: dict[tuple, list[dict]] = {}
    for line in open(path):
        r = json.loads(line)
        lr = r.get("lr")
        if "lr" not in r and r["learn"]:
            lr = row_lr(ROWS[r["row"]][1], r["args"]["lr"], r["args"].get("dual_lr"))
        out.setdefault((r["row"], lr), []).append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    for path in args.files:
        print(f"\n{path}\n")
        print("| alignment | lr | per seed: barrier ± s.e. (best step) | mean ± seeds | ± test | acc. barrier | reassigned |")
        print("|---|---|---|---|---|---|---|")
        for (_, lr), rs in rows(path).items():
            tests = [r["test"] for r in rs]
            per = ", ".join(f"{t['barrier']:.4f} ± {t['barrier_se']:.4f}" + (f" ({r['learn']['best_step']})" if r["learn"] else "")
                            for t, r in zip(tests, rs))
            mean, over_seeds, over_batches = seed_mean(tests)
            spread = f" ± {over_seeds:.4f}" if len(tests) > 1 else ""
            acc = sum(t["accuracy_barrier"] for t in tests) / len(tests)
            moved = ", ".join(f"{k} {a}/{b}" for k, (a, b) in (rs[0]["learn"] or {}).get("reassigned", {}).items())
            print(f"| {rs[0]['label']} | {'' if lr is None else f'{lr:g}'} | {per} | {mean:.4f}{spread} "
                  f"| {over_batches:.4f} | {acc:.4f} | {moved} |")


if __name__ == "__main__":
    main()
