"""`symmerge interpolate A B --lam L -o OUT`: write (1-L)·A + L·B as a stock checkpoint of A's class."""

from __future__ import annotations

from ..runtime.values import finite_float
from . import out_dtype


def register(sub) -> None:
    p = sub.add_parser("interpolate", help="write (1-λ)·A + λ·B (in canonical form) as a stock HF checkpoint")
    p.add_argument("a", help="checkpoint folder or Hub id ORG/NAME[@REVISION] A (λ = 0)")
    p.add_argument("b", help="checkpoint folder or Hub id ORG/NAME[@REVISION] B (λ = 1)")
    p.add_argument("--lam", type=finite_float, required=True, help="interpolation weight λ in [0, 1]")
    p.add_argument("--extrapolate", action="store_true", help="allow λ outside [0, 1]")
    p.add_argument("-o", "--out", required=True, help="output folder")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    out_dtype.add_argument(p)
    p.set_defaults(run=run, checkpoints=("a", "b"))


def run(args) -> int:
    from ..api import interpolate

    interpolate(args.a, args.b, args.lam, args.out, extrapolate=args.extrapolate, force=args.force,
                out_dtype=out_dtype.resolve(args))
    print(f"wrote {args.out}: (1 - {args.lam})·A + {args.lam}·B")
    return 0
