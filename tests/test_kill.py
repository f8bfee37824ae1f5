"""Kills of the writing commands: a SIGKILL (or SIGTERM) at any point leaves no OUT, and the next run
into the same OUT leaves no temporary folder (it removes what the killed run left, `io.clean_stale`).

Each command runs in a subprocess on models deep enough that writing takes a moment. The kill lands
at a point chosen by what exists on disk: as soon as the temporary folder appears ("start"), once it
holds its first file ("writing"). A SIGTERM is handled (cli.main and io remove
the temporary folder at once); a SIGKILL is not, so the litter is removed by the next run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bad_inputs import leftovers, lm
from symmerge.cli import main


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    return {"a": lm(root / "a", 0, n_layer=8, width=144), "b": lm(root / "b", 1, n_layer=8, width=144)}


def _transform(m, o):
    return ["transform", str(m["a"]), "-o", o]


def _align(m, o):
    return ["align", str(m["a"]), str(m["b"]), "-o", o, "--method", "weight", "--max-iters", "1"]


def _merge(m, o):
    """OUT and, as one unit with it, `--aligned` OUT-aligned (a sibling: the test's folder holds both)."""
    return ["merge", str(m["a"]), str(m["b"]), "-o", o, "--aligned", f"{o}-aligned", "--max-rounds", "1", "--max-iters", "1"]


#: runs of a command the test starts until one is killed inside its window
ATTEMPTS = 3


def _aligned(out: Path) -> Path:
    return out.with_name(f"{out.name}-aligned")


def _aligned_writing(out: Path) -> bool:
    """The merge has written OUT's temporary folder and is writing the aligned models'."""
    return _writing(_aligned(out))


def _started(out: Path) -> bool:
    return bool(list(out.parent.glob(f".{out.name}.tmp-*")))


def _writing(out: Path) -> bool:
    return any(any(t.iterdir()) for t in out.parent.glob(f".{out.name}.tmp-*"))


#: each window and each signal once: the commands write through one mechanism (`io.AtomicFolder`), so a command's
#: kill at one window stands for the others'; merge, the one that commits two folders as one, at each of its own
KILLS = [
    ("transform", _transform, _started, signal.SIGTERM),
    ("align-weight", _align, _writing, signal.SIGKILL),
    ("merge", _merge, _started, signal.SIGKILL),
    ("merge", _merge, _aligned_writing, signal.SIGKILL),
]


@pytest.mark.parametrize("name,argv_of,when,sig", KILLS,
                         ids=[f"{k[0]}-{k[2].__name__.strip('_')}-{k[3].name.lower()}" for k in KILLS])
def test_killed_write_leaves_no_output_and_the_next_run_no_litter(name, argv_of, when, sig, big, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "symmerge", *argv_of(big, str(out))]
    src = str(Path(__file__).parents[1] / "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    for _ in range(ATTEMPTS):  # a loaded machine can starve this poller past the window: then the run finishes
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while not when(out) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.0005)
        proc.send_signal(sig)
        proc.wait(timeout=120)
        if proc.returncode != 0:
            break
        for done in (out, _aligned(out)):  # a finished run's output, removed before the next attempt
            shutil.rmtree(done, ignore_errors=True)
    assert proc.returncode != 0, f"{name} finished before the signal landed {ATTEMPTS} times (the kill window was missed)"
    assert not out.exists(), "a killed run left an output"
    assert not _aligned(out).exists(), "a killed merge left its --aligned folder"
    if sig == signal.SIGTERM:  # handled: the temporary folders are removed at once
        assert not list(tmp_path.glob(".out*")), "SIGTERM left a temporary folder"
    assert main(argv_of(big, str(out))) == 0
    assert out.is_dir() and not leftovers(out) and not list(tmp_path.glob(".*")), "the next run left litter"
    if name == "merge":
        assert (_aligned(out) / "2" / "config.json").is_file() and not leftovers(_aligned(out))


def test_stale_temporary_folders_are_cleaned_and_a_hidden_old_output_restored(tmp_path):
    from symmerge.store.io import clean_stale

    out = tmp_path / "o"
    dead = 2**22 + 12345  # above the default pid_max: no such process
    (tmp_path / f".o.tmp-{dead}-abc").mkdir()
    (tmp_path / ".o.tmp-xyz").mkdir()  # an earlier version's name, without a pid
    (tmp_path / f".o.tmp-{os.getpid()}-live").mkdir()  # a write in progress (this process) is left alone
    old = tmp_path / f".o.old-{dead}"
    old.mkdir()
    (old / "config.json").write_text("{}")
    clean_stale(out)  # killed between the two renames: the old output comes back
    assert (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["o", f".o.tmp-{os.getpid()}-live"])
    old.mkdir()
    clean_stale(out)  # the target exists: the old copy is just removed
    assert not old.exists() and (out / "config.json").is_file()


@pytest.mark.parametrize("renamed", [0, 1, 2])
@pytest.mark.parametrize("cleaned", ["out", "dir"])
def test_a_commit_of_two_folders_killed_between_its_renames_is_finished(tmp_path, renamed, cleaned):
    """`merge -o OUT --aligned DIR` commits both as one unit (`atomic.AtomicFolders`). A SIGKILL after
    its journals are written and `renamed` of the two renames are done (the kill window the test above
    cannot hit: microseconds) is finished by the next clean of either folder: both new, no old copy, no
    journal or temporary folder left. Negative control: without the journals (a kill before them),
    nothing is committed and the temporary folders just go."""
    from symmerge.runtime import atomic

    dead = 2**22 + 54321  # no such process
    out, folder = tmp_path / "out", tmp_path / "sub" / "dir"
    tmps = [tmp_path / f".out.tmp-{dead}-a", tmp_path / "sub" / f".dir.tmp-{dead}-b"]
    for target, tmp in zip((out, folder), tmps):
        target.mkdir(parents=True)
        (target / "config.json").write_text("old")
        tmp.mkdir()
        (tmp / "config.json").write_text("new")
    journals = [atomic._journal(out, dead), atomic._journal(folder, dead)]
    record = {"pid": dead, "pairs": [[str(t), str(d)] for t, d in zip(tmps, (out, folder))],
              "journals": [str(j) for j in journals]}
    for j in journals:
        j.write_text(json.dumps(record))
    for tmp, target in list(zip(tmps, (out, folder)))[:renamed]:
        atomic._replace(tmp, target, dead)
    if renamed == 1:  # and the second is half done: its old copy moved aside
        folder.rename(atomic._old(folder, dead))
    atomic.clean_stale(out if cleaned == "out" else folder)
    assert (out / "config.json").read_text() == "new" and (folder / "config.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "sub"]
    assert sorted(p.name for p in folder.parent.iterdir()) == ["dir"]
    # negative control: the same state before the journals were written rolls back
    for tmp in tmps:
        tmp.mkdir()
        (tmp / "config.json").write_text("newer")
    atomic.clean_stale(out)
    atomic.clean_stale(folder)
    assert (out / "config.json").read_text() == "new" and not any(t.exists() for t in tmps)
