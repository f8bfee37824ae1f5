"""`symmerge merge M1 M2 ... Mn -o OUT`: every model into shared coordinates, OUT their weighted average."""

from __future__ import annotations

from ..match import registry
from ..spec import FAMILIES
from . import out_dtype
from .checks import check_report_file


def register(sub) -> None:
    p = sub.add_parser("merge", help="align many models into shared coordinates and write their weighted average")
    p.add_argument("models", nargs="+", help="two or more checkpoint folders of one architecture (never modified)")
    p.add_argument("-o", "--out", required=True, help="output folder: the weighted average, a stock checkpoint")
    p.add_argument("--method", choices=list(registry.MATCHERS), default="weight",
                   help=f"the matcher (many-model forms built: {', '.join(registry.many_methods())})")
    p.add_argument("--weights", default=None, help="w1,...,wn: non-negative, summing to 1 (default: uniform)")
    p.add_argument("--groups", default=None,
                   help=f"comma-separated families, or 'all' (default: the spec's choice, as align). Families: {','.join(FAMILIES)}")
    p.add_argument("--aligned", default=None, help="also write every model re-parameterised into the shared "
                   "coordinates (its own class and function) to DIR/1 ... DIR/n")
    for name in ("max_iters", "precision"):
        opt = registry.OPTIONS[name]
        _add(p, opt, f"pairwise matcher: {opt.help}")
    for opt in registry.MANY_OPTIONS.values():
        _add(p, opt, opt.help)
    p.add_argument("--json", default=None, help="write the report (objective per round, rounds, groups found) here")
    p.add_argument("--force", action="store_true", help="replace non-empty output folders")
    out_dtype.add_argument(p)
    p.set_defaults(run=run)


def _add(p, opt, text: str) -> None:
    kw = {"type": opt.type} if opt.type else {}  # the registry's type carries the bounds
    if opt.choices:
        kw["choices"] = opt.choices
    p.add_argument(opt.flag, default=opt.default, help=text, **kw)


def run(args) -> int:
    from ..merge_many import merge_models, parse_weights
    from ..report import write

    check_report_file(args.json, "--json")
    families = "default"
    if args.groups is not None:
        from .transform import parse_groups

        families = parse_groups(args.groups)
    rep = merge_models(args.models, args.out, parse_weights(args.weights), args.method, families, args.aligned,
                       args.force, vars(args), progress=True, dtype=out_dtype.resolve(args))
    if args.json:
        write(args.json, "merge", rep)
    h = rep["objective"]
    print(f"wrote {args.out}: {len(args.models)} models merged by {args.method} matching; similarity to the mean "
          f"{h[0]:.6f} -> {h[-1]:.6f} in {rep['rounds']} rounds ({rep['seconds']:.1f}s)")
    return 0
