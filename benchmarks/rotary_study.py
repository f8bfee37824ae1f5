"""The rotary study (issue 17): barriers of pairs trained alike but for one factor, through the CLI.

    PYTHONPATH=src python benchmarks/rotary_study.py --runs runs/study --work runs/rotary/study \
        --data ../shared/data/tinyshakespeare.txt --pairs gpt2,neox,llama --rows plain,weight,dual

A pair NAME is `RUNS/ts-char-NAME-demo-seed0` (A) and `...-seed1` (B), trained by `symmerge train` with the
same data, steps and seeds (the commands are in benchmarks/README.md). Every figure is the 11-point
test-loss barrier of `symmerge barrier` on the same test batches; every alignment is one `symmerge align`
command with every learning flag explicit (so that a change of the CLI defaults does not move the figures).
Rows:

- `plain`: plain averaging;  `weight`: weight matching over the default families (all but the scale);
- `learned`, `dual`: learned / dual matching from the weight-matching solution (flags in `learn_flags`);
- `weight-off`, `dual-off`: the same with one family switched off in turn (`--groups` without it),
  one row per family the architecture has: what each family contributes on that architecture;
- `weight-qkrope`, `dual-qkrope` (models without RoPE: GPT-2): the QK maps restricted to what RoPE on the
  whole head would leave (a scaled rotation per `rotate_half` pair), a subgroup of GPT-2's QK group, so the
  output still computes B's function: what the RoPE restriction alone costs on the same pair;
- `dual-faster`: dual matching with some families' learning rates multiplied (`--faster qk_map=3,ov_map=2`,
  each family's tensors in their own Adam group at the scheduled rate times its factor; row label
  `dual-faster-qk_map3-ov_map2`): per-family rates, which the CLI does not offer.

Each command's outputs (checkpoints, the align and barrier JSON reports) go to `WORK/NAME/ROW/`; a row
whose barrier report exists is not run again (an interrupted study resumes). The commands run are printed
as they start; the tables (markdown) are printed at the end from every report under WORK.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import record

ROWS = ("plain", "weight", "learned", "dual", "weight-off", "dual-off", "weight-qkrope", "dual-qkrope", "dual-faster")
#: the families as `--groups` names them (the spec's constants; the default leaves the residual scale out)
FAMILY_LABELS = {"residual_rotation": "rotation", "head_perm": "heads", "qk_map": "QK", "ov_map": "OV",
                 "ffn_perm": "FFN", "glu_scale": "GLU"}


def families_of(model: str) -> list[str]:
    """The default families of a checkpoint (`Spec.default_families`), asked of the library once per pair."""
    from symmerge.store.model import load_model

    return load_model(model).spec.default_families()


def learn_flags(args, method: str) -> list[str]:
    """Every option of learned/dual matching, explicit: the study's recipe does not follow the CLI defaults."""
    lr = args.lr_dual if method == "dual" else args.lr_learned
    return ["--data", args.data, "--steps", str(args.steps), "--lr", str(lr), "--lam-range", args.lam_range,
            "--batch-size", str(args.batch_size), "--max-batches", str(args.train_batches),
            "--val-batches", str(args.val_batches), "--val-points", str(args.val_points),
            "--eval-every", str(args.eval_every), "--patience", "0", "--seed", "0", "--param", "auto",
            "--lam-sampling", "uniform", "--max-iters", "20"]


def barrier_cmd(args, a: str, b: str, report: Path) -> list[str]:
    return ["barrier", a, b, "--data", args.data, "--split", "test", "--batch-size", str(args.batch_size),
            "--max-batches", str(args.test_batches), "--points", "11", "--json", str(report)]


QKROPE = "cli-qk-as-rotary"  # `rotary_study.py cli-qk-as-rotary ARGV...`: the CLI with RoPE-form QK maps


