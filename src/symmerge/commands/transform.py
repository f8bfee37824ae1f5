"""`symmerge transform MODEL -o OUT --seed N [--groups LIST]`: apply a random group element."""

from __future__ import annotations

import torch

from ..spec import FAMILIES
from . import out_dtype
from .checks import at_least, seed


def register(sub) -> None:
    p = sub.add_parser("transform", help="apply a random symmetry; the output computes the same function")
    p.add_argument("model", help="Hugging Face checkpoint folder (never modified)")
    p.add_argument("-o", "--out", required=True, help="output folder (must be empty or absent unless --force)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the random group element")
    p.add_argument("--groups", default=None, help=f"comma-separated families (default: all): {','.join(FAMILIES)}")
    p.add_argument("--spread", type=at_least(1.0, float), default=2.0,
                   help="scales and singular values drawn in [1/s, s] (s >= 1)")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    out_dtype.add_argument(p)
    p.set_defaults(run=run)


def parse_groups(text: str | None) -> list[str] | None:
    return None if text in (None, "", "all") else [g.strip() for g in text.split(",") if g.strip()]


def run(args) -> int:
    from ..apply import apply
    from ..io import prepare_output
    from ..spec import random_element
    from ..stream import LazyModel, write_streaming

    prepare_output(args.out, args.force, [args.model])  # fail before any work
    model = LazyModel(args.model)  # block by block: memory does not grow with depth
    families = parse_groups(args.groups)
    g = random_element(model.spec, torch.Generator().manual_seed(args.seed), families, args.spread)
    extra = {"transform": {"source": str(args.model), "seed": args.seed, "groups": families or "all"}}
    out = write_streaming(model, lambda part: apply(model.spec, g, part), args.out, force=args.force, extra=extra,
                          dtype=out_dtype.resolve(args))
    print(f"wrote {out}: {model.shape.hf_class} transformed by a random element of "
          f"{', '.join(families or model.spec.families())} (seed {args.seed})")
    return 0
