"""Weight matching of one pair at several CPU thread counts and on a GPU: which results are identical.

Two checkpoints of a shape (`weight_matching_scale.write_random_checkpoint`: random-initialised, whose
near-tied assignment costs make the discrete choices fragile) are matched in-process with the same
families and sweeps, once per `--threads` entry on the CPU and once per `--device` entry (products and
Procrustes solves there, `weight_match(device=)`). For each run against the first: whether every
permutation is the same, the largest difference of the continuous parts of the element (relative to
their size), the similarity reached, and whether the element is bit for bit the first's. One JSON
object on stdout (and `--json FILE`).

    PYTHONPATH=src python benchmarks/wm_devices.py --shape pythia-70m --layers 2 --threads 1,2
    PYTHONPATH=src python benchmarks/wm_devices.py --shape pythia-410m --layers 2 --threads 1,16 --device cuda
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import record  # noqa: E402
from weight_matching_scale import SHAPES, write_random_checkpoint  # noqa: E402

from symmerge.match.weight import weight_match  # noqa: E402
from symmerge.store.model import LazyModel  # noqa: E402


def compare(ref: dict, other: dict, spec) -> dict:
    """Permutations equal, largest relative difference of the other groups' parameters, bitwise equality."""
    perms_equal, worst = True, 0.0
    for name, x in ref.items():
        y = other[name]
        if spec.groups[name].kind == "permutation":
            perms_equal &= torch.equal(x, y)
        else:
            worst = max(worst, float((x - y).abs().max() / x.abs().max().clamp_min(1e-300)))
    return {"permutations_equal": perms_equal, "max_rel_diff_continuous": worst,
            "bitwise_equal": all(torch.equal(ref[k], other[k]) for k in ref)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="pythia-70m")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--folder", default="runs/wm-devices")
    ap.add_argument("--threads", default="1,2", help="comma-separated CPU thread counts")
    ap.add_argument("--device", default="", help="comma-separated devices for the products (cuda, cuda:N)")
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--precision", choices=("float32", "float64"), default="float64")
    ap.add_argument("--json", default=None)
    record.add_argument(ap, "wm_devices")
    args = ap.parse_args()
    root = Path(args.folder) / f"{args.shape}-L{args.layers}"
    for side, seed in (("a", 0), ("b", 1)):
        write_random_checkpoint(root / side, args.shape, seed, args.layers)
    dtype = getattr(torch, args.precision)
    runs = [("cpu", int(t)) for t in args.threads.split(",")] + [(d, None) for d in args.device.split(",") if d]
    results, ref, spec = [], None, None
    for device, threads in runs:
        if threads is not None:
            torch.set_num_threads(threads)
        a, b = LazyModel(root / "a", dtype), LazyModel(root / "b", dtype)
        spec = a.spec
        t0 = time.perf_counter()
        res = weight_match(a.spec, a, b, max_iters=args.sweeps, tol=0.0, dtype=dtype,
                           device=None if device == "cpu" else device)
        row = {"device": device, "threads": threads if threads is not None else torch.get_num_threads(),
               "seconds": round(time.perf_counter() - t0, 2), "similarity": res.history[-1],
               "sweeps": len(res.history) - 1}
        g = {k: v.detach().cpu() for k, v in res.g.items()}
        if ref is None:
            ref = g
        row.update(compare(ref, g, spec))
        results.append(row)
        print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"command": " ".join(sys.argv), "commit": commit, "torch": torch.__version__,
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": torch.get_num_threads()},
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "shape": args.shape, "layers": args.layers, "precision": args.precision, "runs": results}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    key = f"{args.shape}, {args.layers} layers, {args.precision}"
    record.save(args.results, "wm_devices", key, key, [record.table("weight matching", [
        "device", "threads", "seconds", "similarity", "sweeps", "same as the first run"], [[
        r["device"], r["threads"], r["seconds"], repr(r["similarity"]), r["sweeps"],
        "bit for bit" if r["bitwise_equal"] else (f"permutations {'equal' if r['permutations_equal'] else 'differ'}, "
                                                  f"continuous maps within {r['max_rel_diff_continuous']:.1e} relative")]
        for r in results])])


if __name__ == "__main__":
    main()
