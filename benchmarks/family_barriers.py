"""Plain, weight-matching and dual barriers of one pair per model family (Qwen3, Qwen3-MoE, Qwen2-MoE, Phi-3, OLMo-2,
Gemma 3),
through the command line.

For each name of `pairs.py` (train them first: `python benchmarks/pairs.py qwen3-char-demo qwen3moe-char-demo`, and
`qwen2moe-char-demo phi3-char-demo olmo2-char-demo gemma3-char-demo`),
the models of seeds 0 and 1 are compared by `symmerge barrier` (11 points, the test split, 16 batches of 16
windows of 64 characters): averaged as they are, after `symmerge align --method weight` (every family but the
residual scale), and after `symmerge align --method dual` (the discrete choices from weight matching, the
continuous groups learned on both sides; `--dual-steps` steps at `--dual-lr`, half of learned's 1e-2 on the
Llama-style pair, on 64 training batches of 16). Each command runs in a fresh process at one thread; the record
holds every command as run, with its seconds.

    python benchmarks/family_barriers.py qwen3-char-demo qwen3moe-char-demo
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pairs
import record

BARRIER = ["--split", "test", "--batch-size", "16", "--max-batches", "16", "--points", "11"]
COLUMNS = ["alignment", "barrier", "L(0)", "L(0.5)", "L(1)", "accuracy barrier", "matching s"]


def symmerge(argv: list[str], commands: list[str]) -> float:
    """Run `symmerge argv` in a fresh process at one thread; its seconds. The command line goes to `commands`."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "symmerge", *argv], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    commands.append("symmerge " + shlex.join(map(record.portable, argv)))
    print(f"{time.perf_counter() - t0:7.1f} s  {commands[-1]}", flush=True)
    return time.perf_counter() - t0


def row(title: str, a: str, b: str, data: str, out: Path, seconds: float, commands: list[str]) -> list[str]:
    symmerge(["barrier", a, b, "--data", data, *BARRIER, "--json", str(out)], commands)
    r = json.loads(out.read_text())
    loss = r["loss"]
    return [title, f"{r['barrier']:.4f}", f"{loss[0]:.3f}", f"{loss[len(loss) // 2]:.3f}", f"{loss[-1]:.3f}",
            f"{r['accuracy_barrier']:.4f}", f"{seconds:.1f}"]


def measure(name: str, runs: str, data_root: str, dual_steps: int, dual_lr: float) -> tuple[list[list[str]], list[str]]:
    (a, _), (b, _) = pairs.commands(name, (0, 1), runs, data_root)
    data = f"{data_root}/tinyshakespeare.txt"
    work = Path(runs) / "family" / name
    work.mkdir(parents=True, exist_ok=True)
    commands: list[str] = []
    rows = [row("plain averaging", a, b, data, work / "plain.json", 0.0, commands)]
    s = symmerge(["align", a, b, "-o", str(work / "weight"), "--method", "weight"], commands)
    rows.append(row("weight matching (all but scale)", a, str(work / "weight"), data, work / "weight.json", s, commands))
    s = symmerge(["align", a, b, "-o", str(work / "dual"), "--method", "dual", "--data", data, "--steps", str(dual_steps),
                  "--lr", str(dual_lr), "--batch-size", "16", "--max-batches", "64", "--lam-sampling", "uniform"], commands)
    rows.append(row(f"dual ({dual_steps} steps, lr {dual_lr:g})", str(work / "dual" / "A"), str(work / "dual" / "B"),
                    data, work / "dual.json", s, commands))
    return rows, commands


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", help="pairs.py names, each trained at seeds 0 and 1")
    ap.add_argument("--runs", default="runs", help="folder the models were trained under (pairs.py --runs)")
    ap.add_argument("--data-root", default="../shared/data", help="folder holding tinyshakespeare.txt")
    ap.add_argument("--dual-steps", type=int, default=300)
    ap.add_argument("--dual-lr", type=float, default=5e-3)
    record.add_argument(ap, "family_barriers")
    args = ap.parse_args()
    for name in args.names:
        rows, commands = measure(name, args.runs, args.data_root, args.dual_steps, args.dual_lr)
        record.save(args.results, "family_barriers", name, f"{name}: barriers after each alignment",
                    [record.table(name, COLUMNS, rows)], commands=[record.command(), *commands],
                    notes="11-point test-loss barrier in nats per character; seeds 0 and 1 of the pairs.py name")


if __name__ == "__main__":
    main()
