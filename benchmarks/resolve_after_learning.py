"""Whether a learned path's permutations can be improved by solving them again: the default dual run's outputs
(A' and B', from `benchmarks/default_dual.py NAME`) with B's head and FFN permutations solved once more by weight
matching and by activation matching (`--blocks activation`: its own permutations from the activations, not the
choice among candidates of `--blocks best`), each with the continuous maps the run learned held as they are.

Both outputs compute their inputs' functions and so does every permutation of B', so the three paths join the
same two functions; only the coordinates of B' differ. A re-solved permutation that moves many units and raises the
test barrier says the learned continuous maps are fitted to the permutations they were learned with: alternating
a matcher's permutations with learning would have to learn the maps again after each change. Test barriers as
`default_dual.py` measures them (11 points, the test split).

    python benchmarks/default_dual.py gpt2-char-demo llama-char-demo
    python benchmarks/resolve_after_learning.py gpt2-char-demo llama-char-demo
    python benchmarks/resolve_after_learning.py llama-char-demo --learn-seed 1   # the outputs of that variant
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pairs
import record
from default_dual import DEFAULT, Variant, add_variant, pair_label, parse, parse_variant, symmerge, test_barrier

COLUMNS = ["pair", "plain", "default dual", "weight re-solve: units moved", "weight re-solve: barrier",
           "activation re-solve: units moved", "activation re-solve: barrier"]
#: the permutation families solved again (the continuous ones stay as learned)
PERMUTATIONS = "head_perm,ffn_perm"


def _moved(report: dict) -> str:
    """FFN units and heads a re-solve moved, from its report's family summary."""
    fam = report["families"]
    heads = fam.get("head_perm", {})
    return f"{fam['ffn_perm']['units_moved']} units, {heads.get('heads_moved', 0)} heads"


def measure(name: str, runs: str, data_root: str, work: Path, commands: list[str],
            variant: Variant = DEFAULT) -> list[str]:
    """The row of the dual run `default_dual.py NAME` made with `variant`'s flags (its outputs in `work`)."""
    (a, _), (b, _) = pairs.commands(name, (0, 1), runs, data_root)
    data = pairs.data_of(name, data_root)
    label = pair_label(name, (0, 1), variant)
    dual = work / label
    if not (dual / "A").is_dir():
        raise SystemExit(f"{dual} has no dual outputs: run benchmarks/default_dual.py {name} "
                         f"{' '.join(variant.flags())} --work {work} first")
    plain = test_barrier(name, a, b, data, work / f"{name}-plain.json", commands)
    learned = test_barrier(name, dual / "A", dual / "B", data, work / f"{label}-dual.json", commands)
    row = [label, f"{plain:.4f}", f"{learned:.4f}"]
    for method in ("weight", "activation"):
        out, rep, bar = (work / f"{label}-resolve-{method}{s}" for s in ("", ".json", "-barrier.json"))
        flags = ["--data", data, "--blocks", "activation"] if method == "activation" else []
        symmerge(["align", str(dual / "A"), str(dual / "B"), "-o", str(out), "--method", method, "--groups",
                  PERMUTATIONS, *flags, "--json", str(rep)], rep, commands)
        row += [_moved(json.loads(rep.read_text())),
                f"{test_barrier(name, dual / 'A', out, data, bar, commands):.4f}"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", help="pairs.py names whose default dual outputs are in --work")
    add_variant(ap, "NAME")
    args, work = parse(ap, "resolve_after_learning", "runs/default-dual")
    variant = parse_variant(args)
    for name in args.names:
        commands: list[str] = []
        row = measure(name, args.runs, args.data_root, work, commands, variant)
        print(row, flush=True)
        key = pair_label(name, (0, 1), variant)
        record.save(args.results, "resolve_after_learning", key, f"{key}: the dual path's permutations solved again",
                    [record.table(name, COLUMNS, [row])], commands=[record.command(), *commands],
                    notes="test-loss barriers in nats per character (ViT: per image), 11 points; the dual outputs "
                          f"benchmarks/default_dual.py wrote under the label {key} (align flags: "
                          f"{' '.join(variant.flags()) or 'none'}); "
                          f"weight and activation matching of --groups {PERMUTATIONS} only, activation matching "
                          "with --blocks activation")


if __name__ == "__main__":
    main()
