"""`--out-dtype float32|bfloat16|float16`: the dtype a command writes its checkpoint in.

The algebra runs in float64 whatever the choice; the output is cast once, at export. Default: the
input's storage dtype. A narrower dtype than the input's rounds the weights (the function then agrees
to that dtype's precision only)."""

from __future__ import annotations

CHOICES = ("float32", "bfloat16", "float16")


def add_argument(p) -> None:
    p.add_argument("--out-dtype", choices=CHOICES, default=None,
                   help="dtype of the written checkpoint (default: the input's dtype)")


def resolve(args):
    """The torch dtype of --out-dtype, or None (the input's)."""
    import torch

    name = getattr(args, "out_dtype", None)
    return None if name is None else getattr(torch, name)
