"""The families with reduced groups (Qwen3's QK-norm, OLMo-2's post-norms) through the commands: `inspect` states
each restriction, and a planted copy merges back into the model it came from (weight matching undoes the planted
element, so the average is the source)."""

from __future__ import annotations

import json

import pytest
import transformers as T

from checks import assert_different_function, assert_same_function
from factories import example_inputs, make_model, save_model
from symmerge.cli import main


def _inspect(tmp_path, capsys, arch: str, family: str) -> tuple[dict, str, str]:
    """`inspect --json` of a factory model: (the report, `family`'s entry as text, the plain-text report)."""
    src = save_model(make_model(arch), tmp_path / "a")
    assert main(["inspect", str(src), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert main(["inspect", str(src)]) == 0
    return info, json.dumps(next(f for f in info["families"] if f["family"] == family)), capsys.readouterr().out


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe", "olmoe"])
def test_inspect_states_the_reduced_qk_group(tmp_path, capsys, arch):
    info, qk, text = _inspect(tmp_path, capsys, arch, "qk_map")
    assert "QK-norm" in qk and "sign" in qk and "QK-norm" in text, qk
    assert any("QK-norm" in n and "residual scale" in n for n in info["notes"])


def test_inspect_states_the_post_norm_residual_group(tmp_path, capsys):
    info, rot, text = _inspect(tmp_path, capsys, "olmo2", "residual_rotation")
    assert "signed_permutation" in rot and "post-norm" in rot and "signed_permutation" in text, rot
    assert "residual_scale" not in [f["family"] for f in info["families"]]
    assert any("residual scale" in n and "left out" in n for n in info["notes"])


@pytest.mark.parametrize("arch, exact", [("smollm3", "every invertible map"), ("exaone4", "a sign per dimension")])
def test_inspect_names_the_layers_without_rope(tmp_path, capsys, arch, exact):
    """Layer 1 of each factory applies no RoPE; Llama and OLMo-3 (RoPE on every layer) get no such note."""
    info, _, text = _inspect(tmp_path, capsys, arch, "qk_map")
    assert [n for n in info["notes"] if "no RoPE" in n] == [next(n for n in info["notes"] if n.startswith("layer 1 applies"))]
    assert exact in text
    for other in ("llama", "olmo3"):
        info, _, _ = _inspect(tmp_path / other, capsys, other, "qk_map")
        assert not any("no RoPE" in n for n in info["notes"]), info["notes"]


@pytest.mark.parametrize("arch", ["qwen3", "olmo2"])
def test_planted_copy_merges_back_into_the_source(tmp_path, arch):
    a = save_model(make_model(arch), tmp_path / "a")
    assert main(["transform", str(a), "-o", str(tmp_path / "b"), "--seed", "3"]) == 0
    x = example_inputs(arch)
    hf_a, hf_b = (T.AutoModelForCausalLM.from_pretrained(tmp_path / n).eval() for n in ("a", "b"))
    assert_same_function(hf_b, hf_a, x, what="the planted copy")
    assert main(["merge", str(a), str(tmp_path / "b"), "-o", str(tmp_path / "m"), "--groups", "all"]) == 0
    merged = T.AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert_same_function(merged, hf_a, x, what="merge(A, g.A)")
    # negative control: the same average without alignment (permutations only moves nothing continuous)
    assert main(["merge", str(a), str(tmp_path / "b"), "-o", str(tmp_path / "n"), "--groups", "ffn_perm"]) == 0
    assert_different_function(T.AutoModelForCausalLM.from_pretrained(tmp_path / "n").eval(), hf_a, x,
                              what="merge(A, g.A) aligned by the FFN permutation alone")
