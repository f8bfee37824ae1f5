"""Progress bars (`symmerge.runtime.progress`): `TQDM_DISABLE` is honoured, and a stream that is not a terminal
(a log file, a pipe) gets no bar unless `TQDM_DISABLE` is set false. Checked on a real command
(`transform`, whose bar is "writing") with stderr replaced by a stream that says it is or is not a tty."""

from __future__ import annotations

import io
import sys

import pytest

from factories import make_model, save_model
from symmerge.cli import main


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_model(make_model("gpt2", 0), tmp_path_factory.mktemp("progress") / "m")


@pytest.mark.parametrize("tty,env,bar", [
    (True, None, True),  # a terminal: the bar
    (True, "1", False), (True, "true", False),  # TQDM_DISABLE set: none
    (False, None, False),  # a log file or pipe: none
    (False, "0", True), (False, "false", True),  # TQDM_DISABLE set false: bars into the file too
])
def test_bars_follow_tqdm_disable_and_the_terminal(model, tmp_path, monkeypatch, capsys, tty, env, bar):
    if env is None:
        monkeypatch.delenv("TQDM_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TQDM_DISABLE", env)
    err = _Stream(tty)
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["transform", str(model), "-o", str(tmp_path / "out"), "--seed", "1"]) == 0
    assert ("writing" in err.getvalue()) == bar, err.getvalue()
    assert capsys.readouterr().out.startswith("wrote "), "the end-of-run line is printed either way"
