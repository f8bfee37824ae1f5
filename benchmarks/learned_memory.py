"""Peak memory (RSS) of one dual-matching step on Pythia-shaped bf16 pairs, against the endpoints' bytes.

Two random-initialised GPT-NeoX checkpoints of a real shape (`--shape`, optionally `--layers` to vary
the depth at the same width) are written as bf16 safetensors shard by shard (weights N(0, 0.02), norms
1 and biases 0: memory does not depend on the values). Each measurement runs in a fresh subprocess:
`Learner(LazyModel(A), LazyModel(B))` for `--method` at `--dtype` (the endpoints read block by block,
kept in bf16), then one step (loss at lambda 0.5, backward, Adam on the group parameters); the child
reports `resource.getrusage(RUSAGE_SELF).ru_maxrss` after building and after the step.

    PYTHONPATH=src python benchmarks/learned_memory.py --root runs/blockwise --shape pythia-1.4b
    PYTHONPATH=src python benchmarks/learned_memory.py --root runs/blockwise --shape pythia-1.4b --layers 12
    PYTHONPATH=src python benchmarks/learned_memory.py --root runs/blockwise --shape pythia-410m

The target (issue 13): peak <= 1.3 x the two endpoints' bytes + 1 GiB, and flat in depth (peak minus
endpoints about the same at every depth).

`--cli TEXT` measures the command instead: a character tokenizer of TEXT is written beside both checkpoints
(its ids fit the vocabulary), and `/usr/bin/time -v symmerge align A B -o OUT --method dual --data TEXT` runs
with one weight-matching sweep, one learning step on one window of `--seq` characters, a 3-point validation
grid on one window at steps 0 and 1, the outputs written and checked; its maximum resident set size is the
peak of the whole command (`--cli-args` adds or overrides flags).

    PYTHONPATH=src python benchmarks/learned_memory.py --root runs/blockwise --shape pythia-1.4b \
        --cli ../shared/data/tinyshakespeare.txt

`--phases` (with `--cli`) runs the same command in-process instead, with each phase of it wrapped (loading,
weight matching, the learner's build, the plan, the run, writing each output, checking each output): the
resident high-water mark (`VmHWM`, reset through `/proc/self/clear_refs`) is logged per phase, so the phase
that sets the command's peak is named (`PHASES`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import record
import torch

SHAPES = {  # d_model, layers, heads, FFN, vocabulary
    "pythia-160m": (768, 12, 12, 3072, 50304),
    "pythia-410m": (1024, 24, 16, 4096, 50304),
    "pythia-1.4b": (2048, 24, 16, 8192, 50304),
}
GIB = 1024**3


def config_for(shape: str, layers: int | None):
    import transformers

    d, n, h, f, v = SHAPES[shape]
    config = transformers.GPTNeoXConfig(hidden_size=d, num_hidden_layers=layers or n, num_attention_heads=h,
                                        intermediate_size=f, vocab_size=v, max_position_embeddings=2048,
                                        rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False)
    config.architectures = ["GPTNeoXForCausalLM"]
    return config


def write_random(folder: Path, config, seed: int) -> Path:
    """A random bf16 checkpoint of `config`, one tensor at a time (never the whole model in float32)."""
    from symmerge.store.io import ShardWriter
    from symmerge.store.model import expected_tensors

    if (folder / "config.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    writer = ShardWriter(folder, 2 * GIB)
    for name, shape in expected_tensors(config, "GPTNeoXForCausalLM").items():
        if "layernorm" in name or "layer_norm" in name:
            t = torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
        elif name.endswith("bias"):
            t = torch.zeros(shape)
        else:
            t = torch.randn(shape, generator=gen) * 0.02
        writer.add({name.replace("lm_head.", "embed_out."): t.to(torch.bfloat16)})
    writer.finish()
    config.save_pretrained(folder)
    return folder


def child(a: str, b: str, method: str, dtype: str, batch: int, seq: int, recompute: str) -> None:
    """One step in this process; prints a JSON line of peak RSS figures (bytes)."""
    from symmerge.match.learn_config import LearnConfig
    from symmerge.match.learner import Learner
    from symmerge.store.model import LazyModel

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    # read in float32 (canonical form folded there, then kept in bf16): half the float64 transient of a part
    ends = LazyModel(a, torch.float32), LazyModel(b, torch.float32)
    learner = Learner(*ends, LearnConfig(method=method, dtype=dtype, recompute=recompute, progress=False))
    built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t1 = time.perf_counter()
    opt = torch.optim.Adam(list(learner.trainables().values()), lr=1e-3)
    ids = torch.randint(0, 50304, (batch, seq), generator=torch.Generator().manual_seed(0))
    loss = learner.loss({"input_ids": ids, "labels": ids}, 0.5)
    loss.backward()
    opt.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    frozen = sum(f.nbytes() for f in learner.frozen.values())
    print(json.dumps({"peak_after_build": built, "peak": peak, "frozen_bytes": frozen, "loss": float(loss.detach()),
                      "build_s": round(t1 - t0, 1), "step_s": round(time.perf_counter() - t1, 1)}), flush=True)


def cli(a: Path, b: Path, text: str, seq: int, out: Path, extra: list[str], phases: bool = False) -> dict:
    """`symmerge align A B --method dual` under /usr/bin/time -v; {"peak": bytes, "wall_s", "line"}; `phases`:
    in a child that logs each phase's peak (`phase_child`), {"phases": [...]} too."""
    import shutil
    import tempfile

    from symmerge.data.tokenizers import char_tokenizer

    tok = char_tokenizer(Path(text).read_text())
    for folder in (a, b):
        tok.save_pretrained(folder)
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "symmerge", "align", str(a), str(b), "-o", str(out),
           "--method", "dual", "--data", text, "--recipe", "quick", "--steps", "1", "--batch-size", "1",
           "--seq-len", str(seq), "--max-batches", "1", "--val-batches", "1", "--val-points", "3", "--eval-every", "1",
           "--max-iters", "1", "--precision", "float32", "--cost-products", "bfloat16", *extra]
    if phases:
        cmd[3:5] = [str(Path(__file__).resolve()), "--phase-child"]
    # the command runs in a scratch folder: a relative PYTHONPATH (PYTHONPATH=src) is made absolute, or the child
    # would import whichever symmerge is installed instead of the code measured
    path = os.pathsep.join(str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env={**os.environ, "PYTHONPATH": path})
    if proc.returncode != 0:
        sys.exit(f"the command failed:\n{' '.join(cmd)}\n{proc.stderr[-3000:]}")
    stats = dict(line.strip().split(": ", 1) for line in proc.stderr.splitlines() if ": " in line and line.startswith("\t"))
    wall = stats["Elapsed (wall clock) time (h:mm:ss or m:ss)"].split(":")
    lines = proc.stdout.strip().splitlines()
    logged = json.loads(lines.pop()) if phases else {}
    return {"peak": int(stats["Maximum resident set size (kbytes)"]) * 1024, "line": lines[-1], **logged,
            "wall_s": round(sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall))), 1), "cmd": " ".join(cmd)}


