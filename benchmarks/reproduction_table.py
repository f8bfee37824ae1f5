"""The issue-5 reproduction table for one independently trained pair: plain averaging, weight matching,
learned matching (permutations only -- residual stream, heads and FFN units --, the published group
-- permutations and the residual rotation --, and every family), dual matching with each parameterisation,
and ablations of dual matching (QK maps off, OV maps off, with the residual scale, GLU scaling off).

    PYTHONPATH=src python benchmarks/reproduction_table.py A B DATA [--rows plain,weight,...] \
        [--steps 300] [--lr 1e-2] [--batch-size 16] [--test-batches 8] [--json OUT.jsonl]

Every row works as `symmerge align A B --method M --groups G --param P` does: weight matching over the
row's families first (`weight_match`, 20 sweeps at most), then for learned/dual rows the learning loop
(`symmerge.match.learned.learn`) on train-split batches, tracking the barrier on validation-split
batches (best state kept). Figures: the 11-point loss barrier on the *same* test-split batches for
every row, computed per batch through the stock HF forward (`evaluation.StockForward`), so that the
standard error is the paired one: the spread over test batches of the per-batch gap
L_b(lam*) - ((1 - lam*) L_b(0) + lam* L_b(1)) at the peak lam* of the mean curve, over sqrt(n).
The barrier equals `symmerge.evaluation.barrier_pair.barrier`'s on the same batches (same grid, token-weighted means).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import record
import torch

from symmerge.algebra.apply import apply
from symmerge.data.batches import load_batches
from symmerge.evaluation.barrier_pair import summarise
from symmerge.evaluation.forward import StockForward, grid, interpolate, mean_se
from symmerge.match.learn_config import LAM_SAMPLING, LearnConfig, parse_lam_range
from symmerge.match.learned import learn
from symmerge.match.parametrize import straight_through
from symmerge.match.weight import weight_match
from symmerge.store.model import load_model

#: key -> (label, method, families to drop from the default, families to add, --param)
ROWS = {
    "plain": ("plain averaging", None, (), (), None),
    "weight": ("weight matching", "weight", (), (), None),
    # permutations only: the residual stream permuted (the residual rotation restricted to permutation
    # matrices, `residual_perm`), heads and FFN units permuted
    "weight-perms": ("weight matching, permutations only", "weight", "perms", (), None),
    "learned-perms": ("learned matching, permutations only", "learned", "perms", (), "auto"),
    # the group of the published learned matching (Theus et al. 2025): permutations and the residual rotation,
    # no QK/OV maps or GLU scaling -- the one-sided baseline the dual-matching paper compares against
    "weight-published": ("weight matching, published group (permutations + residual rotation)", "weight",
                         "published", (), None),
    "learned-published": ("learned matching, published group (permutations + residual rotation)", "learned",
                          "published", (), "auto"),
    "learned": ("learned matching", "learned", (), (), "auto"),
    # one-sided, permutations kept at the weight-matching solution: dual matching's single-sided twin
    "learned-fixed-perms": ("learned matching, permutations fixed at weight matching", "learned", (), (), "auto"),
    "dual": ("dual matching, cayley rotation + polar maps (auto)", "dual", (), (), "auto"),
    "dual-cayley-signs": ("dual matching, cayley-signs rotation + polar maps", "dual", (), (),
                          "residual_rotation=cayley-signs"),
    "dual-expm": ("dual matching, expm everywhere", "dual", (), (), "expm"),
    "dual-direct": ("dual matching, cayley rotation + direct maps", "dual", (), (), "qk_map=direct,ov_map=direct"),
    "dual-no-qk": ("dual matching, QK maps off", "dual", ("qk_map",), (), "auto"),
    "dual-no-ov": ("dual matching, OV maps off", "dual", ("ov_map",), (), "auto"),
    "dual-scale": ("dual matching, with the residual scale", "dual", (), ("residual_scale",), "auto"),
    "dual-no-glu": ("dual matching, GLU scaling off", "dual", ("glu_scale",), (), "auto"),
}


PERMS = ("head_perm", "ffn_perm")
#: named family subsets a row may use in place of a list of families to drop
SUBSETS = {"perms": ("residual_perm",) + PERMS, "published": ("residual_rotation",) + PERMS}


def families_for(spec, drop, add) -> list[str]:
    """The row's families: every family but the residual scale (the CLI default), less `drop`, plus `add`;
    `drop` may instead name a subset of `SUBSETS`, the row's only families."""
    if isinstance(drop, str):
        return [f for f in spec.restricted(SUBSETS[drop]).families() if f in SUBSETS[drop]]
    default = spec.default_families()
    return [f for f in spec.families() if (f in default and f not in drop) or f in add]


