"""The library API (`symmerge.api`): each function is the call its command makes, so its report is the
command's `--json` payload; in memory, align returns models that compute their inputs' functions; typed
options reach the matcher. Tiny GPT-2s from tests/factories.py."""

from __future__ import annotations

import json

import pytest
import torch

from factories import example_inputs, make_model, save_model, stock_logits
from symmerge import SymmergeError, api, cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread

TIMES = ("seconds", "seconds_by_step_kind")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    return [str(save_model(make_model("gpt2", seed=s, dtype=torch.float32), root / f"m{s}")) for s in (0, 1)]


def _without_times(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in TIMES}


def test_align_is_the_commands_library_call(pair, tmp_path):
    """`api.align(..., out)` writes what `symmerge align` writes (the same bytes) and its saved report is the
    command's --json, timings aside; negative control: another `max_iters` reports another objective."""
    a, b = pair
    assert cli.main(["align", a, b, "-o", str(tmp_path / "cli"), "--json", str(tmp_path / "cli.json")]) == 0
    result = api.align(a, b, tmp_path / "lib", options=api.WeightOptions())
    result.save(tmp_path / "lib.json")
    cli_report, lib_report = (json.loads((tmp_path / f).read_text()) for f in ("cli.json", "lib.json"))
    assert _without_times({**cli_report, "out": None}) == _without_times({**lib_report, "out": None})
    files = ("model.safetensors", "config.json")
    assert all((tmp_path / "cli" / f).read_bytes() == (tmp_path / "lib" / f).read_bytes() for f in files)
    short = api.align(a, b, tmp_path / "short", options=api.WeightOptions(max_iters=1))
    assert short["iterations"] == 1 < result["iterations"] and short["objective"] != result["objective"]


def test_align_in_memory_keeps_each_function(pair):
    """Without `out`: `result.models["B"]` is g·B, which computes B's function (to 64 float32 eps of the logits'
    scale: the stock forward runs in the checkpoints' float32) and is closer to A than B is; negative control:
    A's logits are not B's."""
    a, b = api.load(pair[0]), api.load(pair[1])
    result = api.align(a, b)
    moved = result.models["B"]
    x = example_inputs("gpt2")
    before, after, other = (stock_logits(b, m.params, x) for m in (b, moved, a))
    scale = before.abs().max()
    assert (after - before).abs().max() <= 64 * torch.finfo(before.dtype).eps * scale
    assert (other - before).abs().max() > 1e-3 * scale
    assert result["objective"][-1] > result["objective"][0] and result.elements.keys() == {"B"}
    assert result.out is None and result.report["method"] == "weight"


def test_options_refuse_before_any_work(pair, tmp_path):
    """A bad option is refused when the options are made, and a data-driven method without data before
    anything is written; the facade exports the api's functions and classes."""
    with pytest.raises(SymmergeError, match="at least 1"):
        api.WeightOptions(max_iters=0)
    with pytest.raises(SymmergeError, match="needs --data"):
        api.align(*pair, tmp_path / "o", method="learned", options=api.LearnedOptions(steps=1))
    assert not (tmp_path / "o").exists()
    import symmerge

    assert symmerge.align is api.align and symmerge.DualOptions is api.DualOptions


def test_interpolate_and_transform_return_their_records(pair, tmp_path):
    """The record written to the output's symmerge.json is the report."""
    mid = api.interpolate(*pair, 0.25, tmp_path / "mid")
    assert mid.report == json.loads((tmp_path / "mid" / "symmerge.json").read_text())["interpolate"]
    moved = api.transform(pair[1], tmp_path / "t", seed=3, groups=["ffn_perm"])
    assert moved["families"] == ["ffn_perm"] and moved.out == tmp_path / "t"
    assert json.loads((tmp_path / "t" / "symmerge.json").read_text())["transform"]["seed"] == 3
