"""The README runs as written, and its figures are current.

- "Merge two models": the shell block, every `symmerge` line through `cli.main` (comments dropped),
  then the Python block exactly as printed, both in an empty folder (their relative `runs/...` paths);
- every ```python block of the README is run: "Merge two models" here, "Many models" by
  tests/test_merge_many.py on stand-in models (a new block needs a test);
- the README's figures (`benchmarks/readme_figures.py`, the registry): every result-like number of README.md
  is registered (a figure with its source, or a number that is no result, with the reason); each
  `benchmark` figure equals, at its printed precision, the result cell it names in benchmarks/results/ (a
  changed or swapped figure fails); the `script` ones (the demo row, minutes) are compared by
  `python benchmarks/readme_figures.py --figures script`; each with a negative control;
- `python -m symmerge` is the CLI.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from doc_blocks import code_blocks
from symmerge.cli import main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import readme_figures as rf  # noqa: E402

README = (ROOT / "README.md").read_text()


def blocks(section: str, language: str) -> list[str]:
    """The ```language code blocks of the README section (### or ##) titled `section`."""
    return code_blocks(README, section, language)


def test_merge_two_models_recipe_and_python_example_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (shell,) = blocks("### Merge two models", "bash")
    lines = [shlex.split(line, comments=True) for line in shell.splitlines()]
    assert [argv[0] for argv in lines if argv] == ["symmerge"] * 6
    for argv in filter(None, lines):
        assert main(argv[1:]) == 0, argv
    assert (tmp_path / "runs/pair-mid/model.safetensors").is_file() and (tmp_path / "align.json").is_file()
    (python,) = blocks("### Merge two models", "python")
    out = _run(python, "Merge two models")
    printed = re.findall(r"^(plain averaging|weight matching) loss barrier (-?\d+\.\d+)$", out, re.M)
    assert [p[0] for p in printed] == ["plain averaging", "weight matching"], out
    report = json.loads((tmp_path / "runs/api-align.json").read_text())  # the saved report, as --json writes it
    assert report["command"] == "align" and report["method"] == "weight" and len(report["objective"]) > 1
    from transformers import ViTForImageClassification

    ViTForImageClassification.from_pretrained(str(tmp_path / "runs/api-mid"))  # a stock checkpoint


def _run(python: str, where: str) -> str:
    """A README Python block executed as written; what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(python, f"README.md ({where})", "exec"), {"__name__": "readme"})
    return out.getvalue()


def test_every_python_block_is_run():
    """The README's Python examples are the two blocks the tests run (this module's "Merge two models";
    "Many models": tests/test_merge_many.py::test_readme_python_example_runs)."""
    assert len(re.findall(r"```python\n", README)) == 2
    assert blocks("### Merge two models", "python") and blocks("### Many models", "python")


def test_every_result_number_in_the_readme_is_registered():
    assert rf.registry_problems() == []
    assert rf.unregistered() == [], "register these README figures in benchmarks/readme_figures.py (FIGURES or NOT_FIGURES)"
    # negative control: a figure added to the prose without a registry entry is found, whatever its unit
    added = README.replace("## Documentation\n", "## Documentation\n\nA sweep takes 12 s at "
                           "3.5 GiB, 2.5x its floor, 7% of the time; barrier 0.123, off by 1e-7.\n", 1)
    assert [u.split("'")[1] for u in rf.unregistered(added)] == ["12 s", "3.5 GiB", "2.5x", "7%", "0.123", "1e-7"]
    # ... and a figure the README no longer prints is a registry problem
    assert any("demo-scale" in p for p in rf.registry_problems(re.sub(rf.FIGURES["demo-scale"].pattern, "", README)))


def test_benchmark_figures_are_what_their_result_files_record():
    stale = {f.name: rf.unrecorded(f) for f in rf.FIGURES.values() if f.kind == "benchmark"}
    assert {k: v for k, v in stale.items() if v} == {}, "README figures that differ from benchmarks/results/"
    # negative controls: a value moved past its record's rounding is found, one at the limit is not
    figure = rf.FIGURES["table-llama"]
    m = re.search(figure.pattern, README)
    assert m.group(1) == "1.694"  # benchmarks/results/ablation_barrier.json records 1.6943
    for value, missing in (("1.695", 1), ("1.694", 0), ("0.000", 1)):
        assert len(rf.unrecorded(figure, README[: m.start(1)] + value + README[m.end(1):])) == missing
    # ... two figures of a row swapped are found (learned 0.334 and dual 0.299 exchanged)
    swapped = README[: m.start(4)] + m.group(5) + README[m.end(4): m.start(5)] + m.group(4) + README[m.end(5):]
    assert [u.split(" ")[0] for u in rf.unrecorded(figure, swapped)] == [m.group(5), m.group(4)]
    # ... a value ending a sentence is read whole: "{}." is not matched by its leading "0" and the period after it
    assert re.search(rf.P("left {}."), "left 0.0500. Then").group(1) == "0.0500"
    assert re.search(rf.P("left {}."), "left 0.0500; then") is None
    # ... and a reference that names no single cell is a registry problem
    bad = rf.dataclasses.replace(figure, refs=figure.refs[:-1] + (rf.Ref("ablation_barrier", "demo", "a", "Llama"),))
    assert any("matches 2 rows" in p for p in rf.registry_problems(figures={"table-llama": bad}))


def test_the_readme_says_which_figures_the_test_and_the_script_regenerate():
    paragraph = re.search(r"\*\*Where the figures come from\.\*\*(.*?)\n\n", README, re.S).group(1)
    for f in rf.FIGURES.values():
        if f.kind != "benchmark":
            assert f"`{f.name}`" in paragraph, f.name
    assert "tests/test_readme.py" in paragraph and "--figures" in paragraph


def test_python_dash_m_symmerge_is_the_cli_and_documented():
    assert "python -m symmerge" in README
    done = subprocess.run([sys.executable, "-m", "symmerge", "--version"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0 and done.stdout.startswith("symmerge "), done
