"""`symmerge align A B -o OUT --method weight|activation|learned|dual`: re-parameterise B to match A.

weight / activation / learned: OUT is B re-parameterised (B's class, B's function, A's coordinates).
dual: OUT/A and OUT/B, each its input re-parameterised, so that the straight line between them is low-loss.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import SymmergeError
from ..spec import FAMILIES
from .transform import parse_groups

METHODS = ("weight", "activation", "learned", "dual")
DATA_METHODS = ("activation", "learned", "dual")
#: learned/dual learning rates: dual at half, since at the start its two sides take opposite copies of
#: the one-sided step (tests/test_learned.py::test_dual_gradients_at_the_start_are_the_one_sided_gradient_twice)
DEFAULT_LR = {"learned": 1e-2, "dual": 5e-3}


def register(sub) -> None:
    p = sub.add_parser("align", help="find the symmetry that brings B closest to A; OUT is B re-parameterised")
    p.add_argument("a", help="target checkpoint folder (never modified)")
    p.add_argument("b", help="checkpoint folder to align (never modified)")
    p.add_argument("-o", "--out", required=True, help="output folder: B's class, B's function, A's coordinates")
    p.add_argument("--method", choices=METHODS, default="weight",
                   help="weight: data-free weight matching; activation: match activations on --data; learned: learn B's "
                   "symmetry against the loss on the path (from the weight-matching solution); dual: learn both endpoints' "
                   "continuous symmetries")
    p.add_argument("--groups", default=None,
                   help=f"comma-separated families, or 'all'; default: all but residual_scale. Families: {','.join(FAMILIES)}")
    p.add_argument("--max-iters", type=int, default=20, help="most sweeps over the groups (default 20)")
    p.add_argument("--precision", choices=("float64", "float32"), default="float64",
                   help="weight matching: precision of the algebra; float32 for large models (less memory, faster products)")
    p.add_argument("--data", default=None, help="activation/learned/dual: data set (see symmerge.data)")
    p.add_argument("--split", default="train",
                   help="activation matching: data split (default train; learned/dual learn on train, validate on validation)")
    p.add_argument("--batch-size", type=int, default=8, help="activation/learned/dual: sequences (images) per batch")
    p.add_argument("--seq-len", type=int, default=None,
                   help="activation/learned/dual: tokens per sequence (default: context)")
    p.add_argument("--max-batches", type=int, default=8,
                   help="activation/learned/dual: batches of data used (learned/dual: training batches)")
    p.add_argument("--param", default="auto",
                   help="learned/dual: cayley|cayley-signs|expm|polar|direct, or family=method,... (auto: cayley for "
                   "orthogonal, polar for invertible groups)")
    p.add_argument("--steps", type=int, default=200, help="learned/dual: optimiser steps")
    p.add_argument("--lr", type=float, default=None,
                   help=f"learned/dual: Adam learning rate, cosine decay (default {DEFAULT_LR['learned']:g} for learned, "
                   f"{DEFAULT_LR['dual']:g} for dual, whose two sides move the relative element twice as fast)")
    p.add_argument("--lam-range", default="0.4,0.6", help="learned/dual: λ drawn uniformly from this range per batch")
    p.add_argument("--lam-sampling", choices=("uniform", "peak"), default="uniform",
                   help="learned/dual: uniform λ draws, or peak: half the draws near the validation grid points "
                   "where the path stands highest above the straight line (for the bump uniform draws leave)")
    p.add_argument("--seed", type=int, default=0, help="learned/dual: seed of the batch order and λ draws")
    p.add_argument("--eval-every", type=int, default=25, help="learned/dual: steps between validation barriers")
    p.add_argument("--patience", type=int, default=0, help="learned/dual: stop after this many evaluations without "
                   "improvement (0: never)")
    p.add_argument("--val-batches", type=int, default=16,
                   help="learned/dual: validation batches (validation split) for choosing the best state; with 4 batches of 64 "
                   "MNIST images the choice followed noise (benchmarks/README.md)")
    p.add_argument("--val-points", type=int, default=5,
                   help="learned/dual: λ grid of the validation barrier, endpoints included (11 sees the whole path as "
                   "the reported barrier does, at 2.2x the validation cost)")
    p.add_argument("--resume", action="store_true", help="learned/dual: continue the interrupted run of OUT")
    p.add_argument("--json", default=None, help="write the report (objective per iteration, groups found) here")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    p.set_defaults(run=run)


def load_data(args, model_dir, split: str | None = None, max_batches: int | None = None) -> list[dict]:
    """Batches for the data-driven methods, through the project's data API."""
    from ..data import load_batches

    if not args.data:
        raise SymmergeError(f"--method {args.method} needs --data PATH (a data set to run both models on)")
    return load_batches(model_dir, args.data, split or args.split, args.batch_size, args.seq_len,
                        max_batches or args.max_batches)


