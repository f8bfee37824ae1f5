"""Atomic output folders: written into temporary siblings, renamed into place only when complete.

One target (`AtomicFolder`): the temporary folder `.<name>.tmp-<pid>-*` is renamed onto the target at
the end (an existing target is first moved aside to `.<name>.old-<pid>` and removed afterwards).

Several targets written as one unit (`AtomicFolders`, e.g. `merge -o OUT --aligned DIR`): every
temporary folder is completed first; then a journal `.<name>.commit-<pid>` beside each target names
every (temporary folder, target) pair, the folders are renamed into place one after the other, and the
journals go. A SIGKILL before the journals exist leaves only temporary folders (the next write into any
of the targets removes them: nothing was committed); one after leaves journals that the next
`clean_stale` of any of the targets reads to finish the renames (every temporary folder it names is
complete), so the unit is never left half replaced once a write is over. Between the journals and the
end of the renames (microseconds, with SIGINT/SIGTERM deferred) only a SIGKILL can stop it.

Ctrl-C, SIGTERM (cli.main turns it into KeyboardInterrupt) or an error removes this process's
temporary folders (`remove_pending`, and each context manager on its way out).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

#: temporary folders of writes in progress in this process (removed by `remove_pending` on the way out)
_PENDING: set[Path] = set()


def _stale(target: Path, kind: str) -> list[Path]:
    """`.<name>.<kind>-<pid>*` siblings of `target` left by processes that no longer run (and the
    pid-less names of earlier versions)."""
    found = []
    for p in target.parent.glob(f".{target.name}.{kind}-*") if target.parent.is_dir() else ():
        pid = p.name[len(f".{target.name}.{kind}-"):].split("-")[0].split(".")[0]  # a journal's ".part" too
        if not (pid.isdigit() and _alive(int(pid))):
            found.append(p)
    return found


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _old(target: Path, pid: int) -> Path:
    return target.with_name(f".{target.name}.old-{pid}")


def _journal(target: Path, pid: int) -> Path:
    return target.with_name(f".{target.name}.commit-{pid}")


def _replace(tmp: Path, target: Path, pid: int) -> None:
    """Rename `tmp` onto `target`, an existing target moved aside first and removed after. Idempotent:
    a rerun after a kill at any point of it finishes it."""
    old = _old(target, pid)
    if tmp.exists():
        if target.exists():
            if old.exists():
                shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
        tmp.rename(target)
    if old.exists() and target.exists():
        shutil.rmtree(old, ignore_errors=True)


def _finish_commits(target: Path) -> None:
    """Complete the renames of a killed `AtomicFolders` commit that `target` took part in."""
    for journal in _stale(target, "commit"):
        try:
            record = json.loads(journal.read_text())
            pid, pairs, journals = int(record["pid"]), record["pairs"], record["journals"]
        except (OSError, ValueError, KeyError, TypeError):  # cut while written: no rename had begun
            journal.unlink(missing_ok=True)
            continue
        for tmp, dst in pairs:
            _replace(Path(tmp), Path(dst), pid)
        for j in journals:
            Path(j).unlink(missing_ok=True)


def clean_stale(target: str | os.PathLike) -> None:
    """Undo what a killed write into `target` left behind: a commit of several targets whose journals
    exist is finished; temporary folders go; an old output that a kill between the two renames of a
    replacement left hidden is put back when `target` is missing (the new output was never completed),
    and removed otherwise."""
    target = Path(target)
    _finish_commits(target)
    for tmp in _stale(target, "tmp"):
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:  # a report's or plot's (`write_file`)
            tmp.unlink(missing_ok=True)
    for old in _stale(target, "old"):
        if not target.exists():
            old.rename(target)
        else:
            shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _signals_deferred():
    """SIGINT/SIGTERM wait until the block is done (main thread only), so that no interruption lands
    between creating a folder and recording it, or between the renames that replace targets."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def remove_pending() -> None:
    """Remove the temporary folders of writes this process started and did not finish."""
    for tmp in list(_PENDING):
        shutil.rmtree(tmp, ignore_errors=True)
        _PENDING.discard(tmp)


def _write_journal(path: Path, record: dict) -> None:
    part = path.with_name(path.name + ".part")  # renamed: a journal is complete or absent
    part.write_text(json.dumps(record))
    os.replace(part, path)


class AtomicFolders:
    """Write several folders as one unit (see the module docstring); yields their temporary folders
    in the order of `targets`."""

    def __init__(self, targets):
        self.targets = [Path(t) for t in targets]
        if len({t.absolute() for t in self.targets}) != len(self.targets):
            raise ValueError(f"targets {self.targets} are not distinct")

    def __enter__(self) -> list[Path]:
        self.tmps: list[Path] = []
        for target in self.targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            clean_stale(target)
            with _signals_deferred():
                tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-{os.getpid()}-", dir=target.parent))
                self.tmps.append(tmp)
                _PENDING.add(tmp)
        return list(self.tmps)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            for tmp in self.tmps:
                shutil.rmtree(tmp, ignore_errors=True)
                _PENDING.discard(tmp)
            return False
        umask = os.umask(0)
        os.umask(umask)
        for tmp in self.tmps:
            tmp.chmod(0o777 & ~umask)  # mkdtemp makes the folder private; outputs get the usual permissions
        pid = os.getpid()
        pairs = [(str(t.absolute()), str(d.absolute())) for t, d in zip(self.tmps, self.targets)]
        journals = [_journal(d.absolute(), pid) for d in self.targets] if len(self.targets) > 1 else []
        with _signals_deferred():
            record = {"pid": pid, "pairs": pairs, "journals": [str(j) for j in journals]}
            for j in journals:
                _write_journal(j, record)
            for tmp, target in zip(self.tmps, self.targets):
                _replace(tmp, target, pid)
            for j in journals:
                j.unlink(missing_ok=True)
            for tmp in self.tmps:
                _PENDING.discard(tmp)
        return False


class AtomicFolder(AtomicFolders):
    """One folder written atomically (see the module docstring); yields its temporary folder."""

    def __init__(self, target):
        super().__init__([target])

    def __enter__(self) -> Path:
        return super().__enter__()[0]


def write_file(path, write) -> None:
    """`write(tmp)` writes a file at `tmp`, a sibling `.<name>.tmp-<pid>-file` of `path`, renamed onto
    `path` when it succeeded (removed when it failed): a report or plot is complete or absent, also on
    a full disk or a kill (the next `clean_stale` of `path` removes what a SIGKILL left)."""
    path = Path(path)
    clean_stale(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-file{path.suffix}")  # the suffix: matplotlib's format
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
