"""`symmerge barrier M1 M2 M3 ... --data PATH`: the barrier of three or more models (see `barrier_many`)."""

from __future__ import annotations

from pathlib import Path

from .. import SymmergeError
from .checks import check_plot_file, check_report_file


def check(args) -> list[float]:
    """Refuse bad options before any model is read; returns the weights."""
    from ..simplex import check_weights, parse_weights

    n = len(args.models)
    weights = check_weights(parse_weights(args.weights), n)
    if args.refine:
        raise SymmergeError("--refine is for two models")
    if args.plot and n != 3:
        raise SymmergeError(f"--plot draws the triangle of three models; got {n}")
    check_report_file(args.json, "--json")
    check_plot_file(args.plot, args.json)
    return weights


def run_many(args, place) -> int:
    """The barrier of three or more models, the forward placed by `place` (`devices.Placement`)."""
    from ..barrier_many import many_barrier, plot_triangle, triangle
    from ..data import load_batches
    from ..model import load_model

    weights = check(args)
    from ..merge_many import check_models

    models, _ = check_models([load_model(p) for p in args.models], list(args.models))  # mixed widths: the widest
    batches = load_batches(args.models[0], args.data, args.split, args.batch_size, args.seq_len, args.max_batches)
    k = 16 if args.simplex_points is None else args.simplex_points
    seed = 0 if args.seed is None else args.seed
    dtype = place.working(models[0].dtype)
    result = many_barrier(models, batches, weights, args.points, k, seed, dtype=dtype, device=place.device)
    result.update({"models": [str(p) for p in args.models], "data": str(args.data), "split": args.split,
                   **place.record(dtype)})
    for i, (p, loss, acc) in enumerate(zip(args.models, result["endpoint_losses"], result["endpoint_accuracies"])):
        print(f"M{i + 1} {p}: loss {loss:.4f}, accuracy {acc:.4f}")
    print(f"weighted average: loss {result['average_loss']:.4f} (excess {result['average_excess']:.4f}), "
          f"accuracy {result['average_accuracy']:.4f} (drop {result['average_accuracy_drop']:.4f})")
    print(f"largest pairwise barrier {result['pairwise_max']:.4f} (accuracy {result['pairwise_max_accuracy']:.4f}); "
          f"simplex barrier {result['simplex_barrier']:.4f} over {k} Dirichlet points (accuracy "
          f"{result['simplex_accuracy_barrier']:.4f})")
    if args.plot:
        grid = triangle(models, batches, dtype=dtype, device=place.device)
        result["triangle"] = grid
        plot_triangle(grid, args.plot, [Path(p).name for p in args.models])
    if args.json:
        from ..report import write

        write(args.json, "barrier", result)
    return 0
