"""`symmerge merge M1 M2 ... Mn -o OUT`: every model into shared coordinates, OUT their weighted average."""

from __future__ import annotations

from .. import SymmergeError, devices
from ..match import registry
from ..spec import FAMILIES
from ..values import at_least
from . import out_dtype
from .align import add_option
from .checks import check_report_file

#: the learned / dual options `merge` takes (λ ranges and grids are the pairwise path's: not used here)
LEARN_OPTIONS = ("param", "steps", "lr", "seed", "eval_every", "val_batches", "recompute")


def register(sub) -> None:
    p = sub.add_parser("merge", help="align many models into shared coordinates and write their weighted average")
    p.add_argument("models", nargs="+", help="two or more checkpoint folders or Hub ids ORG/NAME[@REVISION] of one "
                   "architecture (never modified); "
                   "mixed widths are expanded into the widest")
    p.add_argument("-o", "--out", required=True, help="output folder: the weighted average, a stock checkpoint")
    p.add_argument("--method", choices=list(registry.MATCHERS), default="weight",
                   help=f"the matcher (many-model forms: {', '.join(registry.many_methods())})")
    p.add_argument("--weights", default=None, help="w1,...,wn: non-negative, summing to 1 (default: uniform)")
    p.add_argument("--groups", default=None,
                   help=f"comma-separated families, or 'all' (default: the spec's choice, as align). Families: {','.join(FAMILIES)}")
    p.add_argument("--aligned", default=None, help="also write every model re-parameterised into the shared "
                   "coordinates (its own class and function) to DIR/1 ... DIR/n")
    data = ", ".join(m.name for m in registry.MATCHERS.values() if m.needs_data)
    p.add_argument("--data", default=None, help=f"{data}: data set (see symmerge.data); activation and learning use "
                   "its train split, learned/dual choose the best state on validation")
    p.add_argument("--batch-size", type=at_least(1), default=8, help=f"{data}: sequences (images) per batch")
    p.add_argument("--seq-len", type=at_least(1), default=None, help=f"{data}: tokens per sequence (default: context)")
    p.add_argument("--max-batches", type=at_least(1), default=8, help=f"{data}: training batches")
    for name in ("max_iters", "precision"):
        opt = registry.OPTIONS[name]
        add_option(p, opt, f"weight matching: {opt.help}")
    for name in LEARN_OPTIONS:
        opt = registry.OPTIONS[name]
        add_option(p, opt, f"learned/dual (merge uses the {registry.MANY_RECIPE} recipe): {opt.help}")
    for opt in registry.MANY_OPTIONS.values():
        add_option(p, opt, opt.help)
    p.add_argument("--json", default=None, help="write the report (objective per round, rounds, groups found) here")
    p.add_argument("--force", action="store_true", help="replace non-empty output folders")
    out_dtype.add_argument(p)
    devices.add_arguments(p, "the forward of learned/dual")
    p.set_defaults(run=run, checkpoints=("models",))


def load_data(args, matcher, opts):
    """registry.Data for a data-driven matcher (train batches; validation batches where it validates).
    `run` has already refused a data-driven method without --data."""
    from ..data import load_batches

    if not matcher.needs_data:
        return None
    first = args.models[0]
    train = load_batches(first, args.data, "train", args.batch_size, args.seq_len, args.max_batches)
    val = (load_batches(first, args.data, "validation", args.batch_size, args.seq_len, opts["val_batches"])
           if matcher.validates else [])
    return registry.Data(train, val)


def run(args) -> int:
    from ..merge_many import merge_models
    from ..report import write
    from ..simplex import parse_weights

    check_report_file(args.json, "--json", [args.out, args.aligned])
    matcher = registry.get(args.method)
    place = devices.resolve(args)
    if not matcher.forward and (args.device or args.dtype):
        raise SymmergeError(f"--device and --dtype are for merge --method learned or dual; {args.method} matching "
                            "runs on the CPU, in --precision")
    if matcher.needs_data and not args.data:
        raise SymmergeError(f"merge --method {args.method} needs --data PATH (a data set to run the models on)")
    families = "default"
    if args.groups is not None:
        from .transform import parse_groups

        families = parse_groups(args.groups)
    opts = registry.many_options_for(args.method, vars(args))
    weights = parse_weights(args.weights)
    from ..simplex import check_weights

    check_weights(weights, len(args.models))  # before the data is read
    data = load_data(args, matcher, opts)
    rep = merge_models(args.models, args.out, weights, args.method, families, args.aligned,
                       args.force, opts, progress=True, dtype=out_dtype.resolve(args), data=data, place=place)
    if args.json:
        write(args.json, "merge", rep)
    h = rep["objective"]
    stop = (f"converged: gain at most {rep['round_tol']:g} relative" if rep["converged"]
            else f"stopped at --max-rounds {rep['rounds']}")
    what = "similarity to the mean" if args.method != "activation" else "minus the average's loss"
    tail = (f"; validation objective {rep['objective_before']:.4f} -> {rep['objective_after']:.4f} ({rep['gauge']})"
            if matcher.validates else "")
    print(f"wrote {args.out}: {len(args.models)} models merged by {args.method} matching; {what} "
          f"{h[0]:.6f} -> {h[-1]:.6f} in {rep['rounds']} rounds ({stop}, {rep['seconds']:.1f}s){tail}")
    return 0