def qk_as_rotary() -> None:
    """Run the CLI on `sys.argv[2:]` with every QK map of a model without RoPE restricted to the maps that
    commute with RoPE on the whole head (`rotary.Pairing`, layout "half"): a subgroup of GL(d_head), so
    every element is still a symmetry of the model; nothing else changes."""
    import dataclasses

    import symmerge.store.model as M
    from symmerge.algebra.spec import QK_MAP
    from symmerge.cli import main as cli

    build = M.build_spec

    def restricted(s):
        spec = build(s)
        if s.rotary_dims:
            raise SystemExit(f"{QKROPE} is for models without RoPE; {s.hf_class} has {s.rotary_dims} rotary dims")
        for n, g in list(spec.groups.items()):
            if g.family == QK_MAP:
                spec.groups[n] = dataclasses.replace(g, constraints=("rope",), rotary_dims=g.size, rotary_layout="half")
        return spec

    M.build_spec = restricted
    raise SystemExit(cli(sys.argv[2:]))


FASTER = "cli-faster"  # `rotary_study.py cli-faster FAMILY=FACTOR,... ARGV...`: the CLI with per-family rates


def faster(tensors: list, factors: list[float], lr: float):
    """An Adam that steps each of `tensors` at the scheduled rate times its factor: one group per tensor, in the
    order given (the learner's, its checkpoint's order)."""
    import torch

    class Scaled(torch.optim.Adam):
        def step(self, closure=None):
            rates = [g["lr"] for g in self.param_groups]
            for g in self.param_groups:
                g["lr"] *= g["factor"]
            try:
                return super().step(closure)
            finally:
                for g, rate in zip(self.param_groups, rates):
                    g["lr"] = rate

    return Scaled([{"params": [t], "factor": f} for t, f in zip(tensors, factors)], lr=lr)


def family_rates() -> None:
    """Run the CLI on `sys.argv[3:]` with learned/dual matching's optimiser replaced by `faster(...)`, each
    learned tensor at the factor of its group's family in `sys.argv[2]` (`qk_map=3,ov_map=2`; others 1);
    nothing else changes (one process: several would sum the gradients of the first group's tensor only)."""
    import symmerge.match.learn_loop as L
    from symmerge.cli import main as cli

    factors = {k: float(v) for k, v in (kv.split("=") for kv in sys.argv[2].split(","))}
    init = L.Run.__init__

    def patched(self, learner, *a, **k):
        init(self, learner, *a, **k)
        family = {id(t): learner.spec.groups[s.group].family for s in learner.slots for t in s.raw.values()}
        tensors = list(learner.trainables().values())  # the order Run's checkpoint keeps
        fams = [family[id(t)] for t in tensors]
        self.opt = faster(tensors, [factors.get(f, 1.0) for f in fams], self.cfg.lr)
        print("rates:", {f: f"{factors.get(f, 1.0):g} x {fams.count(f)} tensors" for f in sorted(set(fams))}, flush=True)

    L.Run.__init__ = patched
    raise SystemExit(cli(sys.argv[3:]))


def symmerge(argv: list[str], log: Path, qk_rope: bool = False, factors: str = "") -> None:
    mode = [__file__, QKROPE] if qk_rope else [__file__, FASTER, factors] if factors else ["-m", "symmerge"]
    cmd = [sys.executable, *mode, *argv]
    shown = ("$ symmerge" if mode[0] == "-m" else "$ python benchmarks/rotary_study.py " + " ".join(mode[1:])) + " " \
        + shlex.join(argv)
    print(shown, flush=True)
    with open(log, "a") as f:
        f.write(shown + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ | {"TQDM_DISABLE": "1"})
    if rc:
        raise SystemExit(f"symmerge {argv[0]} failed (exit {rc}); see {log}")


def plan(args, name: str, fams: list[str]) -> list[tuple[str, str, list[str]]]:
    """(row label, method, families or [] for the default) for the rows asked of pair `name`."""
    out = []
    for row in args.rows:
        if row in ("plain", "weight", "learned", "dual", "weight-qkrope", "dual-qkrope"):
            out.append((row, row.split("-")[0], []))
        elif row == "dual-faster":
            out.append(("dual-faster-" + args.faster.replace("=", "").replace(",", "-"), "dual", []))
        else:
            method = row.split("-")[0]
            out += [(f"{method}-no-{f}", method, [g for g in fams if g != f]) for f in fams if f in FAMILY_LABELS]
    return out


