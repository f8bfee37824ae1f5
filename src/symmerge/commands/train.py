"""`symmerge train --arch A --preset P --data PATH --seed N -o DIR`: train a small model from scratch."""

from __future__ import annotations

from ..runtime import devices
from ..runtime.values import at_least, positive_float, seed
from ..training.presets import ARCHS, NEOX_FIELDS, SHAPE_FIELDS


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(text)
    return text == "on"


def register(sub) -> None:
    p = sub.add_parser("train", help="train a small stock HF model from scratch (deterministic for a seed; resumable)")
    p.add_argument("--arch", required=True, choices=ARCHS, help="architecture")
    p.add_argument("--preset", default="tiny", help="model/optimiser preset: tiny (seconds) or small (the papers' size)")
    p.add_argument("--data", required=True, help="a .txt file (language models); an IDX folder, mnist.pkl.gz or 'digits' (vit)")
    p.add_argument("--seed", type=seed, default=0, help="fixes the initialisation and the data order")
    p.add_argument("-o", "--out", required=True, help="output folder (must be empty or absent unless --force/--resume)")
    p.add_argument("--tokenizer", default="char", choices=("char", "bpe", "gpt2"), help="tokenizer built into the model folder")
    p.add_argument("--gpt2-bpe", default=None, metavar="DIR", help="folder with GPT-2's encoder.json and vocab.bpe (--tokenizer gpt2)")
    p.add_argument("--vocab-size", type=int, default=2048, help="vocabulary size of --tokenizer bpe")
    p.add_argument("--steps", type=at_least(1), default=None, help="optimiser steps (default: the preset's)")
    p.add_argument("--batch-size", type=at_least(1), default=None, help="batch size (default: the preset's)")
    p.add_argument("--lr", type=positive_float, default=None, help="peak learning rate (default: the preset's)")
    p.add_argument("--warmup", type=at_least(0), default=None, help="linear warmup steps (default: the preset's)")
    p.add_argument("--save-every", type=at_least(1), default=None, help="save the resumable state every N steps")
    for flag, what in (("--d-model", "residual width"), ("--layers", "number of blocks"), ("--heads", "attention heads"),
                       ("--kv-heads", "key/value heads (llama, qwen3)"), ("--d-mlp", "FFN width")):
        p.add_argument(flag, type=int, default=None, help=f"{what} (default: the preset's)")
    p.add_argument("--rotary-pct", type=float, default=None, help="neox: fraction of each head RoPE rotates (default 0.25)")
    p.add_argument("--parallel-residual", type=_on_off, default=None, metavar="on|off",
                   help="neox: attention and MLP read the same input (on, the default) or one after the other (off)")
    p.add_argument("--resume", action="store_true", help="continue the interrupted run saved in OUT/.train_state")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    p.add_argument("--threads", type=at_least(1), default=None,
                   help="torch CPU threads (results are bitwise reproducible for a fixed count)")
    devices.add_arguments(p, "training and the final evaluation", dtype_default="float32", dtype_help=(
        "precision of the forward and backward (autocast; the master weights, the optimiser state and the written "
        "checkpoint stay float32)"))
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from ..training.trainer import TrainArgs, train

    place = devices.resolve(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    targs = TrainArgs(arch=args.arch, preset=args.preset, data=args.data, seed=args.seed, out=args.out,
                      tokenizer=args.tokenizer, gpt2_bpe=args.gpt2_bpe, vocab_size=args.vocab_size, steps=args.steps,
                      batch_size=args.batch_size, lr=args.lr, warmup=args.warmup, save_every=args.save_every, resume=args.resume,
                      force=args.force, shape={k: getattr(args, k) for k in SHAPE_FIELDS + NEOX_FIELDS},
                      device=str(place.device), dtype=args.dtype)
    out = train(targs)
    import json

    rec = json.loads((out / "symmerge.json").read_text())["train"]
    unit = "image" if args.arch == "vit" else "token"
    print(f"wrote {out}: {rec['hf_class']}, {rec['steps_done']} steps in {rec['wall_s']:.0f} s; "
          f"final train loss {rec['final_train_loss']:.4f}; "
          f"validation loss/{unit} {rec['validation']['loss']:.4f}, test loss/{unit} {rec['test']['loss']:.4f} "
          f"(accuracy {rec['test']['accuracy']:.4f})")
    return 0
