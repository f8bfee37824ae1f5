"""Cost of one learned-matching step next to one plain training step of the same model on the same batch.

A learned-matching step applies the group elements to both endpoints' canonical tensors, interpolates,
exports and runs the stock HF forward and backward (gradients to the group parameters only), then an
Adam step on those parameters. Applying the elements costs the same at every batch size, so the ratio
learned / plain should fall towards ~1 as the batch grows. The plain step is forward with labels,
backward to every weight, AdamW. Both run interleaved (median of `--steps`, after `--warmup` untimed
steps each) on one GPT-2 shaped model pair in float32.

    PYTHONPATH=src python benchmarks/learned_step_cost.py --batches 1,4,16,64 --steps 5
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import transformers

from symmerge.match.learned import LearnConfig, Learner
from symmerge.model import load_model


def make_pair(d: int, layers: int, heads: int, vocab: int, ctx: int, folder: Path):
    cfg = dict(n_embd=d, n_layer=layers, n_head=heads, vocab_size=vocab, n_positions=ctx, bos_token_id=0, eos_token_id=0)
    out = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg))
        model.config.architectures = ["GPT2LMHeadModel"]
        model.save_pretrained(folder / str(seed))
        out.append(load_model(folder / str(seed)))
    return out


def plain_step(model, opt, batch) -> None:
    opt.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    opt.step()


def learned_step(learner: Learner, opt, batch) -> None:
    opt.zero_grad(set_to_none=True)
    learner.loss(batch, 0.5).backward()
    opt.step()


def median_times(fns: dict, steps: int, warmup: int) -> dict[str, float]:
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    for _ in range(steps):  # interleaved: a busy machine slows both alike
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--groups", default="all", help="families learned ('all', or e.g. residual_rotation,qk_map,ov_map)")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    groups = None if a.groups == "all" else a.groups.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        ma, mb = make_pair(a.d_model, a.layers, a.heads, a.vocab, a.context, Path(tmp))
    learner = Learner(ma, mb, LearnConfig(groups=groups, dtype="float32"))
    lopt = torch.optim.Adam(list(learner.trainables().values()), lr=1e-3)
    plain = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=a.d_model, n_layer=a.layers, n_head=a.heads, vocab_size=a.vocab, n_positions=a.context)).train()
    popt = torch.optim.AdamW(plain.parameters(), lr=1e-4)
    n_weights = sum(p.numel() for p in plain.parameters())
    n_group = sum(t.numel() for t in learner.trainables().values())
    print(f"GPT-2 d={a.d_model} layers={a.layers} vocab={a.vocab} context={a.context}: {n_weights / 1e6:.1f}M weights, "
          f"{n_group / 1e3:.1f}k group parameters ({a.groups}); threads={torch.get_num_threads()}; median of {a.steps}")
    print(f"{'batch':>6} {'plain s/step':>13} {'learned s/step':>15} {'learned/plain':>14}")
    gen = torch.Generator().manual_seed(0)
    for bs in (int(x) for x in a.batches.split(",")):
        ids = torch.randint(0, a.vocab, (bs, a.context), generator=gen)
        batch = {"input_ids": ids, "labels": ids}
        t = median_times({"plain": lambda b=batch: plain_step(plain, popt, b),
                          "learned": lambda b=batch: learned_step(learner, lopt, b)}, a.steps, a.warmup)
        print(f"{bs:>6} {t['plain']:>13.3f} {t['learned']:>15.3f} {t['learned'] / t['plain']:>14.2f}", flush=True)


if __name__ == "__main__":
    main()
