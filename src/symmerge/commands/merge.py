"""`symmerge merge M1 M2 ... Mn -o OUT`: every model into shared coordinates, OUT their weighted average."""

from __future__ import annotations

from .. import SymmergeError, devices, distributed
from ..match import registry
from ..spec import FAMILIES
from ..values import at_least
from . import out_dtype
from .align import add_option
from .checks import check_report_file
from .help_sections import DATA, DEVICE, LEARNED, MATCHING, ROUNDS, Sections, output_section

#: the learned / dual options `merge` takes (λ ranges and grids are the pairwise path's: not used here), and
#: the many-model options only learned / dual read
LEARN_OPTIONS = ("param", "steps", "lr", "seed", "eval_every", "extend", "val_batches", "recompute")
MANY_LEARN_OPTIONS = ("val_simplex_points",)


def register(sub) -> None:
    p = sub.add_parser("merge", help="align many models into shared coordinates and write their weighted average")
    p.add_argument("models", nargs="+", help="two or more checkpoint folders or Hub ids ORG/NAME[@REVISION] of one "
                   "architecture (never modified); mixed widths are expanded into the widest")
    out = output_section(p, "output folder: the weighted average, a stock checkpoint",
                         "write the report (objective per round, rounds, groups found) here", "replace non-empty output folders")
    out.add_argument("--aligned", default=None, help="also write every model in the shared coordinates (its own "
                     "class and function) to DIR/1 ... DIR/n")
    sections = Sections(p)
    how = sections.get(MATCHING)
    how.add_argument("--method", choices=list(registry.MATCHERS), default="weight",
                     help=f"the matcher (many-model forms: {', '.join(registry.many_methods())})")
    how.add_argument("--weights", default=None, help="w1,...,wn: non-negative, summing to 1 (default: uniform)")
    how.add_argument("--groups", default=None,
                     help=f"comma-separated families, or 'all' (default: the spec's choice, as align). Families: {','.join(FAMILIES)}")
    add_option(how, registry.OPTIONS["precision"], registry.OPTIONS["precision"].help)
    rounds = sections.get(ROUNDS, "every model matched to the mean of the others, round after round")
    add_option(rounds, registry.OPTIONS["max_iters"], f"weight matching: {registry.OPTIONS['max_iters'].help} per match")
    for opt in registry.MANY_OPTIONS.values():
        if opt.name not in MANY_LEARN_OPTIONS:
            add_option(rounds, opt, opt.help)
    data = sections.get(DATA)
    data.add_argument("--data", default=None, help="data set: a .txt file, an IDX folder, 'digits', hf:NAME (symmerge.data); "
                      "train split, learned/dual validate on validation")
    data.add_argument("--batch-size", type=at_least(1), default=8, help="sequences (images) per batch")
    data.add_argument("--seq-len", type=at_least(1), default=None, help="tokens per sequence (default: context)")
    data.add_argument("--max-batches", type=at_least(1), default=8, help="training batches")
    learn = sections.get(LEARNED, f"the {registry.MANY_RECIPE} recipe's defaults; every flag overrides them")
    for name in LEARN_OPTIONS:
        text = registry.OPTIONS[name].help.replace(" (instead of --epochs)", "")  # merge has no --epochs
        add_option(learn, registry.OPTIONS[name], text, recipes=(registry.MANY_RECIPE,))
    for name in MANY_LEARN_OPTIONS:
        add_option(learn, registry.MANY_OPTIONS[name], registry.MANY_OPTIONS[name].help.removeprefix("learned/dual: "))
    learn.add_argument("--resume", action="store_true", help="continue the interrupted run of OUT")
    devices.add_arguments(sections.get(DEVICE, "learned and dual matching only; the others run on the CPU"),
                          "the forward", dtype_help="working precision of the forward (default: the checkpoint's own dtype)")
    p.set_defaults(run=run, checkpoints=("models",), spreads=lambda args: registry.get(args.method).validates)


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
    group = distributed.init(args.device) if matcher.validates else distributed.current()  # torchrun: learned/dual
    data = group.agree(lambda: load_data(args, matcher, opts))
    rep = merge_models(args.models, args.out, weights, args.method, families, args.aligned,
                       args.force, opts, progress=True, dtype=out_dtype.resolve(args), data=data, place=place,
                       data_name=args.data, resume=args.resume)
    if rep is None:  # not the first of several processes: it writes
        return 0
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
