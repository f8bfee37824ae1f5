"""The defaults on many models and on width pairs (no tuning flags): `symmerge merge --method dual` on four
models of one family, and `symmerge align --method dual` on a narrow model against one of twice its width,
each against averaging without alignment.

For each family (`FAMILIES`: the pairs.py names of its four models and of its wide model; train them first
with `python benchmarks/pairs.py --set many-width`):

- four models: `merge --method weight` and `merge --method dual` with `--aligned`, then `symmerge barrier` of
  the four aligned models and of the four as trained, on the test split: the excess of the uniform average's
  loss over the mean of the endpoints' (and the largest over 8 Dirichlet draws);
- the width pair (seed 0 narrow, seed 1 wide): `expand` of the narrow one into the wide one's config (the
  bare expansion), `align --method weight` and `align --method dual`, then the test barrier of each pair.

A step whose output already exists is not run again (its report is read), and an interrupted dual run is
continued from its last state (`default_dual.symmerge`), so an interrupted benchmark goes on where it stopped;
each command runs in a fresh process at one thread. `--part many|width` runs one half; `--epochs E` and
`--extend X` give the dual runs that length, recorded as FAMILY-PART-epochsE[-extendX].

    python benchmarks/pairs.py --set many-width
    python benchmarks/default_many.py vit gpt2 llama
    python benchmarks/default_many.py gpt2 --part width --epochs 4 --extend 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import default_dual
import pairs
import record

#: family -> (pairs.py name of the four models, pairs.py name of the wide model, data file under --data-root)
FAMILIES = {
    "vit": ("vit-demo", "vit-wide", "mnist/mnist.pkl.gz"),
    "gpt2": ("gpt2-char-demo", "gpt2-char-wide", "tinyshakespeare.txt"),
    "llama": ("llama-char-demo", "llama-char-wide", "tinyshakespeare.txt"),
}
SEEDS = (0, 1, 2, 3)
MANY_COLUMNS = ["models", "plain excess / simplex", "weight excess / simplex (ratio)",
                "default dual excess / simplex (ratio)", "--lr auto", "steps (planned + learned on)", "best step",
                "validation objective: start -> best",
                "time: learning, validating, past the plan, rate search (s)"]
WIDTH_COLUMNS = ["pair", "bare expansion", "weight (ratio)", "default dual (ratio)", "--lr auto",
                 "steps (planned + learned on)", "best step", "validation barrier: start -> best",
                 "time: learning, validating, past the plan, rate search (s)"]


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def many(family: str, runs: str, data_root: str, work: Path, commands: list[str],
         variant: default_dual.Variant = default_dual.DEFAULT) -> list[str]:
    """Four models: plain, weight and default dual merges' test excess (average; simplex); `variant`: the dual
    merge's added flags (its outputs labelled with them; the plain and weight rows are shared)."""
    name, _, data_file = FAMILIES[family]
    models = [folder for folder, _ in pairs.commands(name, SEEDS, runs, data_root)]
    data = f"{data_root}/{data_file}"
    test = [*default_dual.test_args(family == "vit"), "--points", "5", "--simplex-points", "8", "--seed", "0"]
    rows, dual = {}, f"dual{variant.suffix()}"
    for method, label in (("weight", "weight"), ("dual", dual)):
        out, aligned, rep = work / f"{family}-many-{label}", work / f"{family}-many-{label}-aligned", \
            work / f"{family}-many-{label}.json"
        flags = ["--data", data, *variant.flags()] if method == "dual" else []
        default_dual.symmerge(["merge", *models, "-o", str(out), "--aligned", str(aligned), "--method", method,
                               *flags, "--json", str(rep)], rep, commands, learns=out if method == "dual" else None)
        rows[label] = [str(aligned / str(i + 1)) for i in range(len(models))]
    rows["plain"] = models
    got = {}
    for label, paths in rows.items():
        js = work / f"{family}-many-{label}-barrier.json"
        default_dual.symmerge(["barrier", *paths, "--data", data, *test, "--json", str(js)], js, commands)
        got[label] = _read(js)
    plain = got["plain"]["average_excess"]

    def cell(label: str) -> str:
        b = got[label]
        ratio = f" ({b['average_excess'] / plain:.3f})" if label != "plain" else ""
        return f"{b['average_excess']:.4f} / {b['simplex_barrier']:.4f}{ratio}"

    r = _read(work / f"{family}-many-{dual}.json")
    best = next(h for h in r["history"] if h["step"] == r["best_step"])
    return [f"4 {family} ({name}, seeds 0-3){variant.suffix()}", cell("plain"), cell("weight"), cell(dual),
            *default_dual.learning_columns(r, r["settings"]["lr"], r["objective_before"], best["objective"])]


