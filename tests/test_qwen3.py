"""Qwen3 through the commands: `inspect` states the QK-norm restriction, and a planted copy merges back into
the model it came from (weight matching undoes the planted element, so the average is the source)."""

from __future__ import annotations

import json

import transformers as T

from checks import assert_different_function, assert_same_function
from factories import example_inputs, make_model, save_model
from symmerge.cli import main


def test_inspect_states_the_reduced_qk_group(tmp_path, capsys):
    src = save_model(make_model("qwen3"), tmp_path / "a")
    assert main(["inspect", str(src), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    qk = next(f for f in info["families"] if f["family"] == "qk_map")
    assert "QK-norm" in json.dumps(qk) and "sign" in json.dumps(qk), qk
    assert any("QK-norm" in n and "residual scale" in n for n in info["notes"])
    assert main(["inspect", str(src)]) == 0
    assert "QK-norm" in capsys.readouterr().out


def test_planted_copy_merges_back_into_the_source(tmp_path):
    a = save_model(make_model("qwen3"), tmp_path / "a")
    assert main(["transform", str(a), "-o", str(tmp_path / "b"), "--seed", "3"]) == 0
    x = example_inputs("qwen3")
    hf_a, hf_b = (T.AutoModelForCausalLM.from_pretrained(tmp_path / n).eval() for n in ("a", "b"))
    assert_same_function(hf_b, hf_a, x, what="the planted copy")
    assert main(["merge", str(a), str(tmp_path / "b"), "-o", str(tmp_path / "m"), "--groups", "all"]) == 0
    merged = T.AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert_same_function(merged, hf_a, x, what="merge(A, g.A)")
    # negative control: the same average without alignment (permutations only moves nothing continuous)
    assert main(["merge", str(a), str(tmp_path / "b"), "-o", str(tmp_path / "n"), "--groups", "ffn_perm"]) == 0
    assert_different_function(T.AutoModelForCausalLM.from_pretrained(tmp_path / "n").eval(), hf_a, x,
                              what="merge(A, g.A) aligned by the FFN permutation alone")
