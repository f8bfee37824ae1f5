"""Checkpoints by Hub id (`symmerge.store.hub`): ORG/NAME and ORG/NAME@REVISION read from a hub cache laid out on disk
(`bad_inputs.hub_cache`), offline, never from the network. Every command's results by id (and by a second ref
or a commit) equal the same folder's, and the commit is recorded in every report and output metadata; a folder
that exists wins over an id of the same spelling. Bad ids are in the catalogue (`test_bad_input.py`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from bad_inputs import COMMITS, TEXT, hub_cache, lm
from symmerge.cli import main


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    c = {"root": root, "a": lm(root / "a", 0), "b": lm(root / "b", 1), "wide": lm(root / "wide", 5, width=48)}
    c["hub"] = hub_cache(root, c["a"], c["b"], c["wide"])
    c["text"] = root / "text.txt"
    c["text"].write_text(TEXT * 3)
    return c


@pytest.fixture
def c(made, monkeypatch):
    """The models, with huggingface_hub reading the laid-out cache in offline mode."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(made["hub"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return made


def _run(*argv) -> None:
    assert main([str(a) for a in argv]) == 0


def _weights(folder: Path) -> bytes:
    return (folder / "model.safetensors").read_bytes()


def _hub(path: Path) -> list[dict]:
    return json.loads(path.read_text()).get("hub", [])


def test_transform_by_id_is_transform_by_folder(c, tmp_path):
    for name, model in (("id", "org/pair"), ("folder", c["a"]), ("v1", "org/pair@v1"), ("b", c["b"])):
        _run("transform", model, "-o", tmp_path / name, "--seed", "1")
    assert _weights(tmp_path / "id") == _weights(tmp_path / "folder")
    assert _weights(tmp_path / "v1") == _weights(tmp_path / "b")
    assert _weights(tmp_path / "id") != _weights(tmp_path / "v1")  # negative control: the revision is read
    assert [h["commit"] for h in _hub(tmp_path / "id" / "symmerge.json")] == [COMMITS["a"]]
    assert [(h["revision"], h["commit"]) for h in _hub(tmp_path / "v1" / "symmerge.json")] == [("v1", COMMITS["b"])]
    assert _hub(tmp_path / "folder" / "symmerge.json") == []


def test_align_by_revision_and_commit_is_align_by_folders(c, tmp_path):
    _run("align", "org/pair", "org/pair@v1", "-o", tmp_path / "id", "--json", tmp_path / "id.json", "--max-iters", "3")
    _run("align", "org/pair@" + COMMITS["a"], "org/pair@" + COMMITS["b"], "-o", tmp_path / "commit", "--max-iters", "3")
    _run("align", c["a"], c["b"], "-o", tmp_path / "folder", "--json", tmp_path / "folder.json", "--max-iters", "3")
    assert _weights(tmp_path / "id") == _weights(tmp_path / "folder") == _weights(tmp_path / "commit")
    by_id, by_folder = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("id", "folder"))
    assert by_id["objective"] == by_folder["objective"]
    assert [(h["given"], h["commit"]) for h in by_id["hub"]] == [("org/pair", COMMITS["a"]), ("org/pair@v1", COMMITS["b"])]
    assert "hub" not in by_folder
    assert [h["commit"] for h in _hub(tmp_path / "commit" / "symmerge.json")] == [COMMITS["a"], COMMITS["b"]]


def test_every_other_command_takes_ids(c, tmp_path):
    """interpolate, merge, expand (both NARROW and --like), eval and barrier: same figures and weights as by folder."""
    for name, a, b, wide in (("id", "org/pair", "org/pair@v1", "org/wide"), ("folder", c["a"], c["b"], c["wide"])):
        _run("interpolate", a, b, "--lam", "0.3", "-o", tmp_path / f"interp-{name}")
        _run("merge", a, b, "-o", tmp_path / f"merge-{name}", "--max-rounds", "2", "--json", tmp_path / f"merge-{name}.json")
        _run("expand", a, "--like", wide, "-o", tmp_path / f"expand-{name}")
        _run("eval", b, "--data", c["text"], "--json", tmp_path / f"eval-{name}.json", "--max-batches", "1")
        _run("barrier", a, b, "--data", c["text"], "--points", "3", "--max-batches", "1", "--json",
             tmp_path / f"barrier-{name}.json")
    for step in ("interp", "merge", "expand"):
        assert _weights(tmp_path / f"{step}-id") == _weights(tmp_path / f"{step}-folder"), step
        assert _hub(tmp_path / f"{step}-id" / "symmerge.json"), step
    assert [h["repo_id"] for h in _hub(tmp_path / "expand-id" / "symmerge.json")] == ["org/pair", "org/wide"]
    for report, key in (("merge", "objective"), ("eval", "loss"), ("barrier", "loss")):
        by_id, by_folder = (json.loads((tmp_path / f"{report}-{n}.json").read_text()) for n in ("id", "folder"))
        assert by_id[key] == by_folder[key], report
        assert by_id["hub"] and "hub" not in by_folder, report


def test_a_folder_wins_over_an_id_of_its_spelling(c, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(c["b"], tmp_path / "org" / "pair")  # org/pair: B here, A in the cache
    _run("inspect", "org/pair", "--json")
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["path"] == "org/pair" and "hub" not in report
    assert "org/pair is a folder here and a Hub id in the cache; reading the folder" in err
    shutil.rmtree(tmp_path / "org")  # negative control: without the folder, the id is read
    _run("inspect", "org/pair", "--json")
    out, err = capsys.readouterr()
    assert json.loads(out)["hub"][0]["commit"] == COMMITS["a"] and "reading the folder" not in err


def test_hub_variables_are_huggingface_hubs_own(made, tmp_path):
    """In a fresh process, HF_HUB_CACHE and HF_HUB_OFFLINE reach huggingface_hub unchanged (nothing overrides them);
    with the cache elsewhere (HF_HOME pointing to an empty folder) the same id is not found."""
    src = Path(__file__).parents[1] / "src"
    base = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    base.pop("HF_HUB_CACHE", None)
    argv = [sys.executable, "-m", "symmerge", "inspect", "org/pair@v1", "--json"]
    found = subprocess.run(argv, env={**base, "HF_HUB_CACHE": str(made["hub"])}, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["hub"][0]["commit"] == COMMITS["b"]
    missing = subprocess.run(argv, env={**base, "HF_HOME": str(tmp_path)}, capture_output=True, text=True)
    assert missing.returncode == 2 and "is not cached in " + str(tmp_path / "hub") in missing.stderr
