"""Weight matching gives the same bytes at any thread count (`threads.one_thread`), and reports its near-ties.

The pair: random-initialised GPT-2s of width 192 (6 heads, 2 layers), whose costs are large enough for
torch and MKL to split their reductions among threads: without the pinning, `align --method weight` and
`merge --method weight` write other alignments at 1 and 2 threads (other similarities, other bytes), which
the test shows as its control. The thread count is torch's intra-op count (`torch.set_num_threads`, what
OMP_NUM_THREADS sets at start-up), changed between commands run in this process.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
import transformers

from symmerge.cli import main
from symmerge.match import many, outputs, weight


def _gpt2(path: Path, seed: int, width: int = 192, duplicate_unit: bool = False) -> Path:
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=width, n_layer=2, n_head=6, vocab_size=65,
                                                                 n_positions=64, bos_token_id=0, eos_token_id=0))
    if duplicate_unit:  # FFN unit 1 a copy of unit 0 in every layer: two units no cost can tell apart
        with torch.no_grad():
            for block in model.transformer.h:
                block.mlp.c_fc.weight[:, 1] = block.mlp.c_fc.weight[:, 0]
                block.mlp.c_fc.bias[1] = block.mlp.c_fc.bias[0]
                block.mlp.c_proj.weight[1] = block.mlp.c_proj.weight[0]
    model.save_pretrained(path)
    return path


def _bytes(threads: int, root: Path, *commands: list[str]) -> dict:
    """`symmerge` commands run at `threads` torch threads (restored after); each writes `root`/NAME, whose model
    bytes come back by NAME."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for argv in commands:
            assert main([*argv[:-1], "-o", str(root / argv[-1])]) == 0
    finally:
        torch.set_num_threads(old)
    return {argv[-1]: (root / argv[-1] / "model.safetensors").read_bytes() for argv in commands}


def test_weight_matching_writes_the_same_bytes_at_1_and_2_threads(tmp_path, monkeypatch):
    """`align` and `merge` by weight matching, each at 1 and at 2 threads: the same bytes. Control: with the
    pinning undone, the two thread counts write other alignments."""
    a, b, c = (str(_gpt2(tmp_path / f"m{s}", s)) for s in range(3))
    align = ["align", a, b, "--method", "weight", "--max-iters", "6", "--json", str(tmp_path / "align.json"), "align"]
    merge = ["merge", a, b, c, "--method", "weight", "--max-rounds", "2", "--max-iters", "3", "merge"]
    outs = {t: _bytes(t, tmp_path / f"t{t}", align, merge) for t in (1, 2)}
    assert outs[1] == outs[2]
    objective = json.loads((tmp_path / "align.json").read_text())["objective"]
    assert objective[-1] > objective[0] + 0.3  # it aligned something

    @contextlib.contextmanager
    def unpinned():
        yield torch.get_num_threads()

    for module in (weight, outputs, many):
        monkeypatch.setattr(module, "one_thread", unpinned)
    loose = {t: _bytes(t, tmp_path / f"loose{t}", align[:-3] + ["align"]) for t in (1, 2)}
    if loose[1] == loose[2]:
        pytest.skip("this machine's kernels give the same bits at 1 and 2 threads: the control cannot show here that "
                    "the pinning is what makes them equal")


def test_near_ties_are_reported_with_their_margin(tmp_path):
    """A model whose FFN has two identical units, aligned to itself: every FFN assignment is an exact tie
    (margin 0), and the report says so; a model without duplicates shows no tie at that margin."""
    plain, dup = _gpt2(tmp_path / "plain", 0), _gpt2(tmp_path / "dup", 0, duplicate_unit=True)
    reports = {}
    for name, path in (("plain", plain), ("dup", dup)):
        assert main(["align", str(path), str(path), "-o", str(tmp_path / f"o-{name}"), "--method", "weight",
                     "--max-iters", "2", "--json", str(tmp_path / f"{name}.json")]) == 0
        reports[name] = json.loads((tmp_path / f"{name}.json").read_text())["near_ties"]
    dup_assign, plain_assign = reports["dup"]["by_choice"]["assignment"], reports["plain"]["by_choice"]["assignment"]
    assert dup_assign["near_ties"] >= 2 and dup_assign["smallest_margin"] == 0.0, reports["dup"]
    assert reports["dup"]["near_ties"] >= dup_assign["near_ties"]
    assert plain_assign["near_ties"] == 0 and plain_assign["smallest_margin"] > 1e-6, reports["plain"]
