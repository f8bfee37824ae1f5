"""The default `symmerge align --method dual` (no tuning flags) on trained pairs: its test barrier against plain
averaging's, and where its time went.

For each `pairs.py` name (seeds 0 and 1; train them first), one command with the defaults: the full recipe,
`--lr auto` (bracketed), the best state on the validation split. Then `symmerge barrier` of the two outputs
and of the plain pair on the test split (11 points, 55 batches of 16 windows). A step whose output already
exists is not run again (its report is read) and an interrupted dual run is continued from its last state,
so an interrupted benchmark goes on where it stopped. Each command runs in a fresh process at one thread.
`--epochs E` and `--extend X` run the same command with that length (a length given fixes it unless
`--extend` is given too), recorded as NAME-epochsE[-extendX]; `--lam-sampling S` with that λ sampling, recorded
as NAME-lam-samplingS; `--start-from M` learning from matcher M's element, recorded as NAME-startM;
`--learn-seed S` with the learner's seed S (its batch order and λ draws), recorded as NAME-seedS; `--lr-scale F`
with those families' rate factors, recorded as NAME-lr-scale-F; `--batch-size B` with B sequences (images) per
training batch, recorded as NAME-batchB.

    python benchmarks/pairs.py neox-char-demo llama-char-demo
    python benchmarks/default_dual.py neox-char-demo llama-char-demo
    python benchmarks/default_dual.py neox-char-demo --epochs 4 --extend 2   # a third of the epochs, learning on
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pairs
import record

from symmerge.match.outputs import checkpoint_folder

#: the test split every barrier is measured on: 55 batches of 16 windows, or the whole MNIST test set
TEXT_TEST = ["--split", "test", "--batch-size", "16", "--max-batches", "55"]
IMAGE_TEST = ["--split", "test", "--batch-size", "64", "--max-batches", "156"]
COLUMNS = ["pair", "plain", "default dual", "dual / plain", "--lr auto", "steps (planned + learned on)", "best step",
           "validation barrier: start -> best", "time: learning, validating, past the plan, rate search (s)"]


def symmerge(argv: list[str], out: Path, commands: list[str], learns: Path | None = None) -> None:
    """Run `symmerge argv` at one thread unless `out` exists, its printed lines (the plan, the end line) kept in
    `out` with the suffix `.log`; the command line goes to `commands`. `learns`: the
    output folder of a learned or dual run, whose unfinished state (`OUT.learn-state`, written every 50 steps)
    an interrupted benchmark continues with `--resume` (the same steps an uninterrupted run takes; the command
    recorded is the one without it)."""
    commands.append("symmerge " + shlex.join(map(record.portable, argv)))
    if out.exists():
        print(f"exists, not run again: {commands[-1]}", flush=True)
        return
    resume = learns is not None and checkpoint_folder(learns).exists()
    with open(out.with_suffix(".log"), "a") as log:
        subprocess.run([sys.executable, "-m", "symmerge", *argv, *(["--resume"] if resume else [])], check=True,
                       stdout=log, env={**os.environ, "OMP_NUM_THREADS": "1"})
    print(f"ran{' (resumed)' if resume else ''}: {commands[-1]}", flush=True)


@dataclass(frozen=True)
class Variant:
    """The flags a benchmark run adds to the default `align --method dual` / `merge --method dual`: the length
    (`--epochs`, `--extend`), the λ sampling (`--lam-sampling`), what the backward recomputes (`--recompute`: the
    same result, another time), the matcher learning starts from (`--start-from`, labelled `start`) and the
    learner's seed (`--seed`: its batch order and λ draws), the families' rate factors (`--lr-scale`) and the
    training batches' size (`--batch-size`, labelled `batch`); none given is the default recipe (`Variant()`)."""

    epochs: float | None = None
    extend: float | None = None
    lam_sampling: str | None = None
    recompute: str | None = None
    start: str | None = None
    seed: int | None = None
    lr_scale: str | None = None
    batch_size: int | None = None

    def _given(self) -> list[tuple[str, str, str]]:
        """(label word, flag, value) of each flag given."""
        values = (("epochs", "epochs", self.epochs), ("extend", "extend", self.extend),
                  ("lam-sampling", "lam-sampling", self.lam_sampling), ("recompute", "recompute", self.recompute),
                  ("start", "start-from", self.start), ("seed", "seed", self.seed),
                  ("lr-scale-", "lr-scale", self.lr_scale), ("batch", "batch-size", self.batch_size))
        return [(k, f, v if isinstance(v, str) else f"{v:g}") for k, f, v in values if v is not None]

    def flags(self) -> list[str]:
        """The run's flags: `--epochs E`, `--extend X`, `--lam-sampling S`, `--recompute R`, `--start-from M` and
        `--seed S` where given."""
        return [x for _, f, v in self._given() for x in (f"--{f}", v)]

    def suffix(self) -> str:
        """The label's ending: `-epochsE-extendX-lam-samplingS-recomputeR-startM-seedS` for what is given, nothing for the
        default."""
        return "".join(f"-{k}{v}" for k, _, v in self._given())

    def words(self) -> str:
        """A record title's ending: ' with --epochs E --extend X', nothing for the default."""
        return f" with {' '.join(self.flags())}" if self._given() else ""


#: the default recipe
DEFAULT = Variant()


