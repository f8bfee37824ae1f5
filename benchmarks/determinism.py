"""Determinism of symmerge's commands: the same command on the same inputs, run again in a fresh
process, at the same and at another thread count; which output bytes differ.

Runs, each in its own process with OMP_NUM_THREADS=T: train A and B (char GPT-2s on `--data`),
align B to A by weight, activation and dual (short) matching, merge A and B, interpolate A with the
weight-aligned B. `fingerprint` hashes every output file; JSON files are hashed without their
timing fields (`TIMING`), which legitimately change from run to run. The inputs of every later step
are those of the first series (the 1-thread run), so a difference is the step's own.

    PYTHONPATH=src python benchmarks/determinism.py --data ../shared/data/tinyshakespeare.txt --threads 1,1,2

prints, per step and output, whether each series gives the bytes of the first. Across installations
(a fresh clone in a fresh virtual environment, another machine): `--record FILE` writes the first
series' digests (with the commit, thread count, step counts and library versions), and `--check FILE`
runs one series with the recorded settings and compares every output's digest with the record (exit 1
when any differs):

    PYTHONPATH=src python benchmarks/determinism.py --data /abs/tinyshakespeare.txt --threads 1 --record REC.json
    # elsewhere, at the same commit:
    PYTHONPATH=src python benchmarks/determinism.py --data /abs/tinyshakespeare.txt --check REC.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: JSON keys whose values are timings (or made of timings): dropped before hashing
TIMING = ("seconds", "wall_s", "time_s", "seconds_by_step_kind", "pairwise_seconds", "barrier_seconds")


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in TIMING and not k.endswith("_seconds")}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def fingerprint(path: Path, roots: tuple = ()) -> dict[str, str]:
    """sha256 per file under `path` (relative names; `path` itself if a file), JSON without `TIMING`;
    in text files (JSON, YAML) the folders `roots` (of the series, of its inputs) are written as ROOT
    (outputs name their paths)."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    out = {}
    for f in files:
        data = f.read_bytes()
        for r in roots if f.suffix in (".json", ".yml", ".yaml") else ():
            data = data.replace(str(r).encode(), b"ROOT")
        if f.suffix == ".json":
            data = json.dumps(_strip(json.loads(data)), sort_keys=True).encode()
        out[str(f.relative_to(path)) if f != path else f.name] = hashlib.sha256(data).hexdigest()
    return out


