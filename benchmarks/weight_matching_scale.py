"""Streaming weight matching at Pythia, Llama-2-7B and Gemma-3-1B shapes: time per sweep by kind of work, and peak memory.

Two random-initialised checkpoints with the shapes of Pythia-410M or Pythia-1.4B (GPT-NeoX; HF's
initialisation: weights N(0, 0.02), LayerNorm weights 1, biases 0; vocabulary 50,304, 16 heads, 25%
rotary), Llama-2-7B / OLMo-7B (LlamaForCausalLM: d 4096, 32 layers, 32 heads, SwiGLU FFN 11008,
vocabulary 32,000, RMSNorm weights 1) or Gemma-3-1B (Gemma3ForCausalLM: d 1152, 26 layers, 4 query heads
and one KV head of width 256, GeGLU FFN 6912, vocabulary 262,144 tied, norm weights 1 + 0, post-norms and
QK-norm, so its residual map is a signed permutation) are written in bf16 as sharded safetensors, then `weight_match`
reads them part by part (`model.LazyModel`, algebra in float32 by default; `--cost-products bfloat16`
for the assignment costs from bf16 products) for the start pass and `--sweeps` sweeps. Printed:

- seconds per sweep split into reading (safetensors -> canonical tensors), linear assignment,
  Procrustes and head maps (every SVD/eigen solve), and cost matrices (the rest: the residual
  cross-covariances, FFN and head-circuit similarities, applying elements);
- the ratio of a sweep to its floor: one plain read of both checkpoints plus the sweep's assignments;
- peak RSS when the sweep reaches the middle block and at the end (flat in depth = equal).

    PYTHONPATH=src python benchmarks/weight_matching_scale.py --shape pythia-410m
    PYTHONPATH=src python benchmarks/weight_matching_scale.py --shape pythia-1.4b --folder runs/wm-scale
    PYTHONPATH=src python benchmarks/weight_matching_scale.py --shape llama-2-7b --cost-products bfloat16
    PYTHONPATH=src python benchmarks/weight_matching_scale.py --shape gemma-3-1b

Each part read is also logged as it happens (`part KEY at T s, RSS R GiB`), so that a run stopped early
still gives the seconds per block and the memory.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import record
import torch

import symmerge.match.residual as residual_mod
import symmerge.match.weight as weight_mod
import symmerge.match.weight_steps as steps_mod
from symmerge.match.weight_products import CHOICES
from symmerge.store.io import ShardWriter
from symmerge.store.model import LazyModel, expected_tensors, part_keys

SHAPES = {"pythia-70m": (512, 6, 8), "pythia-410m": (1024, 24, 16), "pythia-1.4b": (2048, 24, 16),
          "llama-2-7b": (4096, 32, 32), "gemma-3-1b": (1152, 26, 4)}  # d, layers, heads


def shape_config(name: str, depth: int | None = None):
    """The HF config of a shape: GPT-NeoX (Pythia) or Llama (Llama-2-7B; OLMo-7B has the same sizes);
    `depth`: fewer layers than the shape's own (the per-block cost and memory at full width)."""
    import transformers as T

    d, layers, heads = SHAPES[name]
    layers = depth or layers
    if name.startswith("gemma"):  # Gemma 3 1B: one KV head of width 256, GeGLU 6912, vocabulary 262,144, tied
        config = T.Gemma3TextConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=1,
                                    head_dim=256, query_pre_attn_scalar=256, intermediate_size=6912, vocab_size=262144,
                                    sliding_window=512, max_position_embeddings=32768, torch_dtype="bfloat16")
        config.architectures = ["Gemma3ForCausalLM"]
        return config
    if name.startswith("llama"):
        config = T.LlamaConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                               num_key_value_heads=heads, intermediate_size=11008, vocab_size=32000,
                               max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="bfloat16")
        config.architectures = ["LlamaForCausalLM"]
        return config
    config = T.GPTNeoXConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * d,
                             vocab_size=50304, rotary_pct=0.25, max_position_embeddings=2048, tie_word_embeddings=False,
                             use_parallel_residual=True, torch_dtype="bfloat16")
    config.architectures = ["GPTNeoXForCausalLM"]
    return config


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def write_random_checkpoint(folder: Path, name: str, seed: int, depth: int | None = None) -> None:
    """A random-initialised bf16 checkpoint of the shape's config, written tensor by tensor."""
    if (folder / "config.json").is_file():
        return
    config = shape_config(name, depth)
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    writer = ShardWriter(folder, 2 * 1024**3)
    for key, shape in expected_tensors(config, config.architectures[0]).items():
        if key.endswith("bias"):
            t = torch.zeros(shape)
        elif "layernorm" in key or "layer_norm" in key or key.endswith("norm.weight"):
            t = torch.zeros(shape) if name.startswith("gemma") else torch.ones(shape)  # Gemma stores w of 1 + w
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

    def __init__(self, lazy: LazyModel, log: list, echo: bool = False):
        self.lazy, self.log, self.echo = lazy, log, echo

    def part(self, key):
        self.log.append((key, time.perf_counter(), rss_gib(), time.process_time()))
        if self.echo:
            print(f"part {key} at {self.log[-1][1] - self.log[0][1]:.1f} s (CPU {self.log[-1][3] - self.log[0][3]:.1f} s), "
                  f"RSS {self.log[-1][2]:.2f} GiB", flush=True)
        return self.lazy.part(key)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="pythia-410m")
    ap.add_argument("--folder", default="runs/wm-scale", help="where the two checkpoints are written (reused)")
    ap.add_argument("--sweeps", type=int, default=1)
    ap.add_argument("--precision", choices=("float32", "float64"), default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cost-products", choices=CHOICES, default=CHOICES[0])
    ap.add_argument("--write-only", action="store_true", help="only write the two checkpoints")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the shape has (per-block figures "
                    "at full width)")
    ap.add_argument("--groups", default=None, help="comma-separated families (default: the spec's default families, as align)")
    ap.add_argument("--device", default=None, help="where the large products run (weight_match(device=)): cuda, cuda:N")
    ap.add_argument("--workers", type=int, default=1, help="blocks solved at once in a sweep (weight_match(workers=)); "
                    "--threads is shared among them")
    record.add_argument(ap, "weight_matching_scale")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.precision)
    root = Path(args.folder) / (args.shape + (f"-L{args.layers}" if args.layers else ""))
    t0 = time.perf_counter()
    for side, seed in (("a", 0), ("b", 1)):
        write_random_checkpoint(root / side, args.shape, seed, args.layers)
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
    steps_mod.assignment_minimising = Timed(steps_mod.assignment_minimising, seconds, "assignment")
    steps_mod.solve_map = Timed(steps_mod.solve_map, seconds, "procrustes_maps")
    residual_mod.best_rotation = Timed(residual_mod.best_rotation, seconds, "procrustes_maps")
    log: list = []
    fams = args.groups.split(",") if args.groups else a.spec.default_families()
    res = weight_mod.weight_match(a.spec, Source(a, log, echo=True), Source(b, []), fams, max_iters=args.sweeps, tol=0.0,
                                  dtype=dtype, progress=False, products=args.cost_products,
                                  device=args.device, workers=args.workers)
    end, cpu_end, rss_end = time.perf_counter(), time.process_time(), rss_gib()
    n_parts = len(keys)
    sweep_start = log[n_parts][1]  # the first part read by sweep 1 (sweeps read only the blocks: `weight_stream`)
    mid = log[n_parts + a.shape.n_layers // 2]  # sweep 1 reaching the middle block
    sweeps = len(res.history) - 1
    per_sweep = (end - sweep_start) / sweeps
    cpu_per_sweep = (cpu_end - log[n_parts][3]) / sweeps
    kinds = res.extra["seconds_by_step_kind"]
    reading = kinds.get("reading", 0.0)
    assign, maps = seconds.get("assignment", 0.0), seconds.get("procrustes_maps", 0.0)
    total = end - log[0][1]
    cost = total - reading - assign - maps
    n = sum(t.numel() for k in ("embed", "final") for t in a.part(k).values()) + a.shape.n_layers * sum(
        t.numel() for t in a.part(0).values())
    print(f"{args.shape}: {a.shape.n_layers} layers, d={a.shape.d_model}, d_mlp={a.shape.d_mlp}, {n / 1e6:.0f}M "
          f"canonical parameters, {args.precision} algebra, cost products {args.cost_products}, {args.threads} threads, "
          f"{args.workers} worker(s), "
          f"groups {','.join(fams)}")
    print(f"start pass {sweep_start - log[0][1]:.1f}s; {sweeps} sweep(s): {per_sweep:.1f}s per sweep (process CPU "
          f"{cpu_per_sweep:.1f}s: less than the wall time when other jobs share the cores)")
    print(f"whole run {total:.1f}s = reading {reading:.1f} + assignment {assign:.1f} + procrustes/maps {maps:.1f} "
          f"+ cost matrices and the rest {cost:.1f}")
    print(f"floor: plain read of both {read_s:.1f}s + assignments per sweep {assign / sweeps:.1f}s; "
          f"sweep / floor = {per_sweep / (read_s + assign / sweeps):.2f}")
    reads = [t for _, t, _, _ in log[n_parts:n_parts + a.shape.n_layers]] + [end]
    print("sweep 1, seconds per block (the last with the residual solve): "
          + ", ".join(f"{y - x:.1f}" for x, y in zip(reads, reads[1:])))
    print(f"peak RSS: at the middle block of sweep 1 {mid[2]:.2f} GiB, at the end {rss_end:.2f} GiB")
    series = ", ".join(f"{k}: {r:.2f}" for k, _, r, _ in log[n_parts:n_parts + a.shape.n_layers])
    print(f"peak RSS (GiB) when sweep 1 starts reading each part: {series}")
    if args.device and torch.device(args.device).type == "cuda":
        print(f"peak GPU memory {torch.cuda.max_memory_allocated(args.device) / 2**30:.2f} GiB")
    print(f"similarity {res.history[0]:.6f} -> {res.history[-1]:.6f}")
    key = f"{root.name}, {args.precision}, cost products {args.cost_products}, device {args.device or 'cpu'}"
    record.save(args.results, "weight_matching_scale", key, key, [record.table("one sweep", [
        "start pass", "s / sweep (CPU)", "assignments", "Procrustes + head maps", "reading (both passes)",
        "floor (plain read + assignments)", "sweep / floor", "peak RSS, mid-depth / end"], [[
        f"{sweep_start - log[0][1]:.1f} s", f"{per_sweep:.1f} s ({cpu_per_sweep:.1f} s)", f"{assign:.1f} s",
        f"{maps:.1f} s", f"{reading:.1f} s", f"{read_s + assign / sweeps:.1f} s",
        f"{per_sweep / (read_s + assign / sweeps):.2f}", f"{mid[2]:.2f} / {rss_end:.2f} GiB"]])])


if __name__ == "__main__":
    main()