def add_variant(ap: argparse.ArgumentParser, what: str) -> None:
    """`--epochs`, `--extend`, `--lam-sampling`, `--recompute`, `--start-from`, `--learn-seed`, `--lr-scale` and
    `--batch-size` for the dual runs of a benchmark whose records are labelled `what`."""
    ap.add_argument("--epochs", type=float, default=None, help=f"the dual runs' --epochs instead of the default "
                    f"recipe's (records {what}-epochsE)")
    ap.add_argument("--extend", type=float, default=None, help="the dual runs' --extend")
    ap.add_argument("--lam-sampling", default=None, help="the dual runs' --lam-sampling (records ...-lam-samplingS)")
    ap.add_argument("--recompute", default=None, help="the dual runs' --recompute (records ...-recomputeR)")
    ap.add_argument("--start-from", default=None, help="the dual runs' --start-from (records ...-startM)")
    ap.add_argument("--learn-seed", type=int, default=None, help="the dual runs' --seed, the learner's batch order "
                    "and λ draws (records ...-seedS; --seeds are the pair's training seeds)")
    ap.add_argument("--lr-scale", default=None, help="the dual runs' --lr-scale (records ...-lr-scale-FAMILY=FACTOR)")
    ap.add_argument("--batch-size", type=int, default=None, help="the dual runs' --batch-size, sequences (images) per "
                    "training batch (records ...-batchB)")


def parse_variant(args: argparse.Namespace) -> Variant:
    """The `Variant` of a benchmark's parsed `add_variant` flags."""
    return Variant(args.epochs, args.extend, args.lam_sampling, args.recompute, args.start_from, args.learn_seed,
                   args.lr_scale, args.batch_size)


def test_args(vision: bool) -> list[str]:
    """`symmerge barrier`'s flags for the test split (points aside)."""
    return IMAGE_TEST if vision else TEXT_TEST


def test_barrier(name: str, x, y, data: str, out: Path, commands: list[str]) -> float:
    """The test barrier of models `x` and `y` of pair `name` on `data` (11 points, the test split), from `symmerge
    barrier`'s report `out` (run unless it exists; its command line goes to `commands`)."""
    symmerge(["barrier", str(x), str(y), "--data", data, *test_args(pairs.is_vision(name)), "--points", "11",
              "--json", str(out)], out, commands)
    return json.loads(out.read_text())["barrier"]


def learning_columns(r: dict, rate: float, start: float, best: float) -> list[str]:
    """The columns of a learned / dual run's report `r`: its rate, steps, best step, validation figure from
    `start` to `best`, and where its time went."""
    t = r["time"]
    return [f"{rate:g}", f"{r['planned_steps']} + {r['extended_steps']}", str(r["best_step"]),
            f"{start:.4f} -> {best:.4f}",
            f"{t['loop_s']:.0f}, {t['validation_s']:.0f}, {t['past_plan_s']:.0f}, {t.get('search_s', 0):.0f}"]


def measure(name: str, runs: str, data_root: str, work: Path, commands: list[str], seeds=(0, 1),
            variant: Variant = DEFAULT) -> list[str]:
    """The row of pair `name`: `variant` sets the dual run's added flags (the one thing this benchmark varies;
    the plain barrier is the pair's, shared with the default run's)."""
    (a, _), (b, _) = pairs.commands(name, seeds, runs, data_root)
    data = pairs.data_of(name, data_root)
    pair, label = pair_label(name, seeds), pair_label(name, seeds, variant)
    out, rep = work / label, work / f"{label}.json"
    symmerge(["align", a, b, "-o", str(out), "--method", "dual", "--data", data, *variant.flags(),
              "--json", str(rep)], rep, commands, learns=out)
    dual = test_barrier(name, out / "A", out / "B", data, work / f"{label}-dual.json", commands)
    plain = test_barrier(name, a, b, data, work / f"{pair}-plain.json", commands)
    r = json.loads(rep.read_text())
    best = next(h for h in r["history"] if h["step"] == r["best_step"])
    return [label, f"{plain:.4f}", f"{dual:.4f}", f"{dual / plain:.4f}",
            *learning_columns(r, r["plan"]["lr"], r["barrier_before"], best["barrier"])]


def pair_label(name: str, seeds, variant: Variant = DEFAULT) -> str:
    """The pair's name in tables and file names: the pairs.py name, with its seeds where they are not 0 and 1
    and the variant's flags where they are given."""
    label = name if tuple(seeds) == (0, 1) else f"{name}-seeds{seeds[0]}{seeds[1]}"
    return label + variant.suffix()


def parse(ap: argparse.ArgumentParser, name: str, work: str) -> tuple[argparse.Namespace, Path]:
    """The arguments of a benchmark that runs symmerge on trained models (`--runs`, `--data-root`, `--work`:
    `work` by default, made here, and `--results`), and its work folder."""
    ap.add_argument("--runs", default="runs", help="folder the models were trained under (pairs.py --runs)")
    ap.add_argument("--data-root", default="../shared/data")
    ap.add_argument("--work", default=work, help="folder of the outputs and reports")
    record.add_argument(ap, name)
    args = ap.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    return args, Path(args.work)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", help="pairs.py names, each trained at the two --seeds")
    ap.add_argument("--seeds", default="0,1", help="the pair's two training seeds (default 0,1)")
    add_variant(ap, "NAME")
    args, work = parse(ap, "default_dual", "runs/default-dual")
    seeds = tuple(int(x) for x in args.seeds.split(","))
    variant = parse_variant(args)
    for name in args.names:
        commands: list[str] = []
        row = measure(name, args.runs, args.data_root, work, commands, seeds, variant)
        print(row, flush=True)
        key = pair_label(name, seeds, variant)
        record.save(args.results, "default_dual", key, f"{key}: the default align --method dual{variant.words()}",
                    [record.table(name, COLUMNS, [row])], commands=[record.command(), *commands],
                    notes="test-loss barriers in nats per character (ViT: per image); validation barrier from the "
                          "run's report (its 11-point grid on the validation split)")


if __name__ == "__main__":
    main()
