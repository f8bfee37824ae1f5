"""`symmerge barrier A B --data PATH`: loss and accuracy along the straight line, and the barrier.

With more than two models (`symmerge barrier M1 ... Mn`), the barrier of many models
(`barrier_many.many_barrier`): the weighted average's excess, the largest pairwise barrier and the
largest excess at Dirichlet points of the simplex; `--plot` draws the loss over the triangle for n = 3."""

from __future__ import annotations

from pathlib import Path

from .. import devices
from ..values import at_least, seed
from .checks import check_plot_file, check_report_file


def add_data_args(p, split_default: str = "test") -> None:
    p.add_argument("--data", required=True, help="a .txt file, a folder of IDX files, mnist.pkl.gz, or 'digits'")
    p.add_argument("--split", default=split_default, choices=["train", "validation", "test", "all"],
                   help="which part of the data")
    p.add_argument("--batch-size", type=at_least(1), default=8, help="sequences or images per batch")
    p.add_argument("--max-batches", type=at_least(1), default=None, help="evaluate on at most this many batches")
    p.add_argument("--seq-len", type=int, default=None, help="window length for text (default: the model's context)")


def register(sub) -> None:
    p = sub.add_parser("barrier", help="measure the loss and accuracy barrier between two (or more) models")
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="checkpoint folders or Hub ids ORG/NAME[@REVISION]: A (λ = 0; its tokenizer / image processor "
                   "prepares the data) and B "
                   "(λ = 1), or three or more models for the barrier of many models")
    add_data_args(p)
    p.add_argument("--points", type=at_least(2), default=11, help="evenly spaced λ values, endpoints included (per pair)")
    p.add_argument("--refine", action="store_true", help="add 4 points around the peak (two models)")
    p.add_argument("--weights", default=None, help="n > 2: w1,...,wn of the average (default: uniform)")
    p.add_argument("--simplex-points", type=at_least(1), default=None, help="n > 2: Dirichlet points of the simplex "
                   "(default: 16)")
    p.add_argument("--seed", type=seed, default=None, help="n > 2: seed of the Dirichlet points (default: 0)")
    p.add_argument("--json", default=None, help="write the curve and barriers to this JSON file")
    p.add_argument("--plot", default=None, help="write a PNG plot of the curves (n = 3: the loss over the triangle)")
    devices.add_arguments(p)
    p.set_defaults(run=run, checkpoints=("models",))


def run(args) -> int:
    from .. import SymmergeError
    from ..barrier import barrier, plot
    from ..data import load_batches
    from ..expand import widest
    from ..model import load_model

    if len(args.models) < 2:
        raise SymmergeError(f"a barrier needs at least two models, got {len(args.models)}")
    place = devices.resolve(args)
    if len(args.models) > 2:
        from .barrier_many import run_many

        return run_many(args, place)
    if args.weights is not None or args.simplex_points is not None or args.seed is not None:
        raise SymmergeError("--weights, --simplex-points and --seed are for three or more models")
    args.a, args.b = args.models
    check_report_file(args.json, "--json")
    check_plot_file(args.plot, args.json)
    a, b = load_model(args.a), load_model(args.b)
    a, b = widest(a, b)  # mixed widths: the narrower expanded into the wider
    batches = load_batches(args.a, args.data, args.split, args.batch_size, args.seq_len, args.max_batches)
    dtype = place.working(a.dtype)
    result = barrier(a, b, batches, args.points, args.refine, dtype=dtype, device=place.device)
    result.update({"a": str(args.a), "b": str(args.b), "data": str(args.data), "split": args.split,
                   **place.record(dtype)})
    print(f"{'λ':>6} {'loss':>10} {'accuracy':>9}")
    for lam, loss, acc in zip(result["lambdas"], result["loss"], result["accuracy"]):
        print(f"{lam:6.3f} {loss:10.4f} {acc:9.4f}")
    print(f"loss barrier {result['barrier']:.4f} at λ={result['barrier_lambda']:.3f}; "
          f"accuracy barrier {result['accuracy_barrier']:.4f}")
    if args.json:
        from ..report import write

        write(args.json, "barrier", result)
    if args.plot:
        plot(result, args.plot, f"{Path(args.a).name} → {Path(args.b).name}")
    return 0
