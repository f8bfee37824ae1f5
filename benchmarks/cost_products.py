"""The assignment costs' product, exact (float32) against bfloat16 operands with float32 accumulation
(`match/weight_products.cross`), side by side on the FFN cost matrix shapes of Pythia-1.4B and Llama-2-7B.

Each shape: `n x m` by `m x n` (n FFN units, m = 2 d: the up and down projections side by side;
SwiGLU: 3 d), the two variants interleaved `--repeats` times, median seconds and their ratio, and the
largest difference from the float64 product of the unrounded operands, relative to its largest entry.

    PYTHONPATH=src python benchmarks/cost_products.py
    PYTHONPATH=src python benchmarks/cost_products.py --shapes pythia-1.4b   # one shape

A product is 0.55 TFLOP at Pythia-1.4B's shape, 3.0 at Llama-2-7B's: each repeat computes two (exact and
bfloat16), and the float64 reference is computed once.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import record
import torch

from symmerge.match.weight_products import BF16, cross, mkl_available

SHAPES = {"pythia-1.4b": (8192, 4096), "llama-2-7b": (11008, 12288)}


def amx() -> str:
    """Whether the CPU reports AMX tiles for bfloat16 (`amx_bf16` in /proc/cpuinfo's flags): what makes the
    bfloat16 products faster; without it MKL's bfloat16 kernel runs no faster than float32."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "not known"
    return "yes" if "amx_bf16" in flags.split() else "no"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    record.add_argument(ap, "cost_products")
    args = ap.parse_args()
    rows = []
    torch.set_num_threads(args.threads)
    kernel = f"MKL bf16 kernel found: {mkl_available()}; AMX: {amx()}"
    print(f"{kernel}; {args.threads} thread(s)")
    shapes = args.shapes.split(",")
    if not set(shapes) <= set(SHAPES):
        raise SystemExit(f"--shapes: choose from {', '.join(SHAPES)}")
    for name in shapes:
        n, m = SHAPES[name]
        gen = torch.Generator().manual_seed(0)
        x, y = torch.randn(n, m, generator=gen) * 0.02, torch.randn(n, m, generator=gen) * 0.02
        times = {"exact": [], BF16: []}
        out = {}
        for _ in range(args.repeats):
            for mode in times:
                t0 = time.perf_counter()
                out[mode] = cross(x, y, None if mode == "exact" else mode)
                times[mode].append(time.perf_counter() - t0)
        ref = x.double() @ y.double().T
        scale = float(ref.abs().max())
        err = {k: float((v.double() - ref).abs().max()) / scale for k, v in out.items()}
        ex, bf = statistics.median(times["exact"]), statistics.median(times[BF16])
        print(f"{name} FFN ({n} x {m} by {m} x {n}): exact float32 {ex:.2f} s, bfloat16 operands {bf:.2f} s, "
              f"ratio {ex / bf:.2f}; error vs float64 relative to the largest entry: exact {err['exact']:.1e}, "
              f"bfloat16 {err[BF16]:.1e}")
        rows.append([f"{name} FFN ({n} x {m} by {m} x {n})", f"{ex:.2f}", f"{bf:.2f}", f"{ex / bf:.2f}",
                     f"{err['exact']:.1e}", f"{err[BF16]:.1e}"])
    key = f"{'all shapes' if len(shapes) == len(SHAPES) else ', '.join(shapes)}, {args.threads} thread(s)"
    record.save(args.results, "cost_products", key, key, [record.table(
        "median seconds; largest difference from float64 relative to the largest entry",
        ["product", "exact float32 s", "bfloat16 operands s", "ratio", "error, exact", "error, bfloat16"], rows)],
        kernel)


if __name__ == "__main__":
    main()