#: (module, attribute, label) of the command's phases that `--phases` wraps
PHASES = [
    ("symmerge.workflows.pair", "batches_for", "data"),
    ("symmerge.workflows.pair", "load_pair", "open checkpoints"),
    ("symmerge.match.registry", "weight_match", "weight matching"),
    ("symmerge.match.learned", "Learner", "learner build"),
    ("symmerge.match.learned", "make_plan", "plan (validation size, lr)"),
    ("symmerge.match.learn_loop", "Run.go", "run (steps, validation)"),
    ("symmerge.match.learn_loop", "Run.evaluate", "validation"),
    ("symmerge.match.learn_loop", "Run.train_step", "step"),
    ("symmerge.match.learn_loop", "Run.save", "checkpoint save"),
    ("symmerge.match.learn_loop", "Run.result", "best state's elements"),
    ("symmerge.match.learned", "best_se", "best state's s.e."),
    ("symmerge.match.outputs", "write_element", "write"),
    ("symmerge.match.outputs", "logit_gap", "check"),
]


def _status(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


class PhaseLog:
    """Peak RSS per phase: on entering a phase the high-water mark so far is folded into the open phases'
    peaks and reset (writing 5 to /proc/self/clear_refs), so each phase's peak is its own."""

    def __init__(self):
        self.stack: list[list] = []
        self.rows: list[dict] = []
        self.top = 0

    def _fold(self) -> int:
        hwm = _status("VmHWM")
        self.top = max(self.top, hwm)
        for entry in self.stack:
            entry[1] = max(entry[1], hwm)
        return hwm

    def _reset(self) -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def wrap(self, fn, label: str):
        import functools

        @functools.wraps(fn)
        def inner(*args, **kwargs):
            self._fold()
            self._reset()
            name = label + (f" {Path(str(args[2])).name}" if label == "write" else "")
            self.stack.append([name, 0, _status("VmRSS"), time.perf_counter()])
            try:
                return fn(*args, **kwargs)
            finally:
                self._fold()
                name, peak, before, t0 = self.stack.pop()
                row = {"phase": name, "depth": len(self.stack), "rss_before": before, "peak": peak,
                       "rss_after": _status("VmRSS"), "s": round(time.perf_counter() - t0, 1)}
                self.rows.append(row)
                print("[phase] " + json.dumps(row), file=sys.stderr, flush=True)
        return inner


def phase_child(argv: list[str], phases: list[tuple[str, str, str]] = PHASES) -> None:
    """`symmerge` with `argv` in this process, every phase of `phases` wrapped by a `PhaseLog`; the phases and the
    peak as the last line (JSON)."""
    import importlib

    from symmerge.cli import main as symmerge_main

    log = PhaseLog()
    for module, attr, label in phases:
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for p in path:
            owner = getattr(owner, p)
        setattr(owner, name, log.wrap(getattr(owner, name), label))
    rc = symmerge_main(argv)
    log._fold()
    print(json.dumps({"rc": rc, "peak": log.top, "phases": log.rows}), flush=True)


def file_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="runs/blockwise", help="folder for the random checkpoints")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="pythia-1.4b")
    ap.add_argument("--layers", type=int, default=None, help="depth (default: the shape's)")
    ap.add_argument("--method", choices=("learned", "dual"), default="dual")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--recompute", default="block", help="block | weights | none (LearnConfig.recompute)")
    ap.add_argument("--cli", default=None, metavar="TEXT", help="measure `symmerge align --method dual --data TEXT` instead")
    ap.add_argument("--cli-args", default="", help="--cli: more flags for the command (space-separated)")
    ap.add_argument("--phases", action="store_true", help="--cli: log the peak RSS of each phase of the command")
    ap.add_argument("--phase-child", nargs=argparse.REMAINDER, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--notes", default="", help="--cli: what the record's notes say (where the memory goes)")
    record.add_argument(ap, "learned_memory")
    args = ap.parse_args()
    if args.phase_child is not None:
        return phase_child(args.phase_child)
    if args.child:
        return child(*args.child, args.method, args.dtype, args.batch, args.seq, args.recompute)
    config = config_for(args.shape, args.layers)
    name = f"{args.shape}-L{config.num_hidden_layers}"
    a, b = (write_random(Path(args.root) / f"{name}-{s}", config, s) for s in (0, 1))
    if args.cli:
        ends = file_bytes(a) + file_bytes(b)
        r = cli(a, b, str(Path(args.cli).resolve()), args.seq, Path(args.root) / f"{name}-cli-out", args.cli_args.split(),
                args.phases)
        target = 1.3 * ends + GIB
        for row in r.get("phases", []):
            print(f"{'  ' * row['depth']}{row['phase']:<30} RSS before {row['rss_before'] / GIB:6.2f}  peak "
                  f"{row['peak'] / GIB:6.2f}  after {row['rss_after'] / GIB:6.2f} GiB  {row['s']:7.1f} s")
        print(f"{r['cmd']}\n{r['line']}\n{name}: endpoints {ends / GIB:.2f} GiB; the command's maximum RSS "
              f"{r['peak'] / GIB:.2f} GiB (target {target / GIB:.2f} GiB: {'holds' if r['peak'] <= target else 'MISSED'}); "
              f"wall {r['wall_s']} s")
        holds = "holds" if r["peak"] <= target else f"missed by {(r['peak'] - target) / GIB:.2f} GiB"
        tables = [record.table("maximum RSS of the command", ["command", "endpoints", "maximum RSS", "target", "wall"], [[
            f"align --method dual, {name}", f"{ends / GIB:.2f} GiB", f"{r['peak'] / GIB:.2f} GiB",
            f"{target / GIB:.2f} GiB: {holds}", f"{r['wall_s']} s"]])]
        if r.get("phases"):
            tables.append(record.table("resident memory (GiB) and seconds per phase",
                                       ["phase", "RSS before", "peak", "RSS after", "s"],
                                       [["· " * row["depth"] + row["phase"], f"{row['rss_before'] / GIB:.2f}", f"{row['peak'] / GIB:.2f}",
                                         f"{row['rss_after'] / GIB:.2f}", f"{row['s']:.1f}"] for row in r["phases"]]))
        record.save(args.results, "learned_memory", f"{name}, the command", f"{name}, the whole command", tables, args.notes)
        return None
    cmd = [sys.executable, __file__, "--child", str(a), str(b), "--method", args.method, "--dtype", args.dtype,
           "--batch", str(args.batch), "--seq", str(args.seq), "--recompute", args.recompute]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the measuring process failed:\n{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    ends = file_bytes(a) + file_bytes(b)
    target = 1.3 * ends + GIB
    print(f"{name} {args.method} {args.dtype} recompute={args.recompute} batch {args.batch}x{args.seq}: endpoints {ends / GIB:.2f} GiB "
          f"(kept {r['frozen_bytes'] / GIB:.2f} GiB); peak RSS {r['peak'] / GIB:.2f} GiB (after building "
          f"{r['peak_after_build'] / GIB:.2f}); peak - endpoints {(r['peak'] - ends) / GIB:.2f} GiB; "
          f"target {target / GIB:.2f} GiB: {'holds' if r['peak'] <= target else 'MISSED'}; "
          f"build {r['build_s']} s, step {r['step_s']} s")
    key = f"{name}, {args.method}, {args.dtype}, recompute={args.recompute}, batch {args.batch}x{args.seq}"
    record.save(args.results, "learned_memory", key, key, [record.table("peak resident memory", [
        "shape", "endpoints", "peak after building", "peak of the step", "peak - endpoints",
        "target 1.3 x endpoints + 1 GiB"], [[name, f"{ends / GIB:.2f} GiB", f"{r['peak_after_build'] / GIB:.2f} GiB",
                                             f"{r['peak'] / GIB:.2f} GiB", f"{(r['peak'] - ends) / GIB:.2f} GiB",
                                             f"{target / GIB:.2f} GiB: {'holds' if r['peak'] <= target else 'missed'}"]])],
        f"build {r['build_s']} s, step {r['step_s']} s")


if __name__ == "__main__":
    main()
