"""Determinism of symmerge's commands: the same command on the same inputs, run again in a fresh
process, at the same and at another thread count; which output bytes differ.

Runs, each in its own process with OMP_NUM_THREADS=T, per architecture of `--archs`: train A and B
(tiny presets; language models on `--data`, ViTs on scikit-learn's digits), align B to A by weight,
activation, learned and dual (short) matching, merge A and B, interpolate A with the weight-aligned
B, and weight-match a tie-prone pair (A with a duplicated FFN unit, against itself under a random
element). `fingerprint` hashes every output file; JSON files are hashed without their timing fields
(`TIMING`), which legitimately change from run to run. The inputs of every later step are those of the
first series (the 1-thread run), so a difference is the step's own.

    PYTHONPATH=src python benchmarks/determinism.py --data ../shared/data/tinyshakespeare.txt --threads 1,1,2
    PYTHONPATH=src python benchmarks/determinism.py --data ../shared/data/tinyshakespeare.txt --threads 1,2 \
        --archs gpt2,neox,llama,olmo,vit      # recorded in benchmarks/results/determinism.json

prints, per step and output, whether each series gives the bytes of the first. Across installations
(a fresh clone in a fresh virtual environment, another machine): `--record FILE` writes the first
series' digests (with the commit, thread count, step counts and library versions), and `--check FILE`
runs one series with the recorded settings and compares every output's digest with the record (exit 1
when any differs):

    PYTHONPATH=src python benchmarks/determinism.py --data ../shared/data/tinyshakespeare.txt --threads 1 --record REC.json
    # elsewhere, at the same commit:
    PYTHONPATH=src python benchmarks/determinism.py --data ../shared/data/tinyshakespeare.txt --check REC.json
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

import record

from symmerge.store.card import TIMING  # the report fields that are timings: dropped before hashing


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


def steps(root: Path, inputs: Path, data: str, train_steps: int, learn_steps: int, arch: str = "gpt2"
          ) -> dict[str, list[str]]:
    """name -> argv of `symmerge`; each writes root/name (and root/name.json where it reports). `arch`: the
    architecture trained (vit: on scikit-learn's digits, whatever `data` says). The tie-prone pair: A with
    its first FFN unit copied onto its second in every layer (`duplicate_unit`, made in-process), and that
    model under a random element (`transform --seed 3`); weight matching must choose between two units no
    cost can tell apart."""
    a, b = inputs / "train-a", inputs / "train-b"
    data = "digits" if arch == "vit" else data
    train = ["train", "--arch", arch, "--preset", "tiny", "--data", data, "--steps", str(train_steps)]
    learn = ["--data", data, "--steps", str(learn_steps), "--eval-every", str(max(1, learn_steps // 2)),
             "--val-batches", "2"]
    return {
        "train-a": [*train, "--seed", "0", "-o", str(root / "train-a")],
        "train-b": [*train, "--seed", "1", "-o", str(root / "train-b")],
        "align-weight": ["align", str(a), str(b), "-o", str(root / "align-weight"), "--json", str(root / "align-weight.json")],
        "align-activation": ["align", str(a), str(b), "-o", str(root / "align-activation"), "--method", "activation",
                             "--data", data, "--json", str(root / "align-activation.json")],
        "align-learned": ["align", str(a), str(b), "-o", str(root / "align-learned"), "--method", "learned", *learn,
                          "--json", str(root / "align-learned.json")],
        "align-dual": ["align", str(a), str(b), "-o", str(root / "align-dual"), "--method", "dual", *learn,
                       "--json", str(root / "align-dual.json")],
        "merge": ["merge", str(a), str(b), "-o", str(root / "merge"), "--json", str(root / "merge.json")],
        "interpolate": ["interpolate", str(a), str(inputs / "align-weight"), "--lam", "0.5", "-o", str(root / "interpolate")],
        "tie-transform": ["transform", str(inputs / "tie-a"), "-o", str(root / "tie-transform"), "--seed", "3"],
        "align-tie": ["align", str(inputs / "tie-a"), str(inputs / "tie-transform"), "-o", str(root / "align-tie"),
                      "--json", str(root / "align-tie.json")],
    }


def duplicate_unit(src: Path, dst: Path) -> None:
    """`src` with FFN unit 0's input row and output column copied onto unit 1 in every layer (any architecture
    symmerge reads: through its canonical form), written as a stock checkpoint."""
    from symmerge.store.model import load_model, save_model

    model = load_model(src)
    params = dict(model.params)
    ffn = {model.spec.layer_roles(i).ffn for i in range(model.shape.n_layers)}
    for name, acts in model.spec.actions.items():
        for act in (a for a in acts if a.group in ffn and name in params):
            t = params[name].clone()
            t.select(act.axis, 1).copy_(t.select(act.axis, 0))
            params[name] = t
    save_model(model, params, dst)


def in_fresh_process(threads: int):
    """A runner: `symmerge argv` in a new process with `threads` threads."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return lambda argv: subprocess.run([sys.executable, "-m", "symmerge", *argv], env=env, check=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_series(root: Path, inputs: Path | None, run, data: str, train_steps: int, learn_steps: int,
               arch: str = "gpt2") -> dict:
    """Every step through `run(argv)`; {step: fingerprint of its outputs}. `inputs`: the series whose
    trained and aligned models the later steps read (None: this one)."""
    root.mkdir(parents=True, exist_ok=True)
    inputs = inputs or root
    found = {}
    for name, argv in steps(root, inputs, data, train_steps, learn_steps, arch).items():
        if name == "tie-transform" and inputs == root:
            duplicate_unit(root / "train-a", root / "tie-a")
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
            "python_executable": record.portable(sys.executable), "cpu": cpu()}


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
    ap.add_argument("--root", default="runs/determinism")
    ap.add_argument("--archs", default="gpt2", help="comma-separated architectures trained (gpt2, neox, llama, olmo, vit)")
    ap.add_argument("--json", default=None, help="write every series' comparison, with the provenance, to this JSON file")
    ap.add_argument("--record", default=None, help="write the first series' digests and settings to this JSON file")
    ap.add_argument("--check", default=None, help="run one series with this record's settings and compare its digests")
    record.add_argument(ap, "determinism")
    args = ap.parse_args()
    root = Path(args.root)
    shutil.rmtree(root, ignore_errors=True)
    if args.check:
        raise SystemExit(check(Path(args.check), root, args.data))
    series = [int(t) for t in args.threads.split(",")]
    results = {}
    for arch in args.archs.split(","):
        base = root / arch
        first = run_series(base / "0", None, in_fresh_process(series[0]), args.data, args.train_steps,
                           args.learn_steps, arch)
        if args.record and arch == "gpt2":
            settings = {"threads": series[0], "train_steps": args.train_steps, "learn_steps": args.learn_steps}
            Path(args.record).write_text(json.dumps({**provenance(), **settings, "steps": first}, indent=1) + "\n")
        results[arch] = []
        for i, t in enumerate(series[1:], start=1):
            other = run_series(base / str(i), base / "0", in_fresh_process(t), args.data, args.train_steps,
                               args.learn_steps, arch)
            diff = compare(first, other)
            results[arch].append({"threads": t, "against_threads": series[0], "differs": diff})
            print(f"{arch}: series {i} ({t} threads) against series 0 ({series[0]} threads):", flush=True)
            for step, files in diff.items():
                print(f"  {step:<17} {'identical' if not files else 'differs: ' + ', '.join(files)}", flush=True)
    if args.json:
        out = {"benchmark": "determinism", "command": " ".join(["python", *sys.argv]), **provenance(),
               "settings": {"threads": series, "train_steps": args.train_steps, "learn_steps": args.learn_steps},
               "results": results}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    archs = list(results)
    for i, t in enumerate(series[1:]):
        steps = list(results[archs[0]][i]["differs"])
        cell = lambda files: "identical" if not files else "differs: " + ", ".join(files)  # noqa: E731
        key = f"{t} threads against {series[0]}, {','.join(archs)}"
        record.save(args.results, "determinism", key, key, [record.table(
            f"series {i + 1} ({t} threads) against series 0 ({series[0]} threads)", ["step"] + archs,
            [[s] + [cell(results[a][i]["differs"][s]) for a in archs] for s in steps])])

if __name__ == "__main__":
    main()
