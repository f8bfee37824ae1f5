"""The runs that regenerate the README's `script` figures (`readme_figures.py`): `symmerge demo` on a fresh
folder once per process, and what the figures read from its pair. Each returns the figure's values as the
README prints them."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
import time
from pathlib import Path


def _symmerge(*argv: str) -> None:
    from symmerge.cli import main

    if main(list(argv)) != 0:
        raise SystemExit(f"symmerge {' '.join(argv)} failed")


#: the demo's folder, shared by the figures that read its pair (one `symmerge demo` per process)
_DEMO: dict[str, object] = {}


def _demo_run() -> dict:
    """`symmerge demo` into a fresh folder, once per process: its folder, report and CPU seconds."""
    if not _DEMO:
        root = Path(tempfile.mkdtemp(prefix="readme-demo-"))
        atexit.register(shutil.rmtree, root, True)
        start = time.process_time()
        _symmerge("demo", "-o", str(root / "demo"))
        _DEMO.update(folder=root / "demo", cpu_s=time.process_time() - start,
                     report=json.loads((root / "demo" / "demo-report.json").read_text()))
    return _DEMO


def demo(root: Path) -> list[str]:
    """`symmerge demo` on a fresh folder: the barrier of each method, 3 decimals, in the README's column
    order, and the run's CPU seconds (one thread: its wall time on an idle core)."""
    run = _demo_run()
    rows = {r["method"]: r["barrier"] for r in run["report"]["results"]}
    return [f"{run['cpu_s']:.0f}"] + [f"{rows[m]:.3f}" for m in ("plain", "weight", "activation", "learned", "dual")]


def demo_scale(root: Path) -> list[str]:
    """Weight matching on the demo's pair without and with the residual scale (`--groups all`), the demo's
    settings (20 sweeps) and test batches: the two barriers, 3 decimals (the first is the demo row's)."""
    from symmerge.data.batches import load_batches
    from symmerge.evaluation.barrier_pair import barrier
    from symmerge.match import registry
    from symmerge.store.model import load_model
    from symmerge.workflows.demo import DemoArgs

    folder = Path(_demo_run()["folder"])
    args = DemoArgs()
    a, b = load_model(folder / f"seed{args.seeds[0]}"), load_model(folder / f"seed{args.seeds[1]}")
    test = load_batches(folder / f"seed{args.seeds[0]}", args.data, "test", batch_size=64, max_batches=args.test_batches)
    out = []
    for families in (b.spec.default_families(), b.spec.families()):
        res = registry.align("weight", a, b, families, None, {"max_iters": args.match_iters}, progress=False)
        aligned = b.moved(res.elements["B"])
        out.append(f"{barrier(a, aligned, test, points=11, progress=False)['barrier']:.3f}")
    return out
