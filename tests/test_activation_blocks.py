"""Activation matching's per-block groups re-solved by weight matching given its rotation (`--blocks weight`):
planted elements still recovered exactly, the rotation kept, and the option reaches the matcher."""

from __future__ import annotations

import pytest
import torch

from factories import make_model, rel_distance, save_model
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.algebra.spec import ROTATION
from symmerge.match.activation import activation_match
from symmerge.match.activation_blocks import blocks_given_rotation
from symmerge.store.model import load_model
from test_activation_matching import batches


@pytest.mark.parametrize("arch", ["gpt2", "llama", "vit"])
def test_planted_recovery_with_blocks_from_weights(arch, tmp_path):
    A = load_model(save_model(make_model(arch, 0), tmp_path / "a"))
    B = load_model(tmp_path / "a")
    B.params = apply(A.spec, random_element(A.spec, torch.Generator().manual_seed(3)), A.params)
    found = activation_match(A, B, batches(arch))  # every family: the planted element has a residual scale
    res = blocks_given_rotation(A, B, None, found)
    assert torch.equal(res.g[ROTATION], found.g[ROTATION])
    assert res.extra["blocks"] == "weight"
    assert rel_distance(apply(A.spec, res.g, B.params), A.params) <= 1e-5
    shuffled = dict(res.g)  # negative control: one FFN unit pair swapped
    shuffled["blocks.0.ffn"] = res.g["blocks.0.ffn"].clone()
    shuffled["blocks.0.ffn"][[0, 1]] = shuffled["blocks.0.ffn"][[1, 0]]
    assert rel_distance(apply(A.spec, shuffled, B.params), A.params) > 1e-3


def test_blocks_from_weights_start_at_the_rotation_found(tmp_path):
    """From a wrong rotation the per-block groups cannot undo it: the result depends on the rotation given
    (negative control that the rotation is held, not re-solved)."""
    A = load_model(save_model(make_model("gpt2", 0), tmp_path / "a"))
    B = load_model(tmp_path / "a")
    B.params = apply(A.spec, random_element(A.spec, torch.Generator().manual_seed(3)), A.params)
    found = activation_match(A, B, batches("gpt2"))
    found.g = {**found.g, ROTATION: torch.eye(found.g[ROTATION].shape[0], dtype=found.g[ROTATION].dtype)}
    res = blocks_given_rotation(A, B, None, found)
    assert torch.equal(res.g[ROTATION], found.g[ROTATION])
    assert rel_distance(apply(A.spec, res.g, B.params), A.params) > 0.1


def test_only_the_rotation_selected_leaves_the_element(tmp_path):
    A = load_model(save_model(make_model("gpt2", 0), tmp_path / "a"))
    found = activation_match(A, A, batches("gpt2"), ["residual_rotation"])
    assert blocks_given_rotation(A, A, ["residual_rotation"], found) is found