def run_row(args, name: str, label: str, method: str, groups: list[str]) -> None:
    a, b = (str(Path(args.runs) / f"ts-char-{name}-demo-seed{s}") for s in (0, 1))
    d = Path(args.work) / name / label
    if (d / "barrier.json").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    log, t0 = d / "log.txt", time.time()
    if method == "plain":
        symmerge(barrier_cmd(args, a, b, d / "barrier.json"), log)
        return
    align = ["align", a, b, "-o", str(d / "out"), "--method", method, "--json", str(d / "align.json"), "--force"]
    align += ["--groups", ",".join(groups)] if groups else []
    align += learn_flags(args, method) if method in ("learned", "dual") else ["--max-iters", "20"]
    symmerge(align, log, qk_rope=label.endswith("-qkrope"), factors=args.faster if "-faster-" in label else "")
    seconds = time.time() - t0
    pa, pb = (str(d / "out" / "A"), str(d / "out" / "B")) if method == "dual" else (a, str(d / "out"))
    symmerge(barrier_cmd(args, pa, pb, d / "barrier.json"), log)
    (d / "seconds.txt").write_text(f"{seconds:.1f}\n")


# --- tables from the reports ----------------------------------------------------------------------


def _find(report, key):
    """The first value of `key` anywhere in a nested JSON report (None when absent)."""
    if isinstance(report, dict):
        if key in report:
            return report[key]
        report = list(report.values())
    if isinstance(report, list):
        for v in report:
            found = _find(v, key)
            if found is not None:
                return found
    return None


def figures(d: Path) -> dict | None:
    if not (d / "barrier.json").exists():
        return None
    r = json.loads((d / "barrier.json").read_text())
    peak = r["lambdas"].index(r["barrier_lambda"]) if r.get("barrier_lambda") in r["lambdas"] else None
    out = {"barrier": r["barrier"], "se": r["loss_se"][peak] if peak is not None else math.nan,
           "l0": r["loss"][0], "l1": r["loss"][-1], "lam": r.get("barrier_lambda")}
    if (d / "align.json").exists():
        a = json.loads((d / "align.json").read_text())
        out.update(best=_find(a, "best_step"), before=_find(a, "barrier_before"), after=_find(a, "barrier_after"))
    if (d / "seconds.txt").exists():
        out["seconds"] = float((d / "seconds.txt").read_text())
    return out


def _cell(f: dict | None) -> str:
    return "–" if f is None else f"{f['barrier']:.3f}"


