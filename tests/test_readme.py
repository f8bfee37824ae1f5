"""The README runs as written, and its figures are current.

- "Merge two models": the shell block, every `symmerge` line through `cli.main` (comments dropped),
  then the Python block exactly as printed, both in an empty folder (their relative `runs/...` paths);
- the cheap figures of `benchmarks/readme_figures.py` (a fresh run gives what the README quotes), with
  a negative control (a changed figure is reported stale); the expensive demo row is compared by
  `python benchmarks/readme_figures.py --figures demo`, and here only found;
- `python -m symmerge` is the CLI.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from symmerge.cli import main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import readme_figures as rf  # noqa: E402

README = (ROOT / "README.md").read_text()


def blocks(section: str, language: str) -> list[str]:
    """The ```language code blocks of the README section (### or ##) titled `section`."""
    start = README.index(section + "\n")
    end = re.search(r"\n##+ ", README[start + len(section):])
    text = README[start: start + len(section) + (end.start() if end else len(README))]
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_merge_two_models_recipe_and_python_example_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (shell,) = blocks("### Merge two models", "bash")
    lines = [shlex.split(line, comments=True) for line in shell.splitlines()]
    assert [argv[0] for argv in lines if argv] == ["symmerge"] * 6
    for argv in filter(None, lines):
        assert main(argv[1:]) == 0, argv
    assert (tmp_path / "runs/pair-mid/model.safetensors").is_file() and (tmp_path / "align.json").is_file()
    (python,) = blocks("### Merge two models", "python")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(python, "README.md (Merge two models)", "exec"), {"__name__": "readme"})
    printed = re.findall(r"^(plain averaging|weight matching) loss barrier (\d+\.\d+)$", out.getvalue(), re.M)
    assert [p[0] for p in printed] == ["plain averaging", "weight matching"], out.getvalue()
    from transformers import ViTForImageClassification

    ViTForImageClassification.from_pretrained(str(tmp_path / "runs/api-mid"))  # a stock checkpoint


@pytest.mark.parametrize("name", [n for n, f in rf.FIGURES.items() if f.cheap])
def test_cheap_readme_figures_are_current(name):
    figure = rf.FIGURES[name]
    new = rf.fresh(figure)
    assert rf.quoted(figure) == new, f"README.md's {name} figure is stale: run benchmarks/readme_figures.py --update"
    # negative control: a README quoting another value is found stale
    m = re.search(figure.pattern, README)
    changed = README[: m.start(1)] + "9" + README[m.start(1) + 1:]
    assert rf.quoted(figure, changed) != new


def test_every_figure_is_found_in_the_readme():
    for figure in rf.FIGURES.values():
        assert all(re.fullmatch(r"\d+\.\d+", v) for v in rf.quoted(figure)), figure.name


def test_python_dash_m_symmerge_is_the_cli_and_documented():
    assert "python -m symmerge" in README
    done = subprocess.run([sys.executable, "-m", "symmerge", "--version"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0 and done.stdout.startswith("symmerge "), done
