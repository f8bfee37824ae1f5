"""Streaming activation matching at Pythia shapes: time per block and peak memory against the models' size.

Two random-initialised bf16 GPT-NeoX checkpoints of Pythia shape (written by `weight_matching_scale.py`,
the same folder reused) are aligned by `activation_match_streaming` (`match/activation_stream.py`):
both models' stock blocks run one at a time on the same random-token batches, with float32 forward and
statistics by default, the CLI's default groups. Printed: tokens, whole run, seconds per block (median),
peak RSS (the process high-water mark) as each part is read (also logged as it happens) and at the end,
and both checkpoints' bytes on disk for comparison (what a model in memory would at least take).

    PYTHONPATH=src python benchmarks/activation_matching_scale.py --shape pythia-1.4b --folder runs/wm-scale
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import record
import torch
from weight_matching_scale import SHAPES, rss_gib, write_random_checkpoint

from symmerge.match.activation_stream import activation_match_streaming
from symmerge.store.model import LazyModel


def logged(lazy: LazyModel, log: list) -> LazyModel:
    """`lazy`, noting (key, time, peak RSS) whenever a part is read."""
    read = lazy.part

    def part(key):
        log.append((key, time.perf_counter(), rss_gib(), time.process_time()))
        print(f"\npart {key} at {log[-1][1] - log[0][1]:.1f} s (CPU {log[-1][3] - log[0][3]:.1f} s), RSS "
              f"{log[-1][2]:.2f} GiB", flush=True)
        return read(key)

    lazy.part = part
    return lazy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=[s for s in SHAPES if s.startswith("pythia")], default="pythia-410m")
    ap.add_argument("--folder", default="runs/wm-scale", help="where the two checkpoints are written (reused)")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--precision", choices=("float32", "float64"), default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the shape has (per-block figures "
                    "at full width; the same folders as weight_matching_scale.py --layers)")
    record.add_argument(ap, "activation_matching_scale")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.precision)
    root = Path(args.folder) / (args.shape + (f"-L{args.layers}" if args.layers else ""))
    for side, seed in (("a", 0), ("b", 1)):
        write_random_checkpoint(root / side, args.shape, seed, args.layers)
    on_disk = sum(f.stat().st_size for f in root.glob("*/*.safetensors"))
    log: list = []
    a, b = logged(LazyModel(root / "a", dtype), log), LazyModel(root / "b", dtype)
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(args.batches):
        ids = torch.randint(0, a.shape.vocab, (args.batch_size, args.seq_len), generator=gen)
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    print(f"{args.shape}: {a.shape.n_layers} layers, d={a.shape.d_model}, d_mlp={a.shape.d_mlp}; both checkpoints "
          f"{on_disk / 2**30:.2f} GiB on disk (bf16); RSS before {rss_gib():.2f} GiB", flush=True)
    t0, c0 = time.perf_counter(), time.process_time()
    res = activation_match_streaming(a, b, batches, a.spec.default_families(), max_tokens=10**9, dtype=dtype,
                                     progress=True)
    total, cpu, rss_end = time.perf_counter() - t0, time.process_time() - c0, rss_gib()
    blocks = [entry for entry in log if isinstance(entry[0], int)]
    walk = blocks[-a.shape.n_layers:]  # the matching pass (the config probe reads every block first)
    if len(walk) > 1:
        per_block = statistics.median(y[1] - x[1] for x, y in zip(walk, walk[1:]))
        per_block_cpu = statistics.median(y[3] - x[3] for x, y in zip(walk, walk[1:]))
    else:
        per_block = per_block_cpu = float("nan")
    print(f"{res.extra['fit']['tokens']} tokens ({args.batches} x {args.batch_size} x {args.seq_len}), "
          f"{args.precision} forward and statistics, {args.threads} thread(s)")
    print(f"whole run {total:.1f} s (process CPU {cpu:.1f} s: less than the wall time when other jobs share the "
          f"cores); {per_block:.1f} s per block (median; CPU {per_block_cpu:.1f} s); objective {res.history[0]:.6f} -> "
          f"{res.history[-1]:.6f}; residual r2 {res.extra['fit'].get('residual_r2', float('nan')):.4f}")
    series = ", ".join(f"{k}: {r:.2f}" for k, _, r, _ in walk)
    print(f"peak RSS (GiB) when each block is read: {series}")
    print(f"peak RSS at the end {rss_end:.2f} GiB")
    key = f"{root.name}, {args.batches} x {args.batch_size} x {args.seq_len} tokens, {args.precision}"
    rss = {k: r for k, _, r, _ in walk}
    marks = [k for k in (0, a.shape.n_layers // 2, a.shape.n_layers - 1) if k in rss]
    record.save(args.results, "activation_matching_scale", key, key, [record.table("whole run", [
        "whole run", "per block (median)", "peak RSS, block " + " / ".join(map(str, marks)), "peak RSS at the end",
        "both checkpoints on disk"], [[f"{total:.0f} s", f"{per_block:.1f} s", " / ".join(f"{rss[k]:.2f}" for k in marks)
                                       + " GiB", f"{rss_end:.2f} GiB", f"{on_disk / 2**30:.2f} GiB"]])])


if __name__ == "__main__":
    main()
