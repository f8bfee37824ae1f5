"""`symmerge merge M1 M2 ... Mn -o OUT`: every model into shared coordinates, OUT their weighted average."""

from __future__ import annotations

from dataclasses import MISSING, fields

from ..algebra.spec import FAMILIES
from ..match import registry
from ..match.options import DEFAULT_RECIPE, ManyOptions
from ..runtime import devices
from ..runtime.values import at_least
from . import out_dtype
from .help_sections import DATA, DEVICE, LEARNED, MATCHING, ROUNDS, Sections, output_section
from .option_flags import add_option, help_of, options_of
from .transform import parse_groups

#: the learned / dual options `merge` takes (λ ranges and grids are the pairwise path's: not used here), and
#: the many-model options only learned / dual read
LEARN_OPTIONS = ("start_from", "recipe", "param", "steps", "epochs", "lr", "seed", "eval_every", "extend", "val_batches", "val_data",
                 "recompute")
MANY_LEARN_OPTIONS = ("val_simplex_points",)
MANY = [f.name for f in fields(ManyOptions)]
#: where an option means something else for many models than for a pair
MANY_HELP = {"val_batches": "validation batches that choose the best state; auto: every batch of the split"}


def register(sub) -> None:
    p = sub.add_parser("merge", help="align many models into shared coordinates and write their weighted average")
    p.add_argument("models", nargs="+", help="two or more checkpoint folders or Hub ids ORG/NAME[@REVISION] of one "
                   "architecture (never modified)")
    out = output_section(p, "output folder: the weighted average, a stock checkpoint",
                         "write the report (objective per round, rounds, groups found) here", "replace non-empty output folders")
    out.add_argument("--aligned", default=None, metavar="DIR", help="also write every model in the shared coordinates (its own "
                     "class and function) to DIR/1 ... DIR/n")
    sections = Sections(p)
    how = sections.get(MATCHING, f"mixed widths are expanded into the widest; --groups takes the families "
                       f"{', '.join(FAMILIES)}")
    how.add_argument("--method", choices=list(registry.MATCHERS), default="weight",
                     help=f"the matcher (many-model forms: {', '.join(registry.many_methods())})")
    how.add_argument("--weights", default=None, help="w1,...,wn: non-negative, summing to 1 (default: uniform)")
    how.add_argument("--groups", default=None, help="comma-separated families, or 'all' (default: as align)")
    add_option(how, "precision", help_of("precision"))
    add_option(how, "blocks", "activation: per-block groups (best by the average's loss, weight, activation)")
    rounds = sections.get(ROUNDS, "every model matched to the mean of the others, round after round")
    add_option(rounds, "max_iters", f"weight matching: {help_of('max_iters')} per match")
    for name in MANY:
        if name not in MANY_LEARN_OPTIONS:
            add_option(rounds, name, help_of(name, ManyOptions), cls=ManyOptions)
    data = sections.get(DATA, "activation, learned and dual matching run the models on batches of --data")
    data.add_argument("--data", default=None, help="data set, as align's --data: the train split (learned/dual: validation too)")
    data.add_argument("--batch-size", type=at_least(1), default=None, help="sequences (images) per batch (default: "
                      "activation: 8; learned/dual: the recipe's)")
    data.add_argument("--seq-len", type=at_least(1), default=None, help="tokens per sequence (default: context)")
    data.add_argument("--max-batches", type=at_least(1), default=None, help="training batches (default: activation: "
                      "8; learned/dual: the recipe's, full: all of the split)")
    learn = sections.get(LEARNED, "the recipe's defaults, as align's; every flag overrides them")
    for name in LEARN_OPTIONS:
        text = MANY_HELP.get(name, help_of(name))
        add_option(learn, name, text, default=DEFAULT_RECIPE if name == "recipe" else MISSING)
    for name in MANY_LEARN_OPTIONS:
        add_option(learn, name, help_of(name, ManyOptions).removeprefix("learned/dual: "), cls=ManyOptions)
    learn.add_argument("--resume", action="store_true", help="continue the interrupted run of OUT")
    devices.add_arguments(sections.get(DEVICE, "activation, learned and dual matching; weight matching runs on the CPU"),
                          "the forward", dtype_help="working precision of the forward (default: learned/dual: the "
                          "checkpoint's own dtype; activation: --precision)")
    p.set_defaults(run=run, checkpoints=("models",), spreads=lambda args: registry.get(args.method).validates)


def run(args) -> int:
    from ..algebra.simplex import parse_weights
    from ..api import merge

    groups = "default" if args.groups is None else parse_groups(args.groups)
    result = merge(args.models, args.out, args.method, options_of(args, args.method), ManyOptions.of(vars(args)),
                   weights=parse_weights(args.weights), groups=groups, data=args.data, batch_size=args.batch_size,
                   max_batches=args.max_batches, seq_len=args.seq_len, aligned=args.aligned, force=args.force,
                   out_dtype=out_dtype.resolve(args), device=args.device, dtype=args.dtype, resume=args.resume,
                   report=args.json, progress=True)
    if result is None:  # not the first of several processes: that one writes and prints
        return 0
    rep = result.report
    h = rep["objective"]
    stop = (f"converged: gain at most {rep['round_tol']:g} relative" if rep["converged"]
            else f"stopped at --max-rounds {rep['rounds']}")
    rounds_of = rep.get("start", {}).get("method", args.method)  # the matcher whose rounds `objective` holds
    what = "similarity to the mean" if rounds_of != "activation" else "minus the average's loss"
    tail = (f"; validation objective {rep['objective_before']:.4f} -> {rep['objective_after']:.4f} ({rep['gauge']})"
            f"{_rate(rep)}" if registry.get(args.method).validates else "")
    print(f"wrote {args.out}: {len(args.models)} models merged by {args.method} matching; {what} "
          f"{h[0]:.6f} -> {h[-1]:.6f} in {rep['rounds']} rounds ({stop}, {rep['seconds']:.1f}s){tail}")
    return 0


def _rate(rep: dict) -> str:
    """Learned / dual: the rate the run took, and how it was chosen."""
    from ..match.learn_report import rate_text

    note = rep.get("lr_note")
    return f"; {note}" if note else f"; {rate_text(rep['settings']['lr'], rep.get('lr_search'))}"
