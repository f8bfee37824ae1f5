"""The docs pages' figures (`benchmarks/doc_figures.py`, part of the registry of `benchmarks/readme_figures.py`):
every result-like number of every page of docs/ is registered (a figure with the result cells it comes from, or a
number that is no result, with the reason), and each figure equals its cells at its printed precision; each
check with a negative control. README.md's are tests/test_readme.py's."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import readme_figures as rf  # noqa: E402

DOCS = rf.PAGES[1:]
LIMITATIONS, TWO_MODELS = "docs/limitations.md", "docs/guides/two-models.md"


def test_the_registry_covers_every_docs_page_and_each_has_no_unregistered_number():
    assert rf.PAGES[0] == "README.md" and {LIMITATIONS, TWO_MODELS, "docs/getting-started.md"} <= set(DOCS)
    assert {p: rf.registry_problems(page=p) + rf.unregistered(page=p) for p in DOCS} == {p: [] for p in DOCS}
    assert rf.problems() == []
    # negative controls: a number added to a docs page without an entry is found, whatever its unit ...
    added = rf.read(LIMITATIONS) + ("\nA merge takes 12 s at 3.5 GiB, 2.5x its floor; barrier -0.123, off by 1e-7; "
                                    "it took 34 minutes, 3 hours\n")
    assert [u.split("'")[1] for u in rf.unregistered(added, page=LIMITATIONS)] == ["12 s", "3.5 GiB", "2.5x", "0.123",
                                                                                    "1e-7", "34 minutes", "3 hours"]
    # ... README.md's entries cover README.md only: its not-a-figure text on a docs page is unregistered there
    assert len(rf.unregistered(rf.read(TWO_MODELS) + "\nA loss barrier of 0.000 means\n", page=TWO_MODELS)) == 1
    # ... a docs figure its page no longer prints, and an entry naming a page not in PAGES, are registry problems
    figure = rf.FIGURES["limitations-memory"]
    assert any(figure.name in p for p in rf.registry_problems(re.sub(figure.pattern, "", rf.read(LIMITATIONS)),
                                                              page=LIMITATIONS))
    rf.FIGURES["elsewhere"] = rf.dataclasses.replace(figure, name="elsewhere", page="docs/nowhere.md")
    try:
        assert any("docs/nowhere.md is not one of PAGES" in p for p in rf.problems())
    finally:
        del rf.FIGURES["elsewhere"]


def test_docs_figures_are_what_their_result_files_record():
    figures = [f for f in rf.FIGURES.values() if f.page != "README.md"]
    assert figures and all(f.kind == "benchmark" for f in figures)
    assert {f.name: rf.unrecorded(f) for f in figures if rf.unrecorded(f)} == {}, "docs figures that differ from benchmarks/results/"
    # negative controls: a value moved past its record's rounding is found, one at the limit is not ...
    figure = rf.FIGURES["two-models-vit-0-1"]
    text = rf.read(TWO_MODELS)
    m = re.search(figure.pattern, text)
    assert m.groups() == ("0.233", "0.296", "0.225", "0.255")  # activation_diagnosis.json: 0.2333, 0.2960, 0.2245, 0.2552
    for value, missing in (("0.234", 1), ("0.2333", 0), ("0.2", 0), ("0.3", 1)):
        assert len(rf.unrecorded(figure, text[: m.start(1)] + value + text[m.end(1):])) == missing
    # ... two values of a row swapped are found
    swapped = text[: m.start(1)] + m.group(2) + text[m.end(1): m.start(2)] + m.group(1) + text[m.end(2):]
    assert [u.split(" ")[0] for u in rf.unrecorded(figure, swapped)] == [m.group(2), m.group(1)]
    # ... a changed mean over pairs, a value whose sign is dropped, and a run's minutes summed from its timed parts
    # (default_many.json: 1224 s and 2006 s) rounded the wrong way, fail
    for name, i, value, page in (("limitations-blocks-best", 1, "0.482", LIMITATIONS),
                                 ("limitations-width-vit", 1, "3.545", LIMITATIONS),
                                 ("many-models-minutes", 2, "34", "docs/guides/many-models.md")):
        figure, text = rf.FIGURES[name], rf.read(page)
        m = re.search(figure.pattern, text)
        assert rf.unrecorded(figure, text[: m.start(i)] + value + text[m.end(i):])[0].startswith(value)


def test_update_writes_the_figures_page(tmp_path, monkeypatch):
    (tmp_path / TWO_MODELS).parent.mkdir(parents=True)
    shutil.copy(ROOT / TWO_MODELS, tmp_path / TWO_MODELS)
    monkeypatch.setattr(rf, "ROOT", tmp_path)
    figure = rf.FIGURES["two-models-gpt2-0-1"]
    rf.update(figure, ["0.1", "0.2", "0.3", "0.4"])
    assert rf.quoted(figure) == ["0.1", "0.2", "0.3", "0.4"] and rf.read(TWO_MODELS) != (ROOT / TWO_MODELS).read_text()
