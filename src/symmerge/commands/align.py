"""`symmerge align A B -o OUT --method weight|activation|learned|dual`: re-parameterise B to match A.

weight / activation / learned: OUT is B re-parameterised (B's class, B's function, A's coordinates).
dual: OUT/A and OUT/B, each its input re-parameterised, so that the straight line between them is low-loss.
"""

from __future__ import annotations

from dataclasses import MISSING

from ..algebra.spec import FAMILIES
from ..match import registry
from ..match.options import DEFAULT_RECIPE
from ..runtime import devices
from . import out_dtype
from .help_sections import DATA, DEVICE, LEARNED, MATCHING, Sections, output_section, section_of
from .option_flags import add_option, help_of, option_fields, options_of
from .transform import parse_groups


def register(sub) -> None:
    p = sub.add_parser("align", help="find the symmetry that brings B closest to A; OUT is B re-parameterised")
    p.add_argument("a", help="target checkpoint folder or Hub id ORG/NAME[@REVISION] (never modified)")
    p.add_argument("b", help="checkpoint folder or Hub id ORG/NAME[@REVISION] to align (never modified)")
    output_section(p, "output folder: B's class, B's function, A's coordinates",
                   "write the report (objective per iteration, groups found) here", "replace a non-empty OUT")
    sections = Sections(p)
    how = sections.get(MATCHING, f"--groups takes the families {', '.join(FAMILIES)}")
    how.add_argument("--method", choices=list(registry.MATCHERS), default="weight",
                     help="; ".join(f"{m.name}: {m.help}" for m in registry.MATCHERS.values()))
    how.add_argument("--groups", default=None, help="comma-separated families, or 'all' (default: all but residual_scale)")
    data = sections.get(DATA)
    data.add_argument("--data", default=None, help="data set: a .txt file, an IDX folder, 'digits', hf:NAME (symmerge.data.batches)")
    data.add_argument("--split", default="train", help="activation matching's split (learned/dual: train and validation)")
    data.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the model's context)")
    for name in option_fields():
        add_option(sections.get(section_of(name)), name, help_of(name), default=DEFAULT_RECIPE if name == "recipe" else MISSING)
    learn = sections.get(LEARNED)
    learn.add_argument("--resume", action="store_true", help="continue the interrupted run of OUT")
    learn.add_argument("--shard-endpoints", type=int, nargs="?", const=0, default=None, metavar="K",
                       help="under torchrun: FSDP2 shards the frozen endpoints over the processes (K: over groups of K)")
    devices.add_arguments(sections.get(DEVICE), "matching",
                          dtype_help="working precision of the forward (default: learned/dual: the checkpoint's own "
                          "dtype; activation: --precision)")
    p.set_defaults(run=run, checkpoints=("a", "b"), spreads=lambda args: registry.get(args.method).validates)  # over torchrun's processes


def run(args) -> int:
    from ..api import align

    groups = "default" if args.groups is None else parse_groups(args.groups)
    result = align(args.a, args.b, args.out, args.method, options_of(args, args.method), groups=groups,
                   data=args.data, split=args.split, seq_len=args.seq_len, force=args.force,
                   out_dtype=out_dtype.resolve(args), device=args.device, dtype=args.dtype, resume=args.resume,
                   shard_endpoints=args.shard_endpoints, report=args.json, progress=True)
    if result is None:  # a torchrun process but the first: that one prints
        return 0
    rep = result.report
    if registry.get(args.method).validates:
        from ..match.learn_report import time_line

        note = rep.get("lr_note")
        gaps = ", ".join(f"{o['output']}: {o['max_logit_diff']:.2e}" for o in rep["outputs"])
        print(f"wrote {args.out}: {args.method} matching, {rep['end_line']}{f' ({note})' if note else ''}; "
              f"largest logit change {gaps}; {time_line(rep)}")
        return 0
    print(f"wrote {args.out}: {args.b} aligned to {args.a} by {args.method} matching; similarity "
          f"{rep['objective'][0]:.6f} -> {rep['objective'][-1]:.6f} in {rep['iterations']} iterations ({rep['seconds']:.1f}s)")
    return 0
