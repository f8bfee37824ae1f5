"""`symmerge demo`: train a pair, measure every alignment method's barrier, print a table, write a plot."""

from __future__ import annotations

import argparse

from ..runtime import devices
from ..runtime.values import at_least, seed


def register(sub) -> None:
    from ..match.registry import COMPARED as METHODS  # not symmerge.workflows.demo (training, plotting) just to parse

    p = sub.add_parser("demo", help="train two models from two seeds and compare the barriers of every method")
    p.add_argument("-o", "--out", default="symmerge-demo", help="folder for the pair, the report and the plot")
    p.add_argument("--data", default="digits",
                   help="'digits' (two ViTs on scikit-learn's 8x8 digits) or a .txt file (two char-level GPT-2s)")
    p.add_argument("--seeds", default="0,1", help="the two training seeds")
    p.add_argument("--train-steps", type=at_least(1), default=None, help="training steps per model (default: the demo preset's)")
    p.add_argument("--learn-steps", type=at_least(1), default=150, help="steps of learned and dual matching")
    p.add_argument("--match-iters", type=at_least(1), default=20, help="weight-matching sweeps")
    p.add_argument("--test-batches", type=at_least(1), default=8, help="test batches the barriers are measured on")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    p.add_argument("--force", action="store_true", help="replace a folder that holds another run")
    devices.add_arguments(p, "every forward (training under autocast, matching, barriers)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..errors import SymmergeError
    from ..workflows.demo import DemoArgs, format_table, run_demo

    place = devices.resolve(args)
    try:
        seeds = tuple(seed(s) for s in args.seeds.split(","))
    except argparse.ArgumentTypeError as e:
        raise SymmergeError(f"--seeds {args.seeds!r}: {e}; give two, e.g. 0,1") from None
    if len(seeds) != 2 or seeds[0] == seeds[1]:
        raise SymmergeError(f"--seeds {args.seeds!r}: give two different integers, e.g. 0,1")
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    check_inputs(args.out, args.data)
    report = run_demo(DemoArgs(out=args.out, data=args.data, seeds=seeds, train_steps=args.train_steps,
                               learn_steps=args.learn_steps, match_iters=args.match_iters,
                               test_batches=args.test_batches, methods=methods, force=args.force,
                               device=str(place.device), dtype=args.dtype))
    print(format_table(report))
    print(f"report: {args.out}/demo-report.json, plot: {args.out}/demo-barriers.png")
    return 0


def check_inputs(out: str, data: str) -> None:
    """Refuse, before OUT is created, an OUT that cannot be written and data that cannot be read (a
    finished pair in OUT is reused, so a non-empty OUT is `run_demo`'s to judge)."""
    from ..data.batches import read_text
    from ..data.images import load_images
    from ..store.io import prepare_output

    prepare_output(out, force=True)
    if data.endswith(".txt"):
        read_text(data)
    elif data != "digits":
        load_images(data, "train")
