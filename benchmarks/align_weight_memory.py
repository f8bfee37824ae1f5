"""Peak memory of the whole `symmerge align --method weight` command by phase, against the endpoints' bytes.

Two random-initialised bf16 checkpoints of a real shape (`weight_matching_scale.SHAPES`, `--layers` to cut
the depth at the same width and vocabulary) are written once; then, for each `--precision`, a fresh process
runs `symmerge align A B -o OUT --method weight --max-iters 1 --precision P` with its phases wrapped
(`learned_memory.PhaseLog`: the resident high-water mark, reset on entering a phase, so each phase's peak is
its own): opening the checkpoints, weight matching and within it the start pass over the parts and the
`State` of a part's steps, and writing OUT with, within it, the tied-head check of the gauge. The table gives
the command's peak, its ratio to the two endpoints' bytes, each phase's highest peak, and the similarity the
command printed (start -> end).

    PYTHONPATH=src python benchmarks/align_weight_memory.py --shape gemma-3-1b --layers 2

With a large vocabulary the ends (embeddings and the head) set the peak, whatever the depth: a depth cut to
two layers measures what the full depth would, in minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import record

GB = 1e9
#: how deep each phase lies inside the others (for naming the one that sets the peak)
INNER = {"start pass, one part": 1, "a part's State": 1, "tied-head check": 1}
#: (module, attribute, label) of the phases wrapped in the child process
PHASES = [
    ("symmerge.workflows.pair", "load_pair", "open checkpoints"),
    ("symmerge.match.registry", "weight_match", "weight matching"),
    ("symmerge.match.weight_stream", "StreamRun.start_part", "start pass, one part"),
    ("symmerge.match.weight_state", "State.__init__", "a part's State"),
    ("symmerge.store.stream", "write_streaming", "writing OUT"),
    ("symmerge.store.stream", "tied_scale", "tied-head check"),
]


def child(argv: list[str]) -> None:
    """The command in this process, its phases wrapped (`learned_memory.phase_child`)."""
    from learned_memory import phase_child

    phase_child(argv, PHASES)


def run(a: Path, b: Path, out: Path, precision: str, threads: int) -> dict:
    argv = ["align", str(a), str(b), "-o", str(out), "--method", "weight", "--max-iters", "1", "--precision", precision,
            "--force"]
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "TQDM_DISABLE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(argv)], capture_output=True, text=True,
                          env={**os.environ, **env})
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    lines = proc.stdout.strip().splitlines()
    logged = json.loads(lines[-1])
    wrote = next(line for line in lines if line.startswith("wrote "))
    return {**logged, "line": wrote, "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(json.loads(sys.argv[2]))
    from weight_matching_scale import SHAPES, write_random_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="gemma-3-1b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--folder", default="runs/wm-scale", help="where the two checkpoints are written (reused)")
    ap.add_argument("--precisions", default="float64,float32")
    ap.add_argument("--threads", type=int, default=1)
    record.add_argument(ap, "align_weight_memory")
    args = ap.parse_args()
    root = Path(args.folder) / (args.shape + (f"-L{args.layers}" if args.layers else ""))
    for seed, side in enumerate("ab"):
        if not (root / side / "config.json").is_file():
            write_random_checkpoint(root / side, args.shape, seed, args.layers)
    ends = sum(p.stat().st_size for side in "ab" for p in (root / side).glob("*.safetensors"))
    labels = [label for _, _, label in PHASES]
    columns = ["--precision", "endpoints", "peak RSS", "peak / endpoints", "highest phase",
               *[f"{label} (peak)" for label in labels], "similarity", "wall"]
    rows = []
    for precision in args.precisions.split(","):
        r = run(root / "a", root / "b", root / f"out-{precision}", precision, args.threads)
        peaks = {}
        for row in r["phases"]:
            label = row["phase"]
            peaks[label] = max(peaks.get(label, 0), row["peak"])
        # the innermost phase that reaches the command's peak (a phase's peak counts in the phases around it)
        top = [label for label in labels if peaks.get(label, 0) >= 0.99 * r["peak"]]
        top = max(top, key=lambda label: INNER.get(label, 0)) if top else "outside the phases"
        similarity = r["line"].split("similarity ")[1].split(" in ")[0]
        rows.append([precision, f"{ends / GB:.2f} GB", f"{r['peak'] / GB:.2f} GB", f"{r['peak'] / ends:.1f}", top,
                     *[f"{peaks[label] / GB:.2f} GB" if label in peaks else "-" for label in labels],
                     similarity, f"{r['wall_s']:.0f} s"])
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
    key = f"{args.shape}-L{args.layers}" if args.layers else args.shape
    title = f"{args.shape} shape, {args.layers or 'all'} layers, bf16 endpoints, one sweep"
    record.save(args.results, "align_weight_memory", key, title, [record.table("peak RSS by phase", columns, rows)],
                notes="peaks are the resident high-water mark (VmHWM) of each phase, the highest over its calls; a phase "
                      "inside another counts in both; GB = 1e9 bytes", threads=args.threads)


if __name__ == "__main__":
    main()
