"""Gemma 1, 2 and 3: what only Gemma has, against the stock forward. The post-norms' reduced residual group is checked
in tests/test_post_norm.py, Gemma 3's QK-norm in tests/test_qk_norm.py, every family in tests/test_symmetry.py.

Norm weights are stored as w for a factor 1 + w: read as w, the canonical form would compute another function.
The soft-capping of scores and logits, the score scale `query_pre_attn_scalar^-1/2` and the sqrt(d) embedding scale
are in the stock forward every test compares with; each is shown to matter (changing it changes the logits), so
the group's exactness is checked with them at work.
"""

from __future__ import annotations

import pytest
import torch

from checks import assert_different_function, assert_same_function
from factories import example_inputs, loaded_with_logits, logits, make_model, stock_logits
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.cli import main
from symmerge.evaluation.forward import interpolate
from symmerge.store.model import LazyModel

F32 = torch.float32


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def gemma(tmp_path_factory, request):
    return (*loaded_with_logits(request.param, tmp_path_factory.mktemp(request.param) / "m"), request.param)


def test_the_spec_states_the_post_norm_group(gemma):
    model, _, arch = gemma
    rot = model.spec.groups["residual.rotation"]
    assert rot.constraints == ("signed_permutation",) and "post-norm" in rot.note
    assert "residual.scale" not in model.spec.groups and any("left out" in n for n in model.spec.notes)
    assert model.shape.post_norm and model.shape.pre_norms and model.shape.qk_norm == ("head" if arch == "gemma3" else "")


def test_inspect_states_the_group(gemma, capsys):
    model, _, _ = gemma
    assert main(["inspect", str(model.path)]) == 0
    out = capsys.readouterr().out
    assert "signed_permutation" in out and "post-norm" in out


@pytest.fixture(scope="module")
def gemma1(tmp_path_factory):
    return (*loaded_with_logits("gemma", tmp_path_factory.mktemp("gemma") / "m"), "gemma")


def test_gemma1_has_llamas_group(gemma1):
    """Gemma 1 has no post-norms: the full orthogonal map and a scale on the stream, QK maps per rotary pair."""
    model, _, _ = gemma1
    assert model.spec.groups["residual.rotation"].constraints == () and "residual.scale" in model.spec.groups
    assert not model.shape.post_norm and not model.shape.qk_norm
    assert "rope" in model.spec.groups["blocks.0.qk"].constraints


def test_norm_weights_are_one_plus_w(gemma):
    _read_as_one_plus_w(*gemma)


def test_gemma1_norm_weights_are_one_plus_w(gemma1):
    _read_as_one_plus_w(*gemma1)


def _read_as_one_plus_w(model, ref, arch):
    """Read with the factor w instead of 1 + w, the canonical form computes another function."""
    assert_same_function(stock_logits(model, model.params, example_inputs(arch)), ref, dtype=F32, what="canonical form")
    adapter = type(model.adapter)()
    adapter.norm_offset = 0.0
    params = adapter.to_canonical(LazyModel(model.path).get, model.shape)
    assert_different_function(stock_logits(model, {**model.params, **params}, example_inputs(arch)), ref, dtype=F32,
                              what="norm weights read as w")


@pytest.mark.parametrize("key,value", [("attn_logit_softcapping", 1.0), ("final_logit_softcapping", 1.0),
                                       ("query_pre_attn_scalar", 1000)])
def test_what_the_stock_forward_scales_matters(key, value):
    """The factory's Gemma 2 with another soft-cap or score scale computes another function: the group tests run
    with these at work (and the group keeps the function under each, tests/test_symmetry.py)."""
    source = make_model("gemma2")
    other = make_model("gemma2")
    setattr(other.config, key, value)
    for layer in other.model.layers:
        layer.self_attn.scaling = other.config.query_pre_attn_scalar ** -0.5
        layer.self_attn.attn_logit_softcapping = other.config.attn_logit_softcapping
    x = example_inputs("gemma2")
    assert_different_function(logits(other, x), logits(source, x), dtype=F32, what=f"{key}={value}")


def test_a_planted_copy_keeps_the_function_and_merges_back(gemma, tmp_path):
    model, ref, arch = gemma
    g = random_element(model.spec, torch.Generator().manual_seed(3))
    moved = apply(model.spec, g, model.params)
    assert_same_function(stock_logits(model, moved, example_inputs(arch)), ref, dtype=F32, what="every group")
    # negative control: the plain average of A and g.A (the merge without its alignment)
    assert_different_function(stock_logits(model, interpolate(model.params, moved, 0.5), example_inputs(arch)), ref,
                              dtype=F32, what="plain average")
    out = tmp_path / "b"
    assert main(["transform", str(model.path), "-o", str(out), "--seed", "3"]) == 0
    assert main(["merge", str(model.path), str(out), "-o", str(tmp_path / "m")]) == 0
    from checks import stock

    assert_same_function(logits(stock(tmp_path / "m"), example_inputs(arch)), ref, dtype=F32, what="merge(A, g.A)")
