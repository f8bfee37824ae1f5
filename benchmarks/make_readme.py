"""benchmarks/README.md, written from the result files (`benchmarks/results/*.json`, schema in `record.py`).

One section per benchmark: what it measures, its inputs (the trained models and `benchmarks/pairs.py`'s
command that rebuilds them), then each record: the commit and machine it was recorded on, the commands
that produce it, its tables and notes. The README is generated, never edited: `tests/test_benchmarks.py`
fails when the committed file differs from what this script writes.

    python benchmarks/make_readme.py            # rewrite benchmarks/README.md
    python benchmarks/make_readme.py --check    # exit 1 when it is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import pairs
import rebuild_times
from record import NOT_RECORDED

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"

#: the order of the sections; result files not named here follow in alphabetical order
ORDER = ("pairs", "demo_threads", "ablation_barrier", "reproduction_table", "barrier_by_split", "matching_barrier_tiny",
         "learned_barrier_tiny", "rotary_study", "merge_many", "weight_matching_scale", "activation_matching_scale",
         "cost_products", "learned_memory", "learned_step_cost", "lr_search_cost", "train_throughput", "assignment",
         "barrier_throughput", "determinism", "gpu_check", "wm_devices")

INTRO = """\
# Benchmarks

Every benchmark is a script in this folder that writes its figures, with the command, the commit and the
machine, to `results/<name>.json` (one schema, `record.py`); this file is generated from those results by
`python benchmarks/make_readme.py` (do not edit it by hand: a test compares it with the script's output).
A result keeps the latest figures of each setting; their history is in git. The models a benchmark reads
are trained by `python benchmarks/pairs.py NAME ...` (`--list` prints every command), from data beside the
checkout (`../shared/data`). Unless a record says otherwise the figures come from a 2-core CPU machine
shared with other jobs: absolute times are noisy, and the scripts interleave what they compare so that
ratios stay meaningful. "Not recorded" marks what a record does not say.
"""


def load_all(folder: Path = RESULTS) -> list[dict]:
    found = {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}
    names = [n for n in ORDER if n in found] + sorted(n for n in found if n not in ORDER)
    return [found[n] for n in names]


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return keep.strip().replace(" ", "-")


def _wrap(text: str) -> str:
    return textwrap.fill(text, 110, break_long_words=False, break_on_hyphens=False)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(table: dict) -> list[str]:
    out = [f"**{table['title']}**", ""] if table.get("title") else []
    out.append("| " + " | ".join(map(_cell, table["columns"])) + " |")
    out.append("|" + "---|" * len(table["columns"]))
    out += ["| " + " | ".join(map(_cell, row)) + " |" for row in table["rows"]]
    return out + [""]


def machine_line(rec: dict) -> str:
    """Where a record was measured: what it says of the machine, and plainly what it does not say."""
    m = rec["machine"]
    known = lambda key: m.get(key, NOT_RECORDED) != NOT_RECORDED  # noqa: E731
    parts = [f"CPU: {m['cpu']}"] if known("cpu") else []
    parts += [f"{m['cores']} cores"] if known("cores") else []
    parts += [f"torch {m['torch']}"] if known("torch") else []
    if m.get("gpu"):
        parts.append(f"GPU: {m['gpu']}")
    threads = rec.get("threads")
    parts.append(f"{threads} thread{'' if str(threads) == '1' else 's'}" if threads is not None else "threads not recorded")
    unknown = [what for key, what in (("cpu", "CPU model"), ("cores", "core count"), ("torch", "torch version"))
               if not known(key)]
    commit = rec["commit"]
    head = commit[:10] + commit[40:] if len(commit) >= 40 else commit
    tail = f" The {' and '.join(unknown)} {'was' if len(unknown) == 1 else 'were'} not recorded." if unknown else ""
    return f"Recorded at commit `{head}` on a machine with " + ", ".join(parts) + "." + tail


def section(result: dict) -> list[str]:
    out = [f"## {result.get('title', result['benchmark'])}", "", _wrap(f"Script: `{result['script']}`. {result['measures']}"), ""]
    inputs = result.get("inputs") or []
    if result["benchmark"] == "pairs":
        files = ", ".join(f"`{f}`" for f in pairs.data_files())
        out += [_wrap(f"Inputs: the data beside the checkout, `../shared/data` ({files}; GPT-2's `encoder.json` and "
                      "`vocab.bpe` for the `gpt2-bpe-*` models)."), ""]
    elif inputs:
        train = result.get("pairs_command") or "python benchmarks/pairs.py " + " ".join(i.split(" ")[0] for i in inputs)
        out += [_wrap(f"Inputs: {', '.join(f'`{i}`' for i in inputs)}, trained by `{train}`."), ""]
    else:
        out += ["Inputs: none to train (the script builds its own random or built-in inputs).", ""]
    if not result["records"]:
        out += ["No figures recorded yet: run the script (`--help` lists its options); it records them here.", ""]
    for rec in result["records"]:
        out += [f"### {rec['title']}", "", _wrap(machine_line(rec)), "", "```bash", *rec["commands"], "```", ""]
        for table in rec["tables"]:
            out += markdown_table(table)
        if rec.get("notes"):
            out += [_wrap(rec["notes"]), ""]
    if result["benchmark"] == "pairs":
        out += rebuild_times.section(result, _wrap)
    return out


def render(results: list[dict] | None = None) -> str:
    results = load_all() if results is None else results
    lines = [INTRO, "| benchmark | script |", "|---|---|"]
    lines += [f"| [{r.get('title', r['benchmark'])}](#{_anchor(r.get('title', r['benchmark']))}) | `{r['script']}` |"
              for r in results]
    lines.append("")
    for result in results:
        lines += section(result)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when benchmarks/README.md is out of date")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        same = README.read_text() == text
        print("benchmarks/README.md is " + ("current" if same else "out of date: run python benchmarks/make_readme.py"))
        return 0 if same else 1
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
