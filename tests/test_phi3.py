"""Phi-3: the fused projections as stock checkpoints store them, and longrope, whose frequencies switch with the
sequence length, against the stock forward on both sides of the switch.

The property tests of every family (tests/test_symmetry.py) cover Phi-3's group (partial rotary, GQA, a sliding
window) element by element; here are the parts only Phi-3 has.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors import safe_open

from checks import assert_different_function, assert_same_function, with_tensor_of
from factories import example_inputs, make_config, make_model, save_model, stock_logits
from symmerge import SymmergeError
from symmerge.algebra import groups as G
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.cli import main
from symmerge.store.expansion import plan
from symmerge.store.model import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

#: longrope on the factory's Phi-3: the long factors take over past 8 positions (the test sequences have 12)
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "short_factor": [1.0, 1.5], "long_factor": [2.0, 3.0], "original_max_position_embeddings": 8}


def _names(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_fused_projections_are_read_and_written(tmp_path):
    """Stock checkpoints hold `qkv_proj` and `gate_up_proj`; `transform` writes exactly the stock tensors, which
    stock loads into the same function, each fused matrix moved."""
    a = save_model(make_model("phi3"), tmp_path / "a")
    assert "model.layers.1.self_attn.qkv_proj.weight" in _names(a) and "model.layers.1.mlp.gate_up_proj.weight" in _names(a)
    assert main(["transform", str(a), "-o", str(tmp_path / "b"), "--seed", "2"]) == 0
    assert _names(tmp_path / "b") == _names(a)
    from checks import stock

    hf_a, hf_b = stock(a), stock(tmp_path / "b")
    assert_same_function(hf_b, hf_a, example_inputs("phi3"), what="transformed Phi-3")
    # negative control: the written checkpoint with layer 0's fused qkv_proj as A has it
    assert_different_function(with_tensor_of(hf_b, hf_a), hf_a, example_inputs("phi3"), what="qkv_proj as A's")
    for k in ("model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"):
        assert float((hf_b.state_dict()[k] - hf_a.state_dict()[k]).norm()) > 0.5 * float(hf_a.state_dict()[k].norm())


@pytest.fixture(scope="module")
def longrope(tmp_path_factory):
    """The factory's Phi-3 weights under a longrope config, in canonical form."""
    folder = save_model(make_model("phi3"), tmp_path_factory.mktemp("longrope") / "m")
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"], config["original_max_position_embeddings"] = LONGROPE, 8
    (folder / "config.json").write_text(json.dumps(config))
    return load_model(folder)


def _inputs(length: int) -> dict:
    return {"input_ids": example_inputs("phi3")["input_ids"][:, :length]}


@pytest.mark.parametrize("length", [6, 12])
def test_longrope_keeps_the_group_at_both_lengths(longrope, length):
    """6 tokens: the short factors; 12: the long ones. Every group element is exact at both, and a QK map outside
    the group (not commuting with the rotation of its pairs) is not."""
    model, x = longrope, _inputs(length)
    ref = stock_logits(model, model.params, x)
    g = random_element(model.spec, torch.Generator().manual_seed(3))
    assert_same_function(stock_logits(model, apply(model.spec, g, model.params), x), ref, dtype=torch.float32,
                         what=f"longrope, {length} tokens")
    group = model.spec.groups["blocks.0.qk"]
    free = {"blocks.0.qk": G.random_element(dataclasses.replace(group, constraints=()), torch.Generator().manual_seed(6))}
    assert_different_function(stock_logits(model, apply(model.spec, free, model.params), x), ref, dtype=torch.float32,
                              what="a QK map that does not commute with RoPE")


def test_longrope_switches_at_its_length(longrope):
    """The long factors are what 12 tokens run on: replacing them changes the logits at 12 tokens, not at 6."""
    model = longrope
    other = dataclasses.replace(model, config=model.config.__class__.from_dict(
        {**model.config.to_dict(), "rope_parameters": {**LONGROPE, "long_factor": LONGROPE["short_factor"]}}))
    for length, differs in ((6, False), (12, True)):
        x = _inputs(length)
        a, b = stock_logits(model, model.params, x), stock_logits(other, model.params, x)
        check = assert_different_function if differs else assert_same_function
        check(b, a, dtype=torch.float32, what=f"other long factors, {length} tokens")


def test_expand_refuses_longrope_in_one_line(longrope):
    wide = make_config("phi3")
    wide.hidden_size, wide.num_attention_heads, wide.num_key_value_heads = 64, 8, 4
    wide.rope_parameters, wide.original_max_position_embeddings = dict(LONGROPE), 8
    with pytest.raises(SymmergeError, match="sequence length") as e:
        plan(longrope.adapter, longrope.config, wide)
    assert "\n" not in str(e.value)
