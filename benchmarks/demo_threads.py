"""`symmerge demo` in a fresh process at each thread count: every method's barriers, to show how much the demo's
figures depend on the thread count (training sums its gradients in a thread-dependent order, and a few
hundred steps later the pair, and so every barrier, differs) on the machine it runs on.

    python benchmarks/demo_threads.py --threads 1,2 --root runs/demo-threads

Each run is `symmerge demo -o ROOT/threads-T` with `OMP_NUM_THREADS=T` and the demo's defaults; its report
(`demo-report.json`) gives the table, and the child's CPU seconds its cost.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import record

COLUMNS = ["method", "loss barrier", "accuracy barrier", "endpoint max logit change"]


def run(threads: int, out: Path) -> tuple[list[list[str]], float]:
    """The demo at `threads` threads into `out`: its table rows and the child's CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "TQDM_DISABLE": "1"}
    subprocess.run([sys.executable, "-m", "symmerge", "demo", "-o", str(out), "--force"], env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    report = json.loads((out / "demo-report.json").read_text())
    rows = [[r["label"], f"{r['barrier']:.4f}", f"{r['accuracy_barrier']:.4f}", f"{r['max_endpoint_logit_change']:.1e}"]
            for r in report["results"]]
    return rows, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts, one fresh demo each")
    ap.add_argument("--root", default="runs/demo-threads")
    record.add_argument(ap, "demo_threads")
    args = ap.parse_args()
    for t in (int(x) for x in args.threads.split(",")):
        rows, cpu = run(t, Path(args.root) / f"threads-{t}")
        print(f"{t} thread(s), {cpu:.0f} CPU s:\n" + "\n".join(" | ".join(r) for r in rows), flush=True)
        record.save(args.results, "demo_threads", f"threads {t}", f"symmerge demo at {t} thread(s)",
                    [record.table("barriers", COLUMNS, rows)], f"{cpu:.0f} CPU seconds (both trainings included)",
                    commands=[f"OMP_NUM_THREADS={t} symmerge demo -o {record.portable(str(Path(args.root) / f'threads-{t}'))}"], threads=t)


if __name__ == "__main__":
    main()
