"""`symmerge align A B -o OUT --method weight`: re-parameterise B to match A (same function as B)."""

from __future__ import annotations

import json
from pathlib import Path

from .. import SymmergeError
from ..spec import FAMILIES
from .transform import parse_groups

METHODS = ("weight", "activation")


def register(sub) -> None:
    p = sub.add_parser("align", help="find the symmetry that brings B closest to A; OUT is B re-parameterised")
    p.add_argument("a", help="target checkpoint folder (never modified)")
    p.add_argument("b", help="checkpoint folder to align (never modified)")
    p.add_argument("-o", "--out", required=True, help="output folder: B's class, B's function, A's coordinates")
    p.add_argument("--method", choices=METHODS, default="weight",
                   help="weight: data-free weight matching; activation: match activations on --data")
    p.add_argument("--groups", default=None, help=f"comma-separated families (default all): {','.join(FAMILIES)}")
    p.add_argument("--max-iters", type=int, default=20, help="most sweeps over the groups (default 20)")
    p.add_argument("--data", default=None, help="activation matching: data set (see symmerge.data)")
    p.add_argument("--split", default="train", help="activation matching: data split (default train)")
    p.add_argument("--batch-size", type=int, default=8, help="activation matching: sequences per batch")
    p.add_argument("--seq-len", type=int, default=128, help="activation matching: tokens per sequence")
    p.add_argument("--max-batches", type=int, default=8, help="activation matching: batches of data used")
    p.add_argument("--json", default=None, help="write the report (objective per iteration, groups found) here")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    p.set_defaults(run=run)


def load_data(args, model_dir) -> list[dict]:
    """Batches for activation matching, through the project's data API."""
    if not args.data:
        raise SymmergeError("--method activation needs --data PATH (a data set to run both models on)")
    try:
        from ..data import load_batches
    except ImportError:
        raise SymmergeError("activation matching needs symmerge.data, which this installation lacks; use --method weight") from None
    return load_batches(model_dir, args.data, args.split, args.batch_size, args.seq_len, args.max_batches)


def align(args, families=None, progress: bool = True):
    """Load both checkpoints, check they share a group, and match B to A: (model_a, model_b, result)."""
    from ..match.compat import check_compatible
    from ..match.weight import weight_match
    from ..model import load_model

    if args.max_iters < 1:
        raise SymmergeError(f"--max-iters must be at least 1, got {args.max_iters}")
    a, b = load_model(args.a), load_model(args.b)
    check_compatible(a, b, str(args.a), str(args.b))
    b.spec.select(families)  # unknown or absent families fail here, before any work
    if args.method == "activation":
        from ..match.activation import activation_match

        return a, b, activation_match(a, b, load_data(args, args.a), families)
    return a, b, weight_match(b.spec, a.params, b.params, families, args.max_iters, progress=progress)


def report(args, b, result, families) -> dict:
    from ..match.summary import summarize

    found = summarize(b.spec, result.g, b.spec.select(families))
    return {
        "method": args.method, "a": str(args.a), "b": str(args.b), "out": str(args.out),
        "groups_selected": families or b.spec.families(),
        "objective_name": "similarity = 1 - ||A - g.B||^2 / ||A||^2 over canonical tensors"
        + (" (activation matching: before and after; it optimises the activations' fit)" if args.method == "activation" else ""),
        "objective": result.history, "iterations": len(result.history) - 1, "seconds": result.seconds,
        "steps": result.steps, "steps_without_improvement": result.rejected, **result.extra, **found,
    }


def run(args) -> int:
    from ..apply import apply
    from ..io import prepare_output
    from ..model import save_model

    prepare_output(args.out, args.force)  # fail before any work
    if args.method == "activation" and not args.data:
        raise SymmergeError("--method activation needs --data PATH (a data set to run both models on)")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise SymmergeError(f"cannot write the report to {args.json}: its folder does not exist")
    families = parse_groups(args.groups)
    _, b, result = align(args, families)
    params = apply(b.spec, result.g, b.params)
    rep = report(args, b, result, families)
    save_model(b, params, args.out, force=args.force,
               extra={"align": {k: rep[k] for k in ("method", "a", "b", "groups_selected", "objective")}})
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2))
    print(f"wrote {args.out}: {args.b} aligned to {args.a} by {args.method} matching; similarity "
          f"{result.history[0]:.6f} -> {result.history[-1]:.6f} in {rep['iterations']} iterations ({result.seconds:.1f}s)")
    return 0
