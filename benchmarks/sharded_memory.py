"""Bytes per process with the endpoints sharded by FSDP2 (`align --shard-endpoints`), against one process.

Two random-initialised bf16 GPT-NeoX checkpoints of a Pythia shape (`learned_memory.write_random`) are
built into a dual-matching `Learner` in each of N processes under `torchrun --standalone --nproc-per-node N`
(gloo, 1 thread each), the endpoints sharded over the N processes (`match/sharded.py`; N = 1: whole, as
one process keeps them), and one step is run (loss at lambda 0.5 on `--batch` x `--seq` tokens, backward).
Each process reports the bytes its frozen stores keep (`nbytes`: its FSDP2 slices, with padding), its
resident memory before and after building the learner (`VmRSS`), its peak while building and its peak over
the step (`VmHWM`, reset in between through `/proc/self/clear_refs`).
The figure of interest: kept bytes per process / the endpoints' bytes, about 1/N.

    PYTHONPATH=src python benchmarks/sharded_memory.py --root runs/sharded --shape pythia-160m --procs 1,2,4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import record
import torch
from learned_memory import SHAPES, config_for, file_bytes, write_random

GIB = 1024**3


def _status(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def child(a: str, b: str, out: str, batch: int, seq: int) -> None:
    """One rank: build the learner (sharded when several), one step; writes OUT.rankR.json."""
    from symmerge.match.learn_config import LearnConfig
    from symmerge.match.learner import Learner
    from symmerge.runtime import distributed
    from symmerge.store.model import LazyModel

    torch.set_num_threads(1)
    group = distributed.init("cpu", shard=0)
    ends = LazyModel(a, torch.float32), LazyModel(b, torch.float32)
    before = _status("VmRSS")
    t0 = time.perf_counter()
    learner = Learner(*ends, LearnConfig(method="dual", dtype="bfloat16", progress=False))
    built, build_peak, t1 = _status("VmRSS"), _status("VmHWM"), time.perf_counter()
    with open("/proc/self/clear_refs", "w") as f:  # the step's own high-water mark from here
        f.write("5")
    ids = torch.randint(0, 50304, (batch, seq), generator=torch.Generator().manual_seed(0))
    loss = learner.loss({"input_ids": ids, "labels": ids}, 0.5)
    loss.backward()
    row = {"rank": group.rank, "world": group.world, "kept": sum(f.nbytes() for f in learner.frozen.values()),
           "kinds": sorted({type(f).__name__ for f in learner.frozen.values()}), "rss_before_build": before,
           "rss_after_build": built, "peak_build": build_peak, "peak_step": _status("VmHWM"), "loss": float(loss.detach()),
           "build_s": round(t1 - t0, 1), "step_s": round(time.perf_counter() - t1, 1)}
    Path(f"{out}.rank{group.rank}.json").write_text(json.dumps(row))
    distributed.close()


def measure(a: Path, b: Path, n: int, batch: int, seq: int, root: Path) -> list[dict]:
    out = root / f"sharded-{n}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), __file__,
           "--child", str(a), str(b), str(out), "--batch", str(batch), "--seq", str(seq)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if n == 1:  # alone: the plain (unsharded) store, in a process of its own
        env.update({"WORLD_SIZE": "1", "RANK": "0"})
        cmd = [sys.executable, __file__, *cmd[cmd.index("--child"):]]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{n} processes failed:\n{proc.stderr[-3000:]}")
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="runs/sharded", help="folder for the random checkpoints and the ranks' figures")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="pythia-160m")
    ap.add_argument("--layers", type=int, default=None, help="depth (default: the shape's)")
    ap.add_argument("--procs", default="1,2,4", help="process counts to measure")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=64)
    record.add_argument(ap, "sharded_memory")
    ap.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child, args.batch, args.seq)
    torch.set_num_threads(1)  # as each measuring process runs (the record says so)
    root = Path(args.root)
    config = config_for(args.shape, args.layers)
    name = f"{args.shape}-L{config.num_hidden_layers}"
    a, b = (write_random(root / f"{name}-{s}", config, s) for s in (0, 1))
    ends = file_bytes(a) + file_bytes(b)
    rows = []
    for n in [int(x) for x in args.procs.split(",")]:
        ranks = measure(a, b, n, args.batch, args.seq, root)
        kept = max(r["kept"] for r in ranks)
        top = {k: max(r[k] for r in ranks) / GIB for k in ("rss_before_build", "rss_after_build", "peak_build", "peak_step")}
        losses = sorted({f"{r['loss']:.6f}" for r in ranks})
        print(f"{name}, {n} process(es): kept {kept / GIB:.3f} GiB per process = {kept / ends:.4f} of the endpoints "
              f"({ends / GIB:.3f} GiB; x{n} = {kept * n / ends:.4f}); RSS {top['rss_before_build']:.3f} GiB before "
              f"building, {top['rss_after_build']:.3f} after, peak while building {top['peak_build']:.3f}, peak of the "
              f"step {top['peak_step']:.3f}; build {max(r['build_s'] for r in ranks)} s, step "
              f"{max(r['step_s'] for r in ranks)} s; losses {losses}", flush=True)
        rows.append([n, "sharded (FSDP2)" if n > 1 else "whole", f"{kept / GIB:.3f}", f"{kept / ends:.4f}",
                     f"{kept * n / ends:.4f}", *(f"{top[k]:.3f}" for k in top), max(r["build_s"] for r in ranks),
                     max(r["step_s"] for r in ranks), " ".join(losses)])
    key = f"{name}, bf16, dual, batch {args.batch}x{args.seq}, processes {args.procs}"
    record.save(args.results, "sharded_memory", key, key, [record.table(
        f"bytes per process, endpoints {ends / GIB:.3f} GiB (largest over the processes)",
        ["processes", "endpoints kept", "kept GiB", "kept / endpoints", "x processes", "RSS before build GiB",
         "RSS after build GiB", "peak while building GiB", "peak of the step GiB", "build s", "step s", "loss"], rows)],
        "gloo on the CPU, 1 thread per process, the processes sharing the machine's cores; kept: the frozen stores' "
        "bytes (`nbytes`: FSDP2's local slices with their padding, and the 0-dim scalars); RSS and peaks from "
        "/proc/self/status, the import of torch and transformers included; the loss is the same on every process and "
        "at every count (the gathered parts are the whole ones, bit for bit)")


if __name__ == "__main__":
    main()
