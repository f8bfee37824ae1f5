"""`symmerge barrier A B --data PATH`: loss and accuracy along the straight line, and the barrier.

With more than two models (`symmerge barrier M1 ... Mn`), the barrier of many models
(`barrier_many.many_barrier`): the weighted average's excess, the largest pairwise barrier and the
largest excess at Dirichlet points of the simplex; `--plot` draws the loss over the triangle for n = 3."""

from __future__ import annotations

from ..runtime import devices
from ..runtime.values import at_least, seed


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
    from ..api import barrier

    result = barrier(args.models, args.data, split=args.split, batch_size=args.batch_size, max_batches=args.max_batches,
                     seq_len=args.seq_len, points=args.points, refine=args.refine, weights=args.weights,
                     simplex_points=args.simplex_points, seed=args.seed, device=args.device, dtype=args.dtype,
                     report=args.json, plot=args.plot, progress=True)
    rep = result.report
    if len(args.models) > 2:
        print_many(args.models, rep)
        return 0
    print(f"{'λ':>6} {'loss':>10} {'accuracy':>9}")
    for lam, loss, acc in zip(rep["lambdas"], rep["loss"], rep["accuracy"]):
        print(f"{lam:6.3f} {loss:10.4f} {acc:9.4f}")
    print(f"loss barrier {rep['barrier']:.4f} at λ={rep['barrier_lambda']:.3f}; "
          f"accuracy barrier {rep['accuracy_barrier']:.4f}")
    return 0


def print_many(models: list, rep: dict) -> None:
    """The barrier of three or more models, as `barrier_many.many_barrier` reports it."""
    for i, (p, loss, acc) in enumerate(zip(models, rep["endpoint_losses"], rep["endpoint_accuracies"])):
        print(f"M{i + 1} {p}: loss {loss:.4f}, accuracy {acc:.4f}")
    print(f"weighted average: loss {rep['average_loss']:.4f} (excess {rep['average_excess']:.4f}), "
          f"accuracy {rep['average_accuracy']:.4f} (drop {rep['average_accuracy_drop']:.4f})")
    print(f"largest pairwise barrier {rep['pairwise_max']:.4f} (accuracy {rep['pairwise_max_accuracy']:.4f}); "
          f"simplex barrier {rep['simplex_barrier']:.4f} over {rep['simplex_points']} Dirichlet points (accuracy "
          f"{rep['simplex_accuracy_barrier']:.4f})")
