"""What `--lr auto` costs against the run it chooses for, in wall time and in its own count (issue 17).

Trains a pair of `demo`-preset models (once, into FOLDER), then runs learned / dual matching with the
full recipe and `lr="auto"` for `--steps` steps, validation on `--val-batches` batches (given, so that
the validation sizing, which is not the search, takes no time), and prints, side by side in one run:
the search's seconds (`plan.lr_search.seconds`), the run's seconds (the learning after the plan), their
ratio, and the search's counted cost against the run's steps (`cost_steps / run_steps`, at most 0.1 by
construction, `match/lr_search.py`).

    PYTHONPATH=src python benchmarks/lr_search_cost.py --folder runs/polish/lrcost --arch llama \\
        --method dual --steps 600
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import record
import torch

DATA = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt")


def _pair(folder: Path, arch: str, train_steps: int, data: str) -> list[Path]:
    paths = []
    for seed in (0, 1):
        out = folder / f"{arch}-demo-{train_steps}-seed{seed}"
        if not (out / "config.json").is_file():
            subprocess.run([sys.executable, "-m", "symmerge", "train", "--arch", arch, "--preset", "demo", "--data", data,
                            "--seed", str(seed), "--steps", str(train_steps), "--threads", "1", "-o", str(out)], check=True)
        paths.append(out)
    return paths


def main() -> None:
    from symmerge.data.batches import load_batches
    from symmerge.match.learn_config import LearnConfig
    from symmerge.match.learned import learn
    from symmerge.store.model import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", required=True)
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--method", default="dual", choices=["learned", "dual"])
    ap.add_argument("--train-steps", type=int, default=200, help="training steps of each model of the pair")
    ap.add_argument("--steps", type=int, default=600, help="the learned / dual run's steps")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--val-batches", type=int, default=16)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--threads", type=int, default=1)
    record.add_argument(ap, "lr_search_cost")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    pa, pb = _pair(folder, args.arch, args.train_steps, args.data)
    a, b = load_model(pa), load_model(pb)
    train = load_batches(pa, args.data, "train", args.batch_size, max_batches=args.steps)
    val = load_batches(pa, args.data, "validation", args.batch_size, max_batches=args.val_batches)
    cfg = LearnConfig(method=args.method, steps=args.steps, lr="auto", val_batches=args.val_batches,
                      lam_sampling="uniform", progress=False)
    t0 = time.perf_counter()
    rep = learn(a, b, train, val, cfg).report
    total = time.perf_counter() - t0
    plan, search = rep["plan"], rep["plan"]["lr_search"]
    run = total - plan["seconds"]
    print(json.dumps({"arch": args.arch, "method": args.method, "steps": args.steps, "train_batches": len(train),
                      "val_batches": plan["val_batches"], "eval_every": plan["eval_every"], "threads": args.threads,
                      "search_seconds": search["seconds"], "run_seconds": round(run, 3),
                      "wall_share": round(search["seconds"] / run, 4), "cost_steps": search["cost_steps"],
                      "run_steps": search["run_steps"], "counted_share": search["cost_steps"] / search["run_steps"],
                      "steps_each": search["steps_each"], "search_val_batches": search["val_batches"],
                      "rates": search["rates"], "barriers": search["barriers"], "chosen": search["chosen"],
                      "end_line": rep["end_line"]}))
    key = f"{args.arch} pair ({args.train_steps} training steps), {args.method}, {args.steps} steps"
    record.save(args.results, "lr_search_cost", key, key, [record.table("search against run", [
        "search (rates x steps, val. batches)", "search s", "run s", "wall share", "counted share"], [[
        f"{len(search['rates'])} x {search['steps_each']}, {search['val_batches']}", f"{search['seconds']:.1f}",
        f"{run:.1f}", f"{search['seconds'] / run:.1%}",
        f"{search['cost_steps']} / {search['run_steps']} steps = {search['cost_steps'] / search['run_steps']:.0%}"]])],
        f"chosen rate {search['chosen']:g}; {rep['end_line']}")


if __name__ == "__main__":
    main()
