"""`symmerge eval MODEL --data PATH`: mean loss per token/image and accuracy, with standard errors."""

from __future__ import annotations

from ..runtime import devices
from ..runtime.values import at_least


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a checkpoint: mean loss per token/image and accuracy, with standard errors")
    p.add_argument("model", help="Hugging Face checkpoint folder or Hub id ORG/NAME[@REVISION] (with its tokenizer or "
                   "preprocessor_config.json)")
    p.add_argument("--data", required=True, help="a .txt file, a folder of IDX files, mnist.pkl.gz, 'digits' or hf:NAME")
    p.add_argument("--split", default="test", choices=("train", "validation", "test", "all"), help="which part of the data")
    p.add_argument("--batch-size", type=at_least(1), default=8, help="sequences or images per batch")
    p.add_argument("--seq-len", type=int, default=None, help="window length in tokens (default: the model's context)")
    p.add_argument("--max-batches", type=at_least(1), default=None, help="evaluate only the first N batches")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the result as JSON to FILE")
    devices.add_arguments(p)
    p.set_defaults(run=run, checkpoints=("model",))


def run(args) -> int:
    from ..api import evaluate

    result = evaluate(args.model, args.data, split=args.split, batch_size=args.batch_size, max_batches=args.max_batches,
                      seq_len=args.seq_len, device=args.device, dtype=args.dtype, report=args.json)
    res, unit = result.report, result.notes["unit"]
    print(f"{args.model} on {args.data} [{args.split}]: loss/{unit} {_f(res['loss'])} ± {_f(res['loss_se'])}, "
          f"accuracy {_f(res['accuracy'])} ± {_f(res['accuracy_se'])} "
          f"({res['n_items']} {'images' if unit == 'image' else 'sequences'}, {res['n_scored']} scored, {res['n_batches']} batches)")
    return 0


def _f(x) -> str:
    """A figure as printed: 4 decimals, nan for the None of a standard error of one batch."""
    return "nan" if x is None else f"{x:.4f}"
