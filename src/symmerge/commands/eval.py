"""`symmerge eval MODEL --data PATH`: mean loss per token/image and accuracy, with standard errors."""

from __future__ import annotations

import math

from .. import devices
from ..values import at_least
from .checks import check_report_file


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


def jsonable(d: dict) -> dict:
    """NaN (a standard error of a single batch) becomes null, so the file is strict JSON."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def run(args) -> int:
    from pathlib import Path

    from .. import SymmergeError
    from ..data import is_vision, load_batches
    from ..evaluate import evaluate
    from ..io import Checkpoint, load_config
    from ..model import hf_class, runs_in

    place = devices.resolve(args)
    check_report_file(args.json, "--json")
    ckpt = Checkpoint(args.model)  # refuses pickles and folders without safetensors
    dtype = place.working(ckpt.dtype())
    batches = load_batches(args.model, args.data, args.split, args.batch_size, args.seq_len, args.max_batches)
    config = load_config(Path(args.model))
    names = getattr(config, "architectures", None) or []
    if not names:
        raise SymmergeError(f"{args.model}/config.json names no architectures; cannot pick the model class")
    try:
        cls = hf_class(names[0])
    except AttributeError:
        raise SymmergeError(f"{args.model}: transformers has no class {names[0]} (config.json architectures)") from None
    model = cls.from_pretrained(str(ckpt.path), local_files_only=True, use_safetensors=True, dtype=dtype,
                                config=runs_in(config, dtype))
    model.to(place.device)
    res = evaluate(model, batches)
    unit = "image" if is_vision(config) else "token"
    print(f"{args.model} on {args.data} [{args.split}]: loss/{unit} {res['loss']:.4f} ± {res['loss_se']:.4f}, "
          f"accuracy {res['accuracy']:.4f} ± {res['accuracy_se']:.4f} "
          f"({res['n_items']} {'images' if unit == 'image' else 'sequences'}, {res['n_scored']} scored, {res['n_batches']} batches)")
    if args.json:
        rec = jsonable(res | {"model": str(args.model), "data": args.data, "split": args.split,
                              **place.record(dtype)})
        from ..report import write

        write(args.json, "eval", rec)
    return 0
