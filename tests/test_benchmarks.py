"""The benchmarks as a product: every benchmark script has a result file in one schema (`benchmarks/record.py`),
results keep no machine paths and no diary (dates, times, who ran what), and a rerun replaces its own record.

Each check has a negative control: a record that breaks the schema, a diary line, a machine path."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
import record  # noqa: E402

#: files of benchmarks/ that are tools, not benchmarks (no result of their own)
TOOLS = {"record.py", "make_readme.py", "readme_figures.py", "readme_runs.py", "figure_refs.py", "reproduction_summary.py"}
#: a machine path, or a diary: a date, a time of day, a session or helper
DIARY = re.compile(r"/(?:work|tmp|root|home)/|\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d(?::\d\d)? UTC\b|\bsession\b|\bhelpers?\b",
                   re.I)


def _results() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (BENCH / "results").glob("*.json")}


def test_every_benchmark_script_has_a_result_in_the_schema():
    results = _results()
    assert {n: record.problems(r) for n, r in results.items() if record.problems(r)} == {}
    scripts = {p.name for p in BENCH.glob("*.py")} - TOOLS | {p.name for p in BENCH.glob("*.sh")}
    assert scripts - {Path(r["script"]).name for r in results.values()} == set()
    assert all(n == r["benchmark"] for n, r in results.items())
    # negative controls: a record without its commit, a short commit id, a table row of the wrong length
    bad = json.loads(json.dumps(results["assignment"]))
    del bad["records"][0]["commit"]
    assert any("commit" in p for p in record.problems(bad))
    bad["records"][0]["commit"] = "b4641fe"
    assert any("full commit id" in p for p in record.problems(bad))
    bad["records"][0]["tables"][0]["rows"][0].append("extra")
    assert any("row's length" in p for p in record.problems(bad))


def test_results_hold_no_machine_paths_and_no_diary():
    for name, result in _results().items():
        text = json.dumps(result, ensure_ascii=False)
        assert not DIARY.search(text), f"{name}.json: {DIARY.search(text).group(0)!r}"
    for line in ("measured 2026-12-01", "at 05:40 UTC", "this session's run", "the helper's job", "/tmp/exp/m0"):
        assert DIARY.search(line), line


def test_a_rerun_replaces_its_own_record_and_writes_the_schema(tmp_path):
    path = tmp_path / "assignment.json"
    table = record.table("seconds", ["n", "s"], [[64, 0.001]])
    record.save(path, "assignment", "n 64", "n 64", [table])
    record.save(path, "assignment", "n 128", "n 128", [table])
    record.save(path, "assignment", "n 64", "n 64 again", [table])
    result = record.load(path)
    assert record.problems(result) == []
    assert [r["title"] for r in result["records"]] == ["n 128", "n 64 again"]
    rec = result["records"][0]
    assert rec["tables"][0]["rows"] == [["64", "0.001"]] and set(rec["machine"]) >= {"cpu", "cores", "torch"}
    assert rec["commands"][0].startswith("python ") and not DIARY.search(json.dumps(result))
    assert record.save("-", "assignment", "k", "t", [table]) is None  # '-': nothing written


def test_paths_in_commands_are_portable():
    assert record.portable(str(BENCH / "assignment.py")) == "benchmarks/assignment.py"
    assert record.portable(str(ROOT.parent / "shared" / "data" / "x.txt")) == "../shared/data/x.txt"
    assert record.portable("/somewhere/else/data.txt") == "data.txt"
    assert record.portable("runs/a") == "runs/a"
    assert record.command([str(BENCH / "assignment.py"), "--sizes", "64"]) == "python benchmarks/assignment.py --sizes 64"


def test_the_benchmarks_readme_is_generated_from_the_results():
    import make_readme

    assert (BENCH / "README.md").read_text() == make_readme.render(), "run python benchmarks/make_readme.py"
    text = make_readme.render()
    assert not DIARY.search(text)
    for result in _results().values():
        assert f"## {result['title']}" in text and f"`{result['script']}`" in text
    # negative control: a figure changed in a result shows in the generated text, which then differs
    results = make_readme.load_all()
    cell = results[0]["records"][0]["tables"][0]["rows"][0]
    cell[-1] = "123.456"
    changed = make_readme.render(results)
    assert changed != text and "| 123.456 |" in changed
