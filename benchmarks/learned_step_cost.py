"""Cost of one learned-matching step next to one plain training step of the same model on the same batch.

The models are the `symmerge train` presets (`--arch`, `--preset`; random initialisation: the cost
does not depend on the weights). A learned-matching step applies the group elements to the endpoints'
canonical tensors, interpolates, exports and runs the stock HF forward and backward (gradients to the
group parameters only), then an Adam step on those parameters. The plain step is `symmerge train`'s
own step (forward with labels, backward to every weight, gradient clipping, AdamW). Both run
interleaved (median of `--steps`, after `--warmup` untimed steps each) in `--dtype` (the plain model
cast to it; learned: the forward's dtype), one column per `--recompute` mode, with the forward
half of the batch-independent work timed on its own (elements, their action on the weights,
interpolation, export: "apply fwd"). That part costs the same at every batch size, so learned / plain
falls as the batch grows.

    PYTHONPATH=src python benchmarks/learned_step_cost.py --arch gpt2 --batches 1,4,16 --steps 3 --threads 1
    # --method dual: continuous groups on both sides (permutations fixed), as `align --method dual`
    # --dtype bfloat16 --recompute block,weights,none: both steps in bf16, every recompute mode
    # --shape pythia-160m [--layers N] --seq 512: a random GPT-NeoX pair of a real shape (vocabulary 50304),
    #   written in --dtype and read back as LazyModels (the CLI's path), instead of a preset
    # --device cuda: both steps on the GPU (synchronised around each timed call); the peak GPU memory of each
    #   column (`torch.cuda.max_memory_allocated`, reset before each call) is printed after the times

What to expect: acting on a block's weights costs about d_model / tokens of its forward per side and pass, so
recompute=block (one more forward than plain training) stays above 4/3, and recompute=weights (the same
forwards as plain training, the weights materialised three times per side: forward, recomputation, gradient)
costs about 1 + 2 d_model / tokens for dual: batches of at least ~10 d_model tokens reach 1.2x.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import record
import torch
import transformers

from symmerge.match.learn_config import DTYPES, LearnConfig
from symmerge.match.learner import Learner
from symmerge.store.model import LazyModel, load_model
from symmerge.training.presets import ARCHS, HF_CLASSES, get_preset, lm_config, vit_config
from symmerge.training.trainer import _optimizer, _step

VOCAB = 65  # Tiny Shakespeare characters
IMAGE, CLASSES = 28, 10  # MNIST


def hf_model(arch: str, preset, seed: int):
    config = vit_config(preset, IMAGE, CLASSES) if arch == "vit" else lm_config(arch, preset, VOCAB, 0, 0)
    config.architectures = [HF_CLASSES[arch]]
    torch.manual_seed(seed)
    return getattr(transformers, HF_CLASSES[arch])(config).to(torch.float32)


def make_batch(arch: str, preset, size: int, gen: torch.Generator, vocab: int = VOCAB, seq: int | None = None) -> dict:
    if arch == "vit":
        return {"pixel_values": torch.randn(size, 1, IMAGE, IMAGE, generator=gen),
                "labels": torch.randint(0, CLASSES, (size,), generator=gen)}
    ids = torch.randint(0, vocab, (size, seq or preset.context), generator=gen)
    return {"input_ids": ids, "labels": ids}


def shape_model(shape: str, layers: int | None, seed: int):
    """A random GPT-NeoX model of a Pythia shape (`learned_memory.SHAPES`), float32."""
    sys.path.insert(0, str(Path(__file__).parent))
    from learned_memory import config_for

    torch.manual_seed(seed)
    return transformers.GPTNeoXForCausalLM(config_for(shape, layers)).to(torch.float32)


def learned_step(learner: Learner, opt, batch) -> None:
    opt.zero_grad(set_to_none=True)
    learner.loss(batch, 0.5).backward()
    opt.step()


def apply_only(learner: Learner) -> None:
    """The batch-independent forward part of a step: elements, their action on both sides, interpolation,
    every part once (the block-wise forward does this part by part, and again in the backward)."""
    forward = learner.forward
    part = learner.path(0.5, hard=False)
    forward.end_state(part)
    for v in forward.vocab:  # the heads, chunk by chunk (an embedding takes only the batch's rows: left out)
        if isinstance(forward.hf.get_submodule(v.module).stock, torch.nn.Linear):
            for start in range(0, v.rows, forward.head_rows):
                forward.vocab_state(part, v, slice(start, start + forward.head_rows))
    for i in range(learner.frozen["A"].shape.n_layers):
        forward.block_state(part, i)


def median_times(fns: dict, steps: int, warmup: int, device: torch.device | None = None,
                 peaks: dict | None = None, samples: dict | None = None) -> dict[str, float]:
    """Median seconds of each of `fns` (interleaved); on a GPU `device`, synchronised around each call and the
    peak allocated bytes of each fn kept in `peaks`; every timed sample kept in `samples` when given."""
    cuda = device is not None and device.type == "cuda"
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    for _ in range(steps):  # interleaved: a busy machine slows both alike
        for k, fn in fns.items():
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize(device)
                if peaks is not None:
                    peaks[k] = max(peaks.get(k, 0), torch.cuda.max_memory_allocated(device))
            times[k].append(time.perf_counter() - t0)
    if samples is not None:
        samples.update(times)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=ARCHS, default="gpt2")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--method", choices=("learned", "dual"), default="learned")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default: 1, 4 and the preset's)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--groups", default="all", help="families learned ('all', or e.g. residual_rotation,qk_map,ov_map)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="of both steps (learned: LearnConfig.dtype)")
    ap.add_argument("--recompute", default="block,weights", help="LearnConfig.recompute modes timed side by side")
    ap.add_argument("--shape", default=None, help="a Pythia shape (pythia-160m, pythia-410m, pythia-1.4b) instead of a preset")
    ap.add_argument("--layers", type=int, default=None, help="--shape: its depth (default: the shape's)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: the preset's context; --shape: 512)")
    ap.add_argument("--device", default="cpu", help="where both steps run: cpu, cuda or cuda:N")
    ap.add_argument("--spread", action="store_true", help="also print each ratio's range over the timed steps "
                    "(step i of a column against step i of plain: the same moment of a shared machine)")
    record.add_argument(ap, "learned_step_cost")
    a = ap.parse_args()
    device = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    preset = get_preset(a.arch, a.preset)
    groups = None if a.groups == "all" else a.groups.split(",")
    dtype = DTYPES[a.dtype]
    make = (lambda seed: shape_model(a.shape, a.layers, seed)) if a.shape else (lambda seed: hf_model(a.arch, preset, seed))
    tmp = tempfile.TemporaryDirectory()
    pair = []
    for seed in (0, 1):
        make(seed).to(dtype).save_pretrained(Path(tmp.name) / str(seed))  # the endpoints stored in --dtype
        pair.append(LazyModel(Path(tmp.name) / str(seed)) if a.shape else load_model(Path(tmp.name) / str(seed)))
    modes = a.recompute.split(",")
    learner = Learner(*pair, LearnConfig(method=a.method, groups=groups, dtype=a.dtype, recompute=modes[0],
                                               device=a.device))
    lopt = torch.optim.Adam(list(learner.trainables().values()), lr=1e-3)
    plain = make(2).to(dtype).to(device).train()
    popt = _optimizer(plain, preset, preset.lr)
    n_weights = sum(p.numel() for p in plain.parameters())
    n_group = sum(t.numel() for t in learner.trainables().values())
    s = learner.frozen["A"].shape
    vocab, seq = (50304, a.seq or 512) if a.shape else (VOCAB, a.seq)
    what = f"{a.shape} (random GPT-NeoX)" if a.shape else f"{a.arch} {a.preset} (preset batch {preset.batch_size})"
    sizes = [int(x) for x in a.batches.split(",")] if a.batches else sorted({1, 4, preset.batch_size})
    print(f"{what}: d={s.d_model}, layers={s.n_layers}, {n_weights / 1e6:.1f}M weights; {a.method}, "
          f"{n_group / 1e3:.1f}k group parameters ({a.groups}); {a.dtype}; threads={torch.get_num_threads()}; "
          f"median of {a.steps}; device {device}", flush=True)
    cols = "".join(f" {'recompute=' + m + ' s':>20} {'/plain':>7}" for m in modes)
    print(f"{'batch':>6} {'tokens':>7} {'plain s/step':>13}{cols} {'of which apply fwd s':>21}")
    gen = torch.Generator().manual_seed(0)
    rows = []

    def learned(mode, b):
        learner.forward.recompute = mode
        learned_step(learner, lopt, b)

    for bs in sizes:
        batch = make_batch("gpt_neox" if a.shape else a.arch, preset, bs, gen, vocab, seq)
        tokens = batch["input_ids"].numel() if "input_ids" in batch else bs
        fns = {"plain": lambda b=batch: _step(plain, popt, b, preset.lr, preset.clip, dtype)}
        fns.update({m: (lambda b=batch, m=m: learned(m, b)) for m in modes})
        fns["apply"] = lambda: apply_only(learner)
        peaks, samples = {}, {}
        t = median_times(fns, a.steps, a.warmup, device, peaks, samples)
        row = "".join(f" {t[m]:>20.3f} {t[m] / t['plain']:>7.2f}" for m in modes)
        print(f"{bs:>6} {tokens:>7} {t['plain']:>13.3f}{row} {t['apply']:>21.3f}", flush=True)
        rows.append([bs, tokens, f"{t['plain']:.3f}", *(f"{t[m]:.3f} ({t[m] / t['plain']:.2f})" for m in modes),
                     f"{t['apply']:.3f}"] + ([", ".join(f"{k} {v / 2**30:.2f}" for k, v in peaks.items())] if peaks else []))
        if a.spread:
            print("       ratio range over the steps: " + ", ".join(
                f"{m} {min(r):.2f}-{max(r):.2f}" for m in modes
                for r in [[x / y for x, y in zip(samples[m], samples["plain"])]]), flush=True)
        if peaks:
            print("       peak GPU memory GiB: " + ", ".join(f"{k} {v / 2**30:.2f}" for k, v in peaks.items()), flush=True)
    tmp.cleanup()
    key = f"{a.shape or a.arch + ' ' + a.preset}, {a.method}, {a.dtype}, {device}"
    columns = ["batch", "tokens", "plain s", *(f"recompute={m} s (/plain)" for m in modes), "apply fwd s"]
    record.save(a.results, "learned_step_cost", key, key, [record.table(
        f"median seconds per step of {a.steps}", columns + (["peak GPU memory GiB"] if len(rows[0]) > len(columns) else []),
        rows)])

if __name__ == "__main__":
    main()
