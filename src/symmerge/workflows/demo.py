"""`symmerge demo`: train a pair from two seeds, then measure the barrier of every alignment method.

Built-in default: two small ViTs on scikit-learn's 8x8 digits (no files needed). With a text file:
two small character-level GPT-2s. Every method works on the same pair and is evaluated on the same
test batches with the same barrier harness; the endpoints are checked to compute their inputs'
functions before a barrier is reported.

`device` and `dtype` (`devices`) place every forward: the training (autocast, float32 weights), the
learned and dual matching, and the barriers; the endpoint checks stay float64 (they measure the
weights, not the arithmetic).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from ..algebra.apply import apply
from ..data.batches import load_batches
from ..errors import SymmergeError
from ..evaluation.barrier_pair import barrier
from ..evaluation.forward import StockForward
from ..match import registry
from ..runtime.devices import DTYPES, dtype_name
from ..store.model import Model, load_model
from ..store.report import write as write_report
from ..training.trainer import TrainArgs, train

METHODS = registry.COMPARED
LABELS = {registry.PLAIN: "plain averaging", **{m.name: m.label for m in registry.MATCHERS.values()}}
#: the figure each matcher adds to its row: (row key, key of the matcher's figures)
SUMMARY = {"weight": ("similarity", "objective"), "learned": ("validation_barrier", "barrier_after"),
           "dual": ("validation_barrier", "barrier_after")}


@dataclasses.dataclass
class DemoArgs:
    out: str = "symmerge-demo"
    data: str = "digits"
    seeds: tuple[int, int] = (0, 1)
    train_steps: int | None = None  # default: the demo preset's
    learn_steps: int = 150
    learn_lr: float = 1e-2  # learned and dual alike (the demo's figures); align's defaults differ per method
    match_iters: int = 20  # weight-matching sweeps
    test_batches: int = 8
    methods: tuple[str, ...] = METHODS
    force: bool = False
    progress: bool = True
    device: str = "cpu"
    dtype: str | None = None  # the forwards' working precision (devices.DTYPES); None: the checkpoints' own


def _arch(data: str) -> str:
    if data == "digits" or not data.endswith(".txt"):
        return "vit"
    return "gpt2"


def _settings(args: DemoArgs) -> dict:
    """What a trained pair is reused for (the dtype only when given: pairs trained before it existed are reused)."""
    return {"data": str(args.data), "seeds": list(args.seeds), "train_steps": args.train_steps, "arch": _arch(args.data),
            **({"dtype": args.dtype} if args.dtype else {})}


def _train_pair(args: DemoArgs, out: Path) -> tuple[Path, Path]:
    """Train the two endpoints, or reuse them when OUT holds a finished pair trained with these settings."""
    record = out / "demo-pair.json"
    paths = (out / f"seed{args.seeds[0]}", out / f"seed{args.seeds[1]}")
    if record.is_file() and json.loads(record.read_text()) == _settings(args) and all((p / "config.json").is_file() for p in paths):
        return paths
    if out.exists() and any(out.iterdir()) and not args.force:
        raise SymmergeError(f"{out} holds another run; pass --force to replace it or -o to choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)
    for seed, path in zip(args.seeds, paths):
        train(TrainArgs(arch=_arch(args.data), preset="demo", data=args.data, seed=seed, out=str(path),
                        steps=args.train_steps, force=True, progress=args.progress, device=args.device,
                        dtype=args.dtype or "float32"))
    record.write_text(json.dumps(_settings(args)))
    return paths


def _aligned(method: str, a: Model, b: Model, train_batches, val_batches, args: DemoArgs) -> tuple[dict, dict, dict]:
    """(params of A's side, params of B's side, what the method reports) for one method."""
    if method == registry.PLAIN:
        return a.params, b.params, {}
    # the demo's own short run (its figures in the README)
    opts = {"max_iters": args.match_iters, "steps": args.learn_steps, "eval_every": max(1, args.learn_steps // 5),
            "lr": args.learn_lr, "recipe": "quick", "lam_sampling": "uniform"}
    place = {"device": args.device, "dtype": dtype_name(_working(args, a))}
    res = registry.align(method, a, b, b.spec.default_families(), registry.Data(train_batches, val_batches), opts,
                         progress=args.progress, **(place if registry.get(method).forward else {}))
    pa = apply(a.spec, res.elements["A"], a.params) if "A" in res.elements else a.params
    row = SUMMARY.get(method)
    info = {row[0]: res.figures.get(row[1])} if row else {}
    return pa, apply(b.spec, res.elements["B"], b.params), info


def _working(args: DemoArgs, a: Model) -> torch.dtype:
    return DTYPES[args.dtype] if args.dtype else a.dtype


def run_demo(args: DemoArgs) -> dict:
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise SymmergeError(f"unknown demo methods {unknown}; choose from {', '.join(METHODS)}")
    out = Path(args.out)
    path_a, path_b = _train_pair(args, out)
    a, b = load_model(path_a), load_model(path_b)
    test = load_batches(path_a, args.data, "test", batch_size=64 if _arch(args.data) == "vit" else 16,
                        max_batches=args.test_batches)
    train_batches = load_batches(path_a, args.data, "train", batch_size=32 if _arch(args.data) == "vit" else 8)
    val = load_batches(path_a, args.data, "validation", batch_size=64 if _arch(args.data) == "vit" else 16, max_batches=4)
    # re-parameterised endpoints must compute their inputs' functions (float64: the weights, not the arithmetic)
    checks = StockForward(a, torch.float64, args.device), StockForward(b, torch.float64, args.device)
    rows = []
    for method in args.methods:
        start = time.perf_counter()
        pa, pb, info = _aligned(method, a, b, train_batches, val, args)
        gap = max(checks[0].logit_change(pa, test[0]), checks[1].logit_change(pb, test[0]))
        end_a, end_b = dataclasses.replace(a, params=pa), dataclasses.replace(b, params=pb)
        curve = barrier(end_a, end_b, test, points=11, progress=False, dtype=_working(args, a), device=args.device)
        # "seconds" last: the barrier's own "seconds" would otherwise hide the method's total
        rows.append({"method": method, "label": LABELS[method], "max_endpoint_logit_change": gap, **curve, **info,
                     "barrier_seconds": curve["seconds"], "seconds": time.perf_counter() - start})
    report = {"data": args.data, "arch": a.shape.hf_class, "a": str(path_a), "b": str(path_b), "results": rows}
    write_report(out / "demo-report.json", "demo", report)
    plot_methods(rows, out / "demo-barriers.png", f"{a.shape.hf_class} on {args.data}: seeds {args.seeds[0]} and {args.seeds[1]}")
    return report


def plot_methods(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        axes[0].plot(r["lambdas"], r["loss"], "o-", ms=3, label=f"{r['label']} ({r['barrier']:.3f})")
        axes[1].plot(r["lambdas"], r["accuracy"], "o-", ms=3, label=r["label"])
    for ax, name in zip(axes, ("test loss", "test accuracy")):
        ax.set_xlabel("λ  (0 = seed A, 1 = seed B)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(title="loss barrier", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    from ..runtime.atomic import write_file

    write_file(path, lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)


def format_table(report: dict) -> str:
    lines = [f"{'method':<24} {'loss barrier':>12} {'acc. barrier':>12} {'endpoint Δlogit':>16} {'time (s)':>9}"]
    for r in report["results"]:
        lines.append(f"{r['label']:<24} {r['barrier']:>12.4f} {r['accuracy_barrier']:>12.4f} "
                     f"{r['max_endpoint_logit_change']:>16.1e} {r['seconds']:>9.1f}")
    return "\n".join(lines)