def align(args, families=None, progress: bool = True):
    """Load both checkpoints, check they share a group, and match B to A: (model_a, model_b, result)."""
    from ..match.weight import weight_match
    from ..merge import check_compatible
    from ..model import load_model

    a, b = load_model(args.a), load_model(args.b)
    check_compatible(a, b, str(args.a), str(args.b))
    b.spec.select(families)  # unknown or absent families fail here, before any work
    if args.method == "activation":
        from ..match.activation import activation_match

        return a, b, activation_match(a, b, load_data(args, args.a), families)
    return a, b, weight_match(b.spec, a.params, b.params, families, args.max_iters, progress=progress)


def run_weight(args, families):
    """Weight matching streamed from the checkpoints, one block at a time, and OUT written block by block."""
    import torch

    from ..apply import apply
    from ..match.weight import weight_match
    from ..merge import check_compatible
    from ..model import LazyModel
    from ..stream import write_streaming

    dtype = getattr(torch, args.precision)
    a, b = LazyModel(args.a, dtype), LazyModel(args.b, dtype)
    check_compatible(a, b, str(args.a), str(args.b))
    b.spec.select(families)  # unknown or absent families fail here, before any work
    result = weight_match(b.spec, a, b, families, args.max_iters, progress=True, dtype=dtype)
    rep = report(args, b, result, families)
    meta = {**b.meta, "align": {k: rep[k] for k in ("method", "a", "b", "groups_selected", "objective")}}
    write_streaming(b, lambda part: apply(b.spec, result.g, part), args.out, force=args.force, extra=meta)
    return b, result, rep


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

    if not args.resume:
        prepare_output(args.out, args.force)  # fail before any work
    if args.method in DATA_METHODS and not args.data:
        raise SymmergeError(f"--method {args.method} needs --data PATH (a data set to run both models on)")
    if args.max_iters < 1:
        raise SymmergeError(f"--max-iters must be at least 1, got {args.max_iters}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise SymmergeError(f"cannot write the report to {args.json}: its folder does not exist")
    families = default_families(args)
    if args.method in ("learned", "dual"):
        return run_learned(args, families)
    if args.method == "weight":
        b, result, rep = run_weight(args, families)
    else:
        _, b, result = align(args, families)
        rep = report(args, b, result, families)
        save_model(b, apply(b.spec, result.g, b.params), args.out, force=args.force,
                   extra={"align": {k: rep[k] for k in ("method", "a", "b", "groups_selected", "objective")}})
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2))
    print(f"wrote {args.out}: {args.b} aligned to {args.a} by {args.method} matching; similarity "
          f"{result.history[0]:.6f} -> {result.history[-1]:.6f} in {rep['iterations']} iterations ({result.seconds:.1f}s)")
    return 0


def default_families(args) -> list[str] | None:
    """--groups as given; without it, every family but the residual scale.

    The scale that best fits B's writers to A's shrinks towards 0 when the two models' writers are
    weakly correlated (0.24 on the demo's ViT pair), and the shrunk endpoint raises the barrier
    (0.157 -> 0.396 there); `--groups all` includes it (needed to undo a planted scale)."""
    if args.groups is not None:
        return parse_groups(args.groups)
    from ..model import LazyModel

    return [f for f in LazyModel(args.b).spec.families() if f != "residual_scale"]


def run_learned(args, families) -> int:
    """Weight matching first (its element is absorbed into B), then learn against the loss on the path."""
    from ..match.learn_config import LearnConfig, parse_lam_range
    from ..match.outputs import learned_align

    lr = DEFAULT_LR[args.method] if args.lr is None else args.lr
    cfg = LearnConfig(method=args.method, groups=families, param=args.param, steps=args.steps, lr=lr,
                      lam_range=parse_lam_range(args.lam_range), lam_sampling=args.lam_sampling, seed=args.seed,
                      eval_every=args.eval_every, patience=args.patience, grid_points=args.val_points)
    cfg.validate()
    train = load_data(args, args.a, "train")
    val = load_data(args, args.a, "validation", args.val_batches)
    method = args.method
    args.method = "weight"  # the starting point: data-free weight matching over the same groups
    a, b, start = align(args, families)
    args.method = method
    rep = learned_align(a, b, train, val, cfg, args.out, init=start.g, force=args.force, resume=args.resume)
    rep["weight_matching"] = {"objective": start.history, "seconds": start.seconds}
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2, default=str))
    gaps = ", ".join(f"{o['output']}: {o['max_logit_diff']:.2e}" for o in rep["outputs"])
    before, after = rep.get("barrier_before"), rep.get("barrier_after")
    print(f"wrote {args.out}: {method} matching, validation barrier {before} -> {after}; largest logit change {gaps}")
    return 0
