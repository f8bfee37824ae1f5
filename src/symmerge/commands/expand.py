"""`symmerge expand NARROW --like WIDE -o OUT`: NARROW written in WIDE's config, computing NARROW's function."""

from __future__ import annotations

from . import out_dtype


def register(sub) -> None:
    p = sub.add_parser("expand", help="write a narrow model as a checkpoint of a wider config (same function)")
    p.add_argument("narrow", help="checkpoint folder or Hub id ORG/NAME[@REVISION] of the narrow model (never modified)")
    p.add_argument("--like", required=True, metavar="WIDE",
                   help="checkpoint folder or Hub id ORG/NAME[@REVISION] (only its config.json is read) of the wide "
                   "model's architecture and sizes")
    p.add_argument("-o", "--out", required=True, help="output folder (must be empty or absent unless --force)")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    out_dtype.add_argument(p)
    p.set_defaults(run=run, checkpoints=("narrow", "like"))


def run(args) -> int:
    from ..api import expand

    result = expand(args.narrow, args.like, args.out, force=args.force, out_dtype=out_dtype.resolve(args), progress=True)
    n, w = result["narrow_shape"], result["wide_shape"]
    print(f"wrote {result.out}: {n['hf_class']} d_model {n['d_model']} -> {w['d_model']}, d_mlp {n['d_mlp']} -> "
          f"{w['d_mlp']}, heads {n['n_heads']}x{n['d_head']} -> {w['n_heads']}x{w['d_head']} (writer scale "
          f"{result['writer_scale']:.6g}, score scale {result['score_scale']:.6g}); same function as {args.narrow}")
    return 0