def tables(work: Path, names: list[str]) -> str:
    lines = ["| pair | L(A) | L(B) | plain | weight | learned | dual | weight / plain | dual / plain |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        f = {r: figures(work / n / r) for r in ("plain", "weight", "learned", "dual")}
        p = f["plain"]
        ratio = [("–" if p is None or f[r] is None or p["barrier"] <= 0 else f"{f[r]['barrier'] / p['barrier']:.3f}")
                 for r in ("weight", "dual")]
        ends = ("–", "–") if p is None else (f"{p['l0']:.3f}", f"{p['l1']:.3f}")
        lines.append(f"| {n} | {ends[0]} | {ends[1]} | " + " | ".join(_cell(f[r]) for r in f) + f" | {ratio[0]} | {ratio[1]} |")
    lines += ["", "Each family switched off in turn (barrier with it off; every other default family on):", "",
              "| pair | method | all | " + " | ".join(f"{v} off" for v in FAMILY_LABELS.values()) + " |",
              "|---|---|---|" + "---|" * len(FAMILY_LABELS)]
    for n in names:
        for m in ("weight", "dual"):
            offs = [figures(work / n / f"{m}-no-{f}") for f in FAMILY_LABELS]
            if any(offs):
                lines.append(f"| {n} | {m} | {_cell(figures(work / n / m))} | " + " | ".join(_cell(o) for o in offs) + " |")
    qk = [(n, m) for n in names for m in ("weight", "dual") if figures(work / n / f"{m}-qkrope")]
    if qk:
        lines += ["", "QK maps: full, restricted to RoPE's form on the whole head, off:", "",
                  "| pair | method | full QK | RoPE-form QK | QK off |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {m} | {_cell(figures(work / n / m))} | {_cell(figures(work / n / f'{m}-qkrope'))} | "
                  f"{_cell(figures(work / n / f'{m}-no-qk_map'))} |" for n, m in qk]
    lines += ["", "Learning (best validation step, validation barrier before -> after, seconds of `align`):", ""]
    for n in names:
        for r in sorted(p.name for p in (work / n).glob("*") if (p / "align.json").exists()) if (work / n).exists() else []:
            f = figures(work / n / r)
            if f and f.get("best") is not None:
                lines.append(f"- {n} {r}: step {f['best']}, {f['before']:.4f} -> {f['after']:.4f}, "
                             f"{f.get('seconds', math.nan):.0f} s; test barrier {f['barrier']:.4f} ± {f['se']:.4f} at λ {f['lam']}")
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == [QKROPE]:
        qk_as_rotary()
    if sys.argv[1:2] == [FASTER]:
        family_rates()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs", help="folder of the trained pairs (benchmarks/pairs.py)")
    ap.add_argument("--work", default="runs/rotary", help="outputs and reports, one folder per row")
    ap.add_argument("--data", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--pairs", default="gpt2,neox,llama", help="comma-separated pair names")
    ap.add_argument("--rows", default="plain,weight,dual", help=f"comma-separated, from {','.join(ROWS)}")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--test-batches", type=int, default=32, help="test batches of the barrier (the same for every row)")
    ap.add_argument("--train-batches", type=int, default=1000, help="learned/dual: training batches (1000: all)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr-dual", type=float, default=5e-3)
    ap.add_argument("--lr-learned", type=float, default=1e-2)
    ap.add_argument("--lam-range", default="0.4,0.6")
    ap.add_argument("--val-batches", type=int, default=16)
    ap.add_argument("--val-points", type=int, default=5)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--faster", default="qk_map=3", help="dual-faster: FAMILY=FACTOR,... (the rate of each family)")
    ap.add_argument("--tables-only", action="store_true", help="print the tables from the reports, run nothing")
    record.add_argument(ap, "rotary_study")
    args = ap.parse_args()
    args.rows = args.rows.split(",")
    bad = [r for r in args.rows if r not in ROWS]
    if bad:
        raise SystemExit(f"unknown rows {bad}; choose from {', '.join(ROWS)}")
    names = args.pairs.split(",")
    if not args.tables_only:
        for n in names:
            fams = families_of(str(Path(args.runs) / f"ts-char-{n}-demo-seed1"))
            for label, method, groups in plan(args, n, fams):
                run_row(args, n, label, method, groups)
    print(tables(Path(args.work), names))
    record_result(args, names)


def record_result(args, names: list[str]) -> None:
    """Every row of this run with a report, as a record of benchmarks/results/rotary_study.json."""
    work, rows = Path(args.work), []
    for n in names:
        labels = [label for label, _, _ in plan(args, n, list(FAMILY_LABELS))]
        for label in labels:
            f = figures(work / n / label)
            if f is not None:
                learn = f"{f['best']}, {f['before']:.4f} -> {f['after']:.4f}" if f.get("best") is not None else "–"
                rows.append([n, label, f"{f['l0']:.3f}", f"{f['l1']:.3f}", f"{f['barrier']:.4f} ± {f['se']:.4f}",
                             str(f["lam"]), learn, f"{f['seconds']:.0f}" if "seconds" in f else "–"])
    key = f"pairs {args.pairs}, rows {','.join(args.rows)}, {args.steps} steps"
    record.save(args.results, "rotary_study", key, key, [record.table("test barrier ± s.e. at the peak λ", [
        "pair", "row", "L(A)", "L(B)", "barrier", "peak λ", "best step, validation before -> after", "align s"], rows)])


if __name__ == "__main__":
    main()