def steps(root: Path, inputs: Path, data: str, train_steps: int, learn_steps: int) -> dict[str, list[str]]:
    """name -> argv of `symmerge`; each writes root/name (and root/name.json where it reports)."""
    a, b = inputs / "train-a", inputs / "train-b"
    train = ["train", "--arch", "gpt2", "--preset", "tiny", "--data", data, "--steps", str(train_steps)]
    return {
        "train-a": [*train, "--seed", "0", "-o", str(root / "train-a")],
        "train-b": [*train, "--seed", "1", "-o", str(root / "train-b")],
        "align-weight": ["align", str(a), str(b), "-o", str(root / "align-weight"), "--json", str(root / "align-weight.json")],
        "align-activation": ["align", str(a), str(b), "-o", str(root / "align-activation"), "--method", "activation",
                             "--data", data, "--json", str(root / "align-activation.json")],
        "align-dual": ["align", str(a), str(b), "-o", str(root / "align-dual"), "--method", "dual", "--data", data,
                       "--steps", str(learn_steps), "--eval-every", str(max(1, learn_steps // 2)), "--val-batches", "2",
                       "--json", str(root / "align-dual.json")],
        "merge": ["merge", str(a), str(b), "-o", str(root / "merge"), "--json", str(root / "merge.json")],
        "interpolate": ["interpolate", str(a), str(inputs / "align-weight"), "--lam", "0.5", "-o", str(root / "interpolate")],
    }


def in_fresh_process(threads: int):
    """A runner: `symmerge argv` in a new process with `threads` threads."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return lambda argv: subprocess.run([sys.executable, "-m", "symmerge", *argv], env=env, check=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_series(root: Path, inputs: Path | None, run, data: str, train_steps: int, learn_steps: int) -> dict:
    """Every step through `run(argv)`; {step: fingerprint of its outputs}. `inputs`: the series whose
    trained and aligned models the later steps read (None: this one)."""
    root.mkdir(parents=True, exist_ok=True)
    inputs = inputs or root
    found = {}
    for name, argv in steps(root, inputs, data, train_steps, learn_steps).items():
        run(argv)
        found[name] = fingerprint(root / name, (root, inputs))
        if (root / f"{name}.json").is_file():
            found[name] |= {"report.json": fingerprint(root / f"{name}.json", (root, inputs))[f"{name}.json"]}
    return found


def compare(first: dict, other: dict) -> dict[str, list[str]]:
    """step -> the output files whose bytes differ from `first`'s."""
    return {s: sorted(f for f in first[s] if other[s].get(f) != first[s][f]) for s in first}


def cpu() -> dict:
    """The processor as /proc/cpuinfo names it: model, family/model/stepping, the vector and matrix
    extensions (what selects MKL's and oneDNN's code paths), the logical CPUs; {} where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    first = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    first = {k.strip(): v.strip() for k, v in first.items()}
    flags = sorted(f for f in first.get("flags", "").split() if f.startswith(("avx", "amx", "fma", "sse")))
    return {"model_name": first.get("model name", ""), "family_model_stepping": "/".join(
        first.get(k, "?") for k in ("cpu family", "model", "stepping")), "vector_flags": flags,
        "logical_cpus": text.count("processor\t:")}


def provenance() -> dict:
    """The commit of the code that ran, the versions of what it ran on, and the processor."""
    import platform

    import safetensors
    import torch
    import transformers

    here = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "torch": torch.__version__, "transformers": transformers.__version__,
            "safetensors": safetensors.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "python_executable": sys.executable, "cpu": cpu()}


def check(record_file: Path, root: Path, data: str) -> int:
    """One series with the record's settings; prints per step whether every digest equals the record's."""
    record = json.loads(record_file.read_text())
    here = provenance()
    print(f"record: commit {record['commit'][:10]}, torch {record['torch']}, {record['python_executable']}")
    print(f"this run: commit {here['commit'][:10]}, torch {here['torch']}, {here['python_executable']}")
    for name, c in (("record's CPU", record.get("cpu")), ("this CPU", here["cpu"])):
        print(f"{name}: " + (f"{c['model_name']} ({c['family_model_stepping']}, {c['logical_cpus']} logical), "
                             f"{' '.join(c['vector_flags'])}" if c else "not recorded"))
    if record.get("cpu") and record["cpu"] != here["cpu"]:
        print("another processor than the record's (model, extensions or count differ)")
    found = run_series(root / "0", None, in_fresh_process(record["threads"]), data, record["train_steps"],
                       record["learn_steps"])
    diff = compare(record["steps"], found)
    for step, files in diff.items():
        print(f"  {step:<17} {'identical to the record' if not files else 'differs: ' + ', '.join(files)}")
    return 1 if any(diff.values()) else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--threads", default="1,1,2", help="thread count of each series; the first is the reference")
    ap.add_argument("--train-steps", type=int, default=60)
    ap.add_argument("--learn-steps", type=int, default=20)
    ap.add_argument("--root", default="/tmp/symmerge-determinism")
    ap.add_argument("--record", default=None, help="write the first series' digests and settings to this JSON file")
    ap.add_argument("--check", default=None, help="run one series with this record's settings and compare its digests")
    args = ap.parse_args()
    root = Path(args.root)
    shutil.rmtree(root, ignore_errors=True)
    if args.check:
        raise SystemExit(check(Path(args.check), root, args.data))
    series = [int(t) for t in args.threads.split(",")]
    first = run_series(root / "0", None, in_fresh_process(series[0]), args.data, args.train_steps, args.learn_steps)
    if args.record:
        settings = {"threads": series[0], "train_steps": args.train_steps, "learn_steps": args.learn_steps}
        Path(args.record).write_text(json.dumps({**provenance(), **settings, "steps": first}, indent=1) + "\n")
    for i, t in enumerate(series[1:], start=1):
        other = run_series(root / str(i), root / "0", in_fresh_process(t), args.data, args.train_steps, args.learn_steps)
        diff = compare(first, other)
        print(f"series {i} ({t} threads) against series 0 ({series[0]} threads):")
        for step, files in diff.items():
            print(f"  {step:<17} {'identical' if not files else 'differs: ' + ', '.join(files)}")


if __name__ == "__main__":
    main()