def width(family: str, runs: str, data_root: str, work: Path, commands: list[str],
          variant: default_dual.Variant = default_dual.DEFAULT) -> list[str]:
    """The width pair: the bare expansion's, weight matching's and the default dual's test barrier; `variant`:
    the dual run's added flags (as in `many`)."""
    name, wide, data_file = FAMILIES[family]
    (narrow, _), = pairs.commands(name, (0,), runs, data_root)
    (big, _), = pairs.commands(wide, (1,), runs, data_root)
    data = f"{data_root}/{data_file}"
    label = f"dual{variant.suffix()}"
    bare, weight, dual = work / f"{family}-width-bare", work / f"{family}-width-weight", work / f"{family}-width-{label}"
    rep = work / f"{family}-width-{label}.json"
    default_dual.symmerge(["expand", narrow, "--like", big, "-o", str(bare)], bare, commands)
    default_dual.symmerge(["align", narrow, big, "-o", str(weight), "--method", "weight"], weight, commands)
    default_dual.symmerge(["align", narrow, big, "-o", str(dual), "--method", "dual", "--data", data,
                           *variant.flags(), "--json", str(rep)], rep, commands, learns=dual)
    got = {}
    for row, at, (x, y) in (("bare", "bare", (bare, big)), ("weight", "weight", (bare, weight)),
                            ("dual", label, (dual / "A", dual / "B"))):  # row name, file label, the pair
        js = work / f"{family}-width-{at}-barrier.json"
        default_dual.symmerge(["barrier", str(x), str(y), "--data", data, *default_dual.test_args(family == "vit"),
                               "--points", "11", "--json", str(js)], js, commands)
        got[row] = _read(js)["barrier"]
    r = _read(rep)
    best = next(h for h in r["history"] if h["step"] == r["best_step"])
    return [f"{family}: seed 0 into {wide} seed 1{variant.suffix()}", f"{got['bare']:.4f}",
            f"{got['weight']:.4f} ({got['weight'] / got['bare']:.3f})", f"{got['dual']:.4f} ({got['dual'] / got['bare']:.3f})",
            *default_dual.learning_columns(r, r["plan"]["lr"], r["barrier_before"], best["barrier"])]


PARTS = {"many": (many, MANY_COLUMNS, "four models, the default merge --method dual"),
         "width": (width, WIDTH_COLUMNS, "a ×2 width pair, the default align --method dual")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="+", choices=list(FAMILIES))
    ap.add_argument("--part", choices=[*PARTS, "both"], default="both")
    default_dual.add_variant(ap, "FAMILY-PART")
    args, work = default_dual.parse(ap, "default_many", "runs/default-many")
    variant = default_dual.parse_variant(args)
    for family in args.families:
        for part in PARTS if args.part == "both" else (args.part,):
            measure, columns, what = PARTS[part]
            commands: list[str] = []
            row = measure(family, args.runs, args.data_root, work, commands, variant)
            print(row, flush=True)
            record.save(args.results, "default_many", f"{family}-{part}{variant.suffix()}",
                        f"{family}: {what}{variant.words()}",
                        [record.table(f"{family}, {part}", columns, [row])], commands=[record.command(), *commands],
                        notes="test-loss barriers in nats per character (ViT: per image); ratios against the "
                              "first column; validation figures from the dual run's report")


if __name__ == "__main__":
    main()
