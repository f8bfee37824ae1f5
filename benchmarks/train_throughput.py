"""Training throughput of the `small` presets: tokens/s (language models) and images/s (ViT).

Times `--steps` optimiser steps (after `--warmup` untimed ones) of the stock HF model with the preset's
shape and batch size, (median step time) on random token ids (vocabulary `--vocab`) or random 28x28 images, with the same
step as `symmerge train` (forward with labels, backward, clip, AdamW). Prints one line per arch.

    PYTHONPATH=src python benchmarks/train_throughput.py --threads 2 --steps 5
"""

from __future__ import annotations

import argparse
import time

import record
import torch

from symmerge.training.presets import HF_CLASSES, get_preset, lm_config, vit_config
from symmerge.training.trainer import _optimizer, _step


def bench(arch: str, preset: str, vocab: int, steps: int, warmup: int, batch_size: int | None) -> tuple[float, str]:
    import transformers

    p = get_preset(arch, preset)
    bs = batch_size or p.batch_size
    gen = torch.Generator().manual_seed(0)
    if arch == "vit":
        config = vit_config(p, 28, 10)
        batch = {"pixel_values": torch.randn(bs, 1, 28, 28, generator=gen), "labels": torch.randint(0, 10, (bs,), generator=gen)}
        per_step, unit = bs, "images/s"
    else:
        config = lm_config(arch, p, vocab, 0, 0)
        ids = torch.randint(0, vocab, (bs, p.context), generator=gen)
        batch = {"input_ids": ids, "labels": ids}
        per_step, unit = bs * p.context, "tokens/s"
    torch.manual_seed(0)
    model = getattr(transformers, HF_CLASSES[arch])(config).train()
    opt = _optimizer(model, p, p.lr)
    for _ in range(warmup):
        _step(model, opt, batch, p.lr, p.clip, torch.float32)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        _step(model, opt, batch, p.lr, p.clip, torch.float32)
        times.append(time.perf_counter() - t0)
    dt = sorted(times)[len(times) // 2]  # median: robust to other processes on a shared machine
    return per_step / dt, f"{unit} (median {dt:.2f} s/step of {steps}, batch {bs})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="gpt2,neox,llama,olmo,vit")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--vocab", type=int, default=50257, help="vocabulary size (50257 = GPT-2 BPE, 65 = Shakespeare chars)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (allocator and oneDNN warm-up)")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    record.add_argument(ap, "train_throughput")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, preset {a.preset}, vocab {a.vocab}")
    rows = []
    for arch in a.archs.split(","):
        rate, what = bench(arch, a.preset, a.vocab, a.steps, a.warmup, a.batch_size)
        print(f"{arch:6s} {rate:10.0f} {what}")
        rows.append([arch, f"{rate:.0f} {what}"])
    key = f"{a.preset} preset, vocab {a.vocab}, batch {a.batch_size or 'of the preset'}"
    record.save(a.results, "train_throughput", key, key, [record.table("throughput", ["arch", "rate"], rows)])


if __name__ == "__main__":
    main()
