"""The same command on the same inputs, at the same thread count, writes the same bytes: train, align
(weight, activation, learned, dual, and weight on a tie-prone pair), merge and interpolate, each run twice
(`benchmarks/determinism.py`'s steps, here in-process on tiny models). JSON is compared without its timing
fields; everything else byte for byte. Across thread counts weight matching's outputs are identical too
(`test_thread_count.py`); the others are measured by the benchmark (see the README).
"""

from __future__ import annotations

import sys
from pathlib import Path

from bad_inputs import TEXT
from symmerge.cli import main

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from determinism import compare, run_series  # noqa: E402


def _run(argv):
    assert main(argv) == 0


def test_every_command_twice_gives_identical_bytes(tmp_path):
    data = tmp_path / "text.txt"
    data.write_text(TEXT * 6)
    first = run_series(tmp_path / "0", None, _run, str(data), 4, 2)
    again = run_series(tmp_path / "1", tmp_path / "0", _run, str(data), 4, 2)
    assert set(first) == {"train-a", "train-b", "align-weight", "align-activation", "align-learned", "align-dual", "merge",
                          "interpolate", "tie-transform", "align-tie"}
    assert all(any(f.endswith(".safetensors") for f in files) for files in first.values()), first
    assert compare(first, again) == {s: [] for s in first}
    # negative control: the fingerprint sees a difference of weights (another seed) and of reports
    assert first["train-a"]["model.safetensors"] != first["train-b"]["model.safetensors"]
    assert first["align-weight"]["report.json"] != first["align-activation"]["report.json"]