def reassigned(spec, start: dict, end: dict) -> dict[str, list[int]]:
    """Per permutation family: entries the learned element changed from the start, and entries in all
    (zero for dual matching, whose permutations stay at the weight-matching solution)."""
    out: dict[str, list[int]] = {}
    for n, grp in spec.groups.items():
        if straight_through(grp):
            s, e = (start[n], end[n]) if grp.structure.index_vector else (start[n].argmax(-1), end[n].argmax(-1))
            changed, total = out.setdefault(grp.family, [0, 0])
            out[grp.family] = [changed + int((e != s).sum()), total + s.numel()]
    return out


def path_barrier(evaluator: StockForward, pa: dict, pb: dict, batches: list[dict], points: int = 11) -> dict:
    """Token-weighted curve over `batches` and the barrier, with the paired standard error at its peak."""
    lams = grid(points)
    per = []  # per lambda: list of (loss, accuracy, n_scored) per batch
    for lam in lams:
        params = interpolate(pa, pb, lam)
        per.append([evaluator.scores(params, [b]) for b in batches])
    n = [r["n_scored"] for r in per[0]]
    total = sum(n)
    loss = [sum(r["loss"] * k for r, k in zip(rows, n)) / total for rows in per]
    acc = [sum(r["accuracy"] * k for r, k in zip(rows, n)) / total for rows in per]
    out = summarise(lams, loss, acc)
    i = lams.index(out["barrier_lambda"])
    lam = lams[i]
    gaps = [per[i][j]["loss"] - ((1 - lam) * per[0][j]["loss"] + lam * per[-1][j]["loss"]) for j in range(len(n))]
    out.update(loss=loss, accuracy=acc, barrier_se=mean_se(gaps), lambdas=lams, peak_gaps=gaps)
    return out


