"""`symmerge transform MODEL -o OUT --seed N [--groups LIST]`: apply a random group element."""

from __future__ import annotations

from ..algebra.spec import FAMILIES
from ..runtime.values import at_least, seed
from . import out_dtype


def register(sub) -> None:
    p = sub.add_parser("transform", help="apply a random symmetry; the output computes the same function")
    p.add_argument("model", help="Hugging Face checkpoint folder or Hub id ORG/NAME[@REVISION] (never modified)")
    p.add_argument("-o", "--out", required=True, help="output folder (must be empty or absent unless --force)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the random group element")
    p.add_argument("--groups", default=None, help=f"comma-separated families (default: all): {','.join(FAMILIES)}")
    p.add_argument("--spread", type=at_least(1.0, float, SPREAD_MAX, SPREAD_WHY), default=2.0,
                   help=f"scales and singular values drawn in [1/s, s] (1 <= s <= {SPREAD_MAX:g})")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    out_dtype.add_argument(p)
    p.set_defaults(run=run, checkpoints=("model",))


#: A QK or OV map and its inverse scale a circuit by up to s^2 each way, the residual scale the norms' eps by s^2:
#: at s = 100 a float32 GPT-2's logits still agree to ~4e-6, at s = 1e6 they differ by 0.5, at 1e30 they are NaN.
SPREAD_MAX = 100.0
SPREAD_WHY = ": a wider spread makes elements too ill-conditioned for the output to compute its input's function"


def parse_groups(text: str | None) -> list[str] | None:
    return None if text in (None, "", "all") else [g.strip() for g in text.split(",") if g.strip()]


def run(args) -> int:
    from ..api import transform

    families = parse_groups(args.groups)
    result = transform(args.model, args.out, args.seed, families, args.spread, force=args.force,
                       out_dtype=out_dtype.resolve(args))
    print(f"wrote {result.out}: {result['hf_class']} transformed by a random element of "
          f"{', '.join(result['families'])} (seed {args.seed})")
    return 0
