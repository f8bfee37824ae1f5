"""Weight matching gives the same bytes at any thread count (`threads.one_thread`), and reports its near-ties.

The pair: random-initialised GPT-2s of width 192 (6 heads, 2 layers), whose costs are large enough for
torch and MKL to split their reductions among threads: without the pinning, `align --method weight` and
`merge --method weight` wrote other alignments at 1 and 2 threads (other similarities, other bytes).
Each run is a fresh process with OMP_NUM_THREADS set, as a user's would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import transformers

from symmerge.cli import main


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


def _run(threads: int, *commands: list[str]) -> None:
    """`symmerge` commands, one after another, in one fresh process with `threads` threads."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "TQDM_DISABLE": "1"}
    script = f"import sys\nfrom symmerge.cli import main\nfor argv in {list(commands)!r}:\n    assert main(argv) == 0"
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_weight_matching_writes_the_same_bytes_at_1_and_2_threads(tmp_path):
    """`align` and `merge` by weight matching, each process at its own thread count: the same bytes."""
    a, b, c = (_gpt2(tmp_path / f"m{s}", s) for s in range(3))
    outs = {}
    for threads in (1, 2):
        root = tmp_path / f"t{threads}"
        root.mkdir()
        _run(threads, ["align", str(a), str(b), "-o", str(root / "align"), "--method", "weight", "--max-iters", "6",
                       "--json", str(root / "align.json")],
             ["merge", str(a), str(b), str(c), "-o", str(root / "merge"), "--method", "weight", "--max-rounds", "2",
              "--max-iters", "3"])
        outs[threads] = {name: (root / name / "model.safetensors").read_bytes() for name in ("align", "merge")}
        outs[threads]["objective"] = json.loads((root / "align.json").read_text())["objective"]
    assert outs[1] == outs[2]
    assert outs[1]["objective"][-1] > outs[1]["objective"][0] + 0.3  # it aligned something
    # negative control: the bytes compared are the alignment's (fewer sweeps write other bytes)
    assert main(["align", str(a), str(b), "-o", str(tmp_path / "short"), "--method", "weight", "--max-iters", "2"]) == 0
    assert (tmp_path / "short" / "model.safetensors").read_bytes() != outs[2]["align"]


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
