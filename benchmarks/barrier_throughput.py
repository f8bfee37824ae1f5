"""Barrier-harness evaluation throughput per λ against a plain stock-HF forward over the same batches.

The harness interpolates canonical tensors, exports them to the HF layout and runs the stock forward
through `torch.func.functional_call`; the baseline is `evaluate(model, batches)` on a model built once.
Both are timed side by side in one process, alternating, median of `--repeats`. Ratio = baseline
time / harness time (1.0: the harness costs nothing extra; the target is >= 0.9).

    PYTHONPATH=src python benchmarks/barrier_throughput.py --d-model 256 --layers 6 --batches 8
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import record
import torch
import transformers as T

from symmerge.evaluation.forward import StockForward, evaluate, interpolate
from symmerge.store.model import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    record.add_argument(ap, "barrier_throughput")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = T.GPT2Config(n_embd=args.d_model, n_layer=args.layers, n_head=4, vocab_size=args.vocab, n_positions=args.seq)
    cfg.architectures = ["GPT2LMHeadModel"]
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(args.batches):
        ids = torch.randint(0, args.vocab, (args.batch_size, args.seq), generator=gen)
        batches.append({"input_ids": ids, "labels": ids})
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (0, 1):
            torch.manual_seed(seed)
            T.GPT2LMHeadModel(cfg).save_pretrained(f"{tmp}/m{seed}")
        a, b = load_model(f"{tmp}/m0"), load_model(f"{tmp}/m1")
        plain = T.GPT2LMHeadModel.from_pretrained(f"{tmp}/m0").eval()
        harness = StockForward(a)
        t_plain, t_harness, t_export = [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            evaluate(plain, batches)
            t_plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            harness.scores(interpolate(a.params, b.params, 0.5), batches)
            t_harness.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            harness.state_dict(interpolate(a.params, b.params, 0.5))
            t_export.append(time.perf_counter() - t0)
    tp, th = statistics.median(t_plain), statistics.median(t_harness)
    tokens = args.batches * args.batch_size * args.seq
    print(f"GPT-2 d={args.d_model} L={args.layers} vocab={args.vocab}, {args.batches} batches x {args.batch_size} x {args.seq}, "
          f"{args.threads} thread(s)")
    print(f"plain stock forward : {tp:.3f} s per pass ({tokens / tp:,.0f} tokens/s)")
    print(f"harness, one λ      : {th:.3f} s per λ   ({tokens / th:,.0f} tokens/s)")
    print(f"of which interpolation + export per λ: {statistics.median(t_export):.3f} s")
    print(f"throughput ratio (plain time / harness time): {tp / th:.3f}")
    key = f"GPT-2 d={args.d_model} L={args.layers} vocab={args.vocab}, {args.batches} batches x {args.batch_size} x {args.seq}"
    record.save(args.results, "barrier_throughput", key, key, [record.table("seconds", [
        "run", "plain s/pass", "harness s/λ", "interpolation + export s/λ", "ratio plain/harness"], [[
        f"{args.batches} batches, {args.repeats} repeats", f"{tp:.3f}", f"{th:.3f}", f"{statistics.median(t_export):.3f}",
        f"{tp / th:.3f}"]])])


if __name__ == "__main__":
    main()
