"""Streaming weight matching at Pythia shapes: time per sweep by kind of work, and peak memory against depth.

Two random-initialised GPT-NeoX checkpoints with the shapes of Pythia-410M or Pythia-1.4B (HF's
initialisation: weights N(0, 0.02), LayerNorm weights 1, biases 0; vocabulary 50,304, 16 heads, 25%
rotary) are written in bf16 as sharded safetensors, then `weight_match` reads them part by part
(`model.LazyModel`, algebra in float32 by default) for the start pass and `--sweeps` sweeps. Printed:

- seconds per sweep split into reading (safetensors -> canonical tensors), linear assignment,
  Procrustes and head maps (every SVD/eigen solve), and cost matrices (the rest: the residual
  cross-covariances, FFN and head-circuit similarities, applying elements);
- the ratio of a sweep to its floor: one plain read of both checkpoints plus the sweep's assignments;
- peak RSS when the sweep reaches the middle block and at the end (flat in depth = equal).

    PYTHONPATH=src python benchmarks/weight_matching_scale.py --shape pythia-410m
    PYTHONPATH=src python benchmarks/weight_matching_scale.py --shape pythia-1.4b --folder /tmp/wm-scale
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import torch

import symmerge.match.residual as residual_mod
import symmerge.match.weight as weight_mod
import symmerge.match.weight_steps as steps_mod
from symmerge.io import ShardWriter
from symmerge.model import LazyModel, expected_tensors, part_keys

SHAPES = {"pythia-70m": (512, 6, 8), "pythia-410m": (1024, 24, 16), "pythia-1.4b": (2048, 24, 16)}  # d, layers, heads


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def write_random_checkpoint(folder: Path, name: str, seed: int) -> None:
    """A random-initialised bf16 GPTNeoXForCausalLM of the shape's config, written tensor by tensor."""
    import transformers as T

    if (folder / "config.json").is_file():
        return
    d, layers, heads = SHAPES[name]
    config = T.GPTNeoXConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * d,
                             vocab_size=50304, rotary_pct=0.25, max_position_embeddings=2048, tie_word_embeddings=False,
                             use_parallel_residual=True, torch_dtype="bfloat16")
    config.architectures = ["GPTNeoXForCausalLM"]
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    writer = ShardWriter(folder, 2 * 1024**3)
    for key, shape in expected_tensors(config, "GPTNeoXForCausalLM").items():
        if key.endswith("bias"):
            t = torch.zeros(shape)
        elif "layernorm" in key or "layer_norm" in key:
            t = torch.ones(shape)
        else:
            t = torch.randn(shape, generator=gen) * 0.02
        writer.add({key: t.to(torch.bfloat16)})
    writer.finish()
    config.save_pretrained(folder)


class Timed:
    """Wraps a function and adds its wall time to `seconds[kind]`."""

    def __init__(self, fn, seconds: dict, kind: str):
        self.fn, self.seconds, self.kind = fn, seconds, kind

    def __call__(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return self.fn(*a, **k)
        finally:
            self.seconds[self.kind] = self.seconds.get(self.kind, 0.0) + time.perf_counter() - t0


class Source:
    """A LazyModel that timestamps each part read and notes the peak RSS at the middle block."""

    def __init__(self, lazy: LazyModel, log: list):
        self.lazy, self.log = lazy, log

    def part(self, key):
        self.log.append((key, time.perf_counter(), rss_gib()))
        return self.lazy.part(key)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="pythia-410m")
    ap.add_argument("--folder", default="/tmp/wm-scale", help="where the two checkpoints are written (reused)")
    ap.add_argument("--sweeps", type=int, default=1)
    ap.add_argument("--precision", choices=("float32", "float64"), default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write-only", action="store_true", help="only write the two checkpoints")
    ap.add_argument("--groups", default=None, help="comma-separated families (default: the spec's default families, as align)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.precision)
    root = Path(args.folder) / args.shape
    t0 = time.perf_counter()
    for side, seed in (("a", 0), ("b", 1)):
        write_random_checkpoint(root / side, args.shape, seed)
    print(f"checkpoints in {root} ({time.perf_counter() - t0:.0f}s to write or find); RSS so far {rss_gib():.2f} GiB")
    if args.write_only:
        return
    a, b = LazyModel(root / "a", dtype), LazyModel(root / "b", dtype)
    keys = part_keys(a.shape)

    # the floor: one plain read of both checkpoints into canonical tensors
    t0 = time.perf_counter()
    for key in keys:
        a.part(key), b.part(key)
    read_s = time.perf_counter() - t0

    seconds: dict[str, float] = {}
    steps_mod.linear_assignment = Timed(steps_mod.linear_assignment, seconds, "assignment")
    steps_mod.solve_map = Timed(steps_mod.solve_map, seconds, "procrustes_maps")
    residual_mod.procrustes = Timed(residual_mod.procrustes, seconds, "procrustes_maps")
    log: list = []
    fams = args.groups.split(",") if args.groups else a.spec.default_families()
    res = weight_mod.weight_match(a.spec, Source(a, log), Source(b, []), fams, max_iters=args.sweeps, tol=0.0,
                                  dtype=dtype, progress=True)
    end, rss_end = time.perf_counter(), rss_gib()
    n_parts = len(keys)
    sweep_start = log[n_parts][1]  # the first part read by sweep 1
    mid = log[n_parts + 1 + a.shape.n_layers // 2]  # sweep 1 reaching the middle block
    sweeps = len(res.history) - 1
    per_sweep = (end - sweep_start) / sweeps
    kinds = res.extra["seconds_by_step_kind"]
    reading = kinds.get("reading", 0.0)
    assign, maps = seconds.get("assignment", 0.0), seconds.get("procrustes_maps", 0.0)
    total = end - log[0][1]
    cost = total - reading - assign - maps
    n = sum(t.numel() for k in ("embed", "final") for t in a.part(k).values()) + a.shape.n_layers * sum(
        t.numel() for t in a.part(0).values())
    print(f"{args.shape}: {a.shape.n_layers} layers, d={a.shape.d_model}, d_mlp={a.shape.d_mlp}, {n / 1e6:.0f}M "
          f"canonical parameters, {args.precision} algebra, {args.threads} threads, groups {','.join(fams)}")
    print(f"start pass {sweep_start - log[0][1]:.1f}s; {sweeps} sweep(s): {per_sweep:.1f}s per sweep")
    print(f"whole run {total:.1f}s = reading {reading:.1f} + assignment {assign:.1f} + procrustes/maps {maps:.1f} "
          f"+ cost matrices and the rest {cost:.1f}")
    print(f"floor: plain read of both {read_s:.1f}s + assignments per sweep {assign / sweeps:.1f}s; "
          f"sweep / floor = {per_sweep / (read_s + assign / sweeps):.2f}")
    print(f"peak RSS: at the middle block of sweep 1 {mid[2]:.2f} GiB, at the end {rss_end:.2f} GiB")
    series = ", ".join(f"{k}: {r:.2f}" for k, _, r in log[n_parts:2 * n_parts])
    print(f"peak RSS (GiB) when sweep 1 starts reading each part: {series}")
    print(f"similarity {res.history[0]:.6f} -> {res.history[-1]:.6f}")


if __name__ == "__main__":
    main()
