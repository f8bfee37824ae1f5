"""One schema for every benchmark's result, `benchmarks/results/<name>.json`, and the one writer of it.

    {"benchmark": NAME, "script": "benchmarks/NAME.py", "measures": "...", "inputs": ["pairs.py name", ...],
     ["pairs_command": "python benchmarks/pairs.py ..." where the names alone do not train the inputs,]
     "records": [{"key": ..., "title": ..., "commands": ["python benchmarks/NAME.py ..."],
                  "commit": 40 hex digits, "machine": {"cpu": ..., "cores": ..., "torch": ...},
                  "threads": torch threads, "tables": [{"title": ..., "columns": [...], "rows": [[...]]}],
                  "notes": "..."}]}

A record is one run (or one set of runs) of the script: its command lines, the commit the code was at
(`git rev-parse HEAD`; recorded figures name the commit that recorded them, the code measured being at or
before it), the machine (CPU model, logical cores, torch version; "not recorded" where a record does not
say) and its figures as tables of strings, printed as measured. A benchmark run with `--results FILE`
(default: its own file here) replaces the record of the same key, or adds one: the file keeps the latest
figures of each setting, and git keeps the history. `benchmarks/make_readme.py` writes benchmarks/README.md
from these files. Paths are written relative to the checkout (or by their last component when outside
its parent), never as absolute paths of a machine.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NOT_RECORDED = "not recorded"


def cpu_model() -> str:
    """The processor's model name as the system reports it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or NOT_RECORDED


def machine() -> dict:
    import torch

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__}


def commit() -> str:
    """HEAD's commit, with "+changes" when the working tree differs from it."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "HEAD") or NOT_RECORDED
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def portable(arg: str) -> str:
    """An argument with any absolute path made relative to the checkout (or its last component)."""
    if not os.path.isabs(arg):
        return arg
    path = Path(arg).resolve()
    if ROOT.parent != Path(ROOT.anchor) and path.is_relative_to(ROOT.parent):
        return os.path.relpath(path, ROOT)
    return path.name


def command(argv: list[str] | None = None) -> str:
    """This process's command line as it would be typed in the checkout."""
    argv = sys.argv if argv is None else argv
    return shlex.join(["python", portable(argv[0]), *map(portable, argv[1:])])


def table(title: str, columns: list[str], rows: list[list]) -> dict:
    return {"title": title, "columns": list(columns), "rows": [[str(c) for c in r] for r in rows]}


def add_argument(parser, name: str) -> None:
    """`--results FILE` (default this benchmark's file; `-` writes none)."""
    parser.add_argument("--results", default=str(RESULTS / f"{name}.json"),
                        help="result file whose record for this setting is replaced ('-': none)")


def _docstring(script: Path) -> str:
    import ast

    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def load(path: Path | str) -> dict:
    return json.loads(Path(path).read_text())


def _json(value, indent: str = "") -> str:
    """JSON with one line per table row (a list of scalars stays on one line)."""
    inner = indent + " "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + _json(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False)


def dump(result: dict, path: Path | str) -> None:
    Path(path).write_text(_json(result) + "\n")


def save(path: Path | str | None, name: str, key: str, title: str, tables: list[dict], notes: str = "",
         commands: list[str] | None = None, threads: int | None = None) -> dict | None:
    """Replace (or add) the record `key` of result file `path` with this run's; `path` None or '-': nothing.
    `threads`: the torch threads of the measured run (default this process's)."""
    if path in (None, "-"):
        return None
    import torch

    path = Path(path)
    script = ROOT / "benchmarks" / f"{name}.py"
    result = load(path) if path.is_file() else {
        "benchmark": name, "title": name, "script": f"benchmarks/{name}.py", "measures": _docstring(script), "inputs": [],
        "records": []}
    rec = {"key": key, "title": title, "commands": commands or [command()], "commit": commit(),
           "machine": machine(), "threads": threads or torch.get_num_threads(), "tables": tables, "notes": notes}
    result["records"] = [r for r in result["records"] if r["key"] != key] + [rec]
    dump(result, path)
    print(f"result recorded in {portable(str(path.resolve()))} (record {key!r})", flush=True)
    return rec


#: a record's keys and the machine's
RECORD_KEYS = ("key", "title", "commands", "commit", "machine", "threads", "tables", "notes")
MACHINE_KEYS = ("cpu", "cores", "torch")


def problems(result: dict) -> list[str]:
    """What makes `result` differ from the schema above (empty when it follows it)."""
    import re

    out = [f"no {k!r}" for k in ("benchmark", "title", "script", "measures", "inputs", "records") if k not in result]
    if "script" in result and not (ROOT / result["script"]).is_file():
        out.append(f"script {result['script']} does not exist")
    for rec in result.get("records", []):
        where = f"record {rec.get('key')!r}"
        out += [f"{where}: no {k!r}" for k in RECORD_KEYS if k not in rec]
        out += [f"{where}: machine has no {k!r}" for k in MACHINE_KEYS if k not in rec.get("machine", {})]
        if not re.fullmatch(r"[0-9a-f]{40}(\+changes)?", str(rec.get("commit", ""))):
            out.append(f"{where}: commit {rec.get('commit')!r} is not a full commit id")
        if not rec.get("commands"):
            out.append(f"{where}: no command")
        for t in rec.get("tables", []):
            if any(len(r) != len(t["columns"]) for r in t["rows"]):
                out.append(f"{where}, table {t['title']!r}: a row's length differs from the columns'")
    return out
