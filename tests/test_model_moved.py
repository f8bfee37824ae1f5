"""`Model.moved(g)`: the checkpoint under a group element computes what it computed (stock HF forward, dtype
tolerance), leaves the model it came from as it was, and a copy that misses one tensor of the action does not
(the negative control)."""

from __future__ import annotations

import pytest
import torch

from checks import NORM_IN_FP32, assert_different_function, assert_same_function
from factories import example_inputs, loaded_with_logits, stock_logits
from symmerge.algebra.elements import random_element


@pytest.mark.parametrize("arch", ["gpt2", "llama", "vit"])
def test_moved_model_computes_the_same_function(tmp_path, arch):
    model, ref = loaded_with_logits(arch, tmp_path / arch)
    before = {k: v.clone() for k, v in model.params.items()}
    moved = model.moved(random_element(model.spec, torch.Generator().manual_seed(3)))
    inputs = example_inputs(arch)
    dtype = torch.float32 if model.config.model_type in NORM_IN_FP32 else torch.float64
    assert_same_function(stock_logits(model, moved.params, inputs), ref, dtype=dtype, what=f"{arch} moved")
    assert all(torch.equal(model.params[k], before[k]) for k in before), "moved() changed the model it came from"
    changed = [k for k in moved.params if not torch.allclose(moved.params[k], model.params[k])]
    assert changed, "the random element moved no tensor"
    missed = {**moved.params, changed[0]: model.params[changed[0]]}
    assert_different_function(stock_logits(model, missed, inputs), ref, dtype=dtype, what=f"{arch} missing {changed[0]}")