def seed_mean(results: list[dict]) -> tuple[float, float, float]:
    """Mean barrier over seeds' `path_barrier` results, its standard error over seeds, and its
    test-sampling error: the seeds share the test batches, so the spread over test batches of each
    batch's gap averaged over seeds (each seed's gap at its own peak)."""
    xs = [r["barrier"] for r in results]
    per_batch = [sum(g) / len(g) for g in zip(*(r["peak_gaps"] for r in results))]
    return sum(xs) / len(xs), mean_se(xs), mean_se(per_batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("data")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from {','.join(ROWS)}")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--dual-lr", type=float, default=None,
                    help="learning rate of the dual rows (default --lr); both sides move, so the relative element "
                         "moves about twice as far per step as one-sided learning's at the same lr")
    ap.add_argument("--seeds", default="0", help="comma-separated learning seeds (batch order and λ draws); "
                                                  "with several, each row also gets its mean ± s.e. over seeds")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--lam-range", default="0.4,0.6", help="λ drawn uniformly from this range per step")
    ap.add_argument("--lam-sampling", choices=LAM_SAMPLING, default="uniform", help="as symmerge align's")
    ap.add_argument("--batch-size", type=int, default=16, help="train, validation and test batch size")
    ap.add_argument("--seq-len", type=int, default=None, help="window length of the train/validation batches")
    ap.add_argument("--train-batches", type=int, default=200)
    ap.add_argument("--val-batches", type=int, default=4)
    ap.add_argument("--val-points", type=int, default=5, help="λ grid of the validation barrier (endpoints included)")
    ap.add_argument("--test-batches", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="append one JSON line per row here")
    ap.add_argument("--no-test", action="store_true", help="validation figures only (for choosing steps and lr)")
    record.add_argument(ap, "reproduction_table")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    a, b = load_model(args.a), load_model(args.b)
    bs = args.batch_size
    test = load_batches(args.a, args.data, "test", batch_size=bs, max_batches=args.test_batches)
    evaluator = StockForward(a)
    wm_cache: dict[tuple, tuple] = {}
    data: dict[str, list] = {}

    def split(name, k):
        if name not in data:
            data[name] = load_batches(args.a, args.data, name, batch_size=bs, seq_len=args.seq_len, max_batches=k)
        return data[name]

    print(f"A={args.a} B={args.b} data={args.data}: {len(test)} test batches of {bs}; "
          f"learning {args.steps} steps, lr {args.lr}, batches of {bs}" + (f" x {args.seq_len}" if args.seq_len else ""))
    print("| alignment | barrier ± s.e. | acc. barrier | L(0) | L(0.5) | L(1) | steps (best) | val. barrier before -> after "
          "| seconds |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    seeds = [int(x) for x in args.seeds.split(",")]
    rows: list[list[str]] = []
    for key in args.rows.split(","):
        label, method, drop, add, param = ROWS[key]
        if key == "dual-no-glu" and "glu_scale" not in b.spec.families():
            continue
        results = []
        for seed in seeds if method not in (None, "weight") else [0]:
            results.append(run_row(args, key, seed, a, b, evaluator, split, wm_cache, test, rows))
        if len(results) > 1 and not args.no_test:
            m, over_seeds, over_batches = seed_mean(results)
            rows.append([f"{label}, mean of seeds {args.seeds}", f"{m:.4f} ± {over_seeds:.4f} (over seeds), "
                         f"± {over_batches:.4f} (over test batches)"] + [""] * 7)
            print("| " + " | ".join(rows[-1]) + " |", flush=True)
    if not args.no_test:
        name = f"{Path(args.a).name} vs {Path(args.b).name}, rows {args.rows}, seeds {args.seeds}"
        record.save(args.results, "reproduction_table", name, name, [record.table("test barrier", COLUMNS, rows)])


def row_lr(method: str, lr: float, dual_lr: float | None) -> float:
    """The learning rate of a row: `--dual-lr` for the dual rows when given, else `--lr`."""
    return dual_lr if method == "dual" and dual_lr else lr


def weight_start(a, b, fams: list[str]) -> dict:
    """The weight-matching solution every learning row starts from."""
    return weight_match(b.spec, a.params, b.params, fams, max_iters=20).g


def learn_row(args, key: str, seed: int, lr: float, a, b, fams: list[str], g0: dict, train: list, val: list):
    """Learn row `key` from `g0` at rate `lr` with the table's other settings (`args`: steps, lam_range,
    eval_every, val_points); returns the two endpoints' aligned parameters and the learning result."""
    _, method, _, _, param = ROWS[key]
    learn_fams = [f for f in fams if f not in PERMS] if key == "learned-fixed-perms" else fams
    cfg = LearnConfig(method=method, groups=learn_fams, param=param, steps=args.steps,
                      lr=lr, seed=seed, lam_range=parse_lam_range(args.lam_range), lam_sampling=args.lam_sampling,
                      eval_every=args.eval_every, grid_points=args.val_points, progress=False)
    r = learn(a, b, train, val, cfg, init=g0)
    pa = apply(a.spec, r.elements["A"], a.params) if "A" in r.elements else a.params
    return pa, apply(b.spec, r.elements["B"], b.params), r


COLUMNS = ["alignment", "barrier ± s.e.", "acc. barrier", "L(0)", "L(0.5)", "L(1)", "steps (best)",
           "val. barrier before -> after", "seconds"]


def run_row(args, key, seed, a, b, evaluator, split, wm_cache, test, rows: list) -> dict:
    """One row for one learning seed: prints the table line (and adds it to `rows`), appends the JSON line,
    returns the test figures."""
    label, method, drop, add, param = ROWS[key]
    pa, pb, rep, fams, seconds, lr = a.params, b.params, {}, None, 0.0, None
    if method is not None:
        fams = families_for(b.spec, drop, add)
        if tuple(fams) not in wm_cache:
            t1 = time.perf_counter()
            wm_cache[tuple(fams)] = (weight_start(a, b, fams), time.perf_counter() - t1)
        g0, seconds = wm_cache[tuple(fams)]  # a cached start still counts its time
        pb = apply(b.spec, g0, b.params)
        if method != "weight":
            lr = row_lr(method, args.lr, args.dual_lr)
            t0 = time.perf_counter()
            pa, pb, r = learn_row(args, key, seed, lr, a, b, fams, g0, split("train", args.train_batches),
                                  split("validation", args.val_batches))
            rep = dict(r.report, reassigned=reassigned(b.spec.restricted(fams), g0, r.elements["B"]))
            seconds += time.perf_counter() - t0
    if args.no_test:
        print(f"{key} (seed {seed}): {rep.get('steps')} steps (best {rep.get('best_step')}), reassigned "
              f"{rep.get('reassigned')}, validation barrier "
              f"{rep.get('barrier_before')} -> {rep.get('barrier_after')}, {seconds:.0f} s", flush=True)
        return {}
    res = path_barrier(evaluator, pa, pb, test)
    steps = f"{rep['steps']} ({rep['best_step']})" if rep else "-"
    val = f"{rep['barrier_before']:.4f} -> {rep['barrier_after']:.4f}" if rep else "-"
    name = f"{label} (seed {seed})" if args.seeds != "0" and rep else label
    rows.append([name, f"{res['barrier']:.4f} ± {res['barrier_se']:.4f}", f"{res['accuracy_barrier']:.4f}",
                 f"{res['loss'][0]:.3f}", f"{res['loss'][5]:.3f}", f"{res['loss'][-1]:.3f}", steps, val, f"{seconds:.0f}"])
    print("| " + " | ".join(rows[-1]) + " |", flush=True)
    if args.json:
        line = {"row": key, "label": label, "seed": seed, "families": fams, "param": param, "lr": lr, "seconds": seconds,
                "test": res, "learn": rep, "args": vars(args)}
        with open(args.json, "a") as f:
            f.write(json.dumps(line, default=str) + "\n")
    return res


if __name__ == "__main__":
    main()
