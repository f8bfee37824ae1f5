"""QK-norm (Qwen3, Qwen3-MoE; OLMoE's over the whole projection): what is left of the QK map, against the stock forward.

`q = rope(γ_q ⊙ rms(z_q))`: a QK map M must keep the RMS (orthogonal) and `diag(γ) M diag(γ)^{-1}` must
commute with RoPE. For generic γ only a sign per rotary pair survives (`kinds.PairSigns`); every map
just outside that group (a rotation of a pair, a quarter turn, a sign on half a pair, Llama's scaled
rotations) must change the logits, and a rotation of a pair must be exact once γ_q and γ_k are equal
on the pair (the derivation's other case). The residual scale must scale q and k with the eps. A norm over the
whole projection has a weight per entry, which must move with its head.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from checks import assert_different_function, assert_same_function
from factories import example_inputs, loaded_with_logits, logits, save_model, stock_logits
from symmerge.algebra import groups as G
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.store.model import load_model

QK = "blocks.0.qk"


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe", "olmoe", "gemma3"])
def qwen3(tmp_path_factory, request):
    """(canonical model, its stock logits) of a tiny model with QK-norm: per head (Qwen3, Qwen3-MoE), over the
    whole projection (OLMoE)."""
    return loaded_with_logits(request.param, tmp_path_factory.mktemp(request.param) / "m")


def _forward(model, params):
    return stock_logits(model, params, example_inputs(model.shape.arch))


def _pair_map(group, a, b) -> torch.Tensor:
    """`[[a, -b], [b, a]]` on every rotary pair of every KV group (a, b: numbers or `[n_kv, pairs]`)."""
    shape = (*group.batch, group.rotary_dims // 2)
    a, b = torch.as_tensor(a, dtype=torch.float64).expand(shape), torch.as_tensor(b, dtype=torch.float64).expand(shape)
    free = torch.eye(group.size - group.rotary_dims, dtype=torch.float64).expand(*group.batch, -1, -1)
    return group.pairing.blocks(group.size, a, b, free)


def test_the_qk_map_is_a_sign_per_rotary_pair(qwen3):
    model, _ = qwen3
    group = model.spec.groups[QK]
    assert group.constraints == ("rope", "qk_norm") and group.discrete and group.rotary_dims == model.shape.d_head
    assert "QK-norm" in group.note and "sign" in group.note
    g = G.random_element(group, torch.Generator().manual_seed(0))
    d = torch.diagonal(g, dim1=-2, dim2=-1)
    assert torch.equal(g, torch.diag_embed(d)) and bool((d.abs() == 1).all()) and bool((d == -1).any())
    assert torch.equal(d[..., group.pairing.first], d[..., group.pairing.second])
    assert G.membership_error(group, _pair_map(group, 0.0, 1.0)) > 0.5, "a quarter turn is not a member"


def _outside(group, which: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    angle = 0.3 + torch.rand(*group.batch, group.rotary_dims // 2, generator=gen, dtype=torch.float64)
    if which == "rotation":  # orthogonal and commutes with RoPE, but not with diag(γ)
        return _pair_map(group, torch.cos(angle), torch.sin(angle))
    if which == "quarter_turn":
        return _pair_map(group, 0.0, 1.0)
    if which == "scaled_rotation":  # Llama's QK group: commutes with RoPE, does not keep the RMS
        return _pair_map(group, 1.5 * torch.cos(angle), 1.5 * torch.sin(angle))
    g = torch.eye(group.size, dtype=torch.float64).repeat(*group.batch, 1, 1)  # "half_pair": does not commute with RoPE
    g[..., 0, 0] = -1.0
    return g


@pytest.mark.parametrize("which", ["rotation", "quarter_turn", "scaled_rotation", "half_pair"])
def test_maps_just_outside_the_group_change_the_logits(qwen3, which):
    model, ref = qwen3
    g = _outside(model.spec.groups[QK], which)
    assert G.membership_error(model.spec.groups[QK], g) > 1e-3
    assert_different_function(_forward(model, apply(model.spec, {QK: g}, model.params)), ref, dtype=torch.float32,
                              what=f"a {which} of the QK map")


def test_equal_norm_weights_on_a_pair_admit_its_rotations(qwen3):
    """The derivation's other case: with γ_q and γ_k equal on each pair, the rotation that breaks the model
    above is exact (so the signs are a restriction of the weights' doing, not of RoPE or the RMS)."""
    model, _ = qwen3
    group = model.spec.groups[QK]
    first, second = group.pairing.first, group.pairing.second
    params = dict(model.params)
    for i in range(model.shape.n_layers):
        for n in ("g_Q", "g_K"):
            gamma = params[f"blocks.{i}.attn.{n}"].clone()
            gamma[..., second] = gamma[..., first]
            params[f"blocks.{i}.attn.{n}"] = gamma
    ref = _forward(model, params)
    moved = apply(model.spec, {QK: _outside(group, "rotation")}, params)
    assert_same_function(_forward(model, moved), ref, dtype=torch.float32, what="a rotation of equal-weight pairs")


def test_the_residual_scale_must_scale_q_and_k(qwen3):
    model, ref = qwen3
    if not model.shape.residual_scale:
        pytest.skip("post-norms: no residual scale in the group (tests/test_post_norm.py checks the exact one)")
    g = {"residual.scale": torch.tensor(0.2, dtype=torch.float64)}
    assert_same_function(_forward(model, apply(model.spec, g, model.params)), ref, dtype=torch.float32,
                         what="the residual scale")
    unscaled = {k: [a for a in v if not (a.group == "residual.scale" and ".attn." in k)] for k, v in model.spec.actions.items()}
    assert unscaled != model.spec.actions
    bad = dataclasses.replace(model.spec, actions=unscaled)
    assert_different_function(_forward(model, apply(bad, g, model.params)), ref, dtype=torch.float32,
                              what="the residual scale without q and k")


def test_norm_weights_move_with_their_heads_where_each_head_has_its_own(qwen3):
    """Per head, one weight vector shared by the heads: the head permutation leaves it (no action). Over the whole
    projection, a weight per entry: it moves with its head, and left in place it changes the logits."""
    model, ref = qwen3
    g = {f"blocks.{i}.heads": torch.tensor([1, 0]) for i in range(model.shape.n_layers)}  # the two KV groups swapped
    assert_same_function(_forward(model, apply(model.spec, g, model.params)), ref, dtype=torch.float32, what="heads")
    norms = [f"blocks.{i}.attn.{n}" for i in range(model.shape.n_layers) for n in ("g_Q", "g_K")]
    if model.shape.qk_norm == "head":
        assert all(model.spec.actions[k] == [] for k in norms)
        return
    left = dataclasses.replace(model.spec, actions={**model.spec.actions, **{k: [] for k in norms}})
    assert_different_function(_forward(model, apply(left, g, model.params)), ref, dtype=torch.float32,
                              what="heads permuted, QK-norm weights left in place")


def test_untied_qwen3_with_attention_biases(tmp_path):
    """Untied embeddings and q/k/v/o biases (`attention_bias`): the canonical form and a random element of
    every group keep the stock forward; the signs and the scale move the q and k biases too."""
    import transformers as T

    torch.manual_seed(0)
    config = T.Qwen3Config(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3, head_dim=8,
                           intermediate_size=40, vocab_size=61, max_position_embeddings=32, rms_norm_eps=1e-2,
                           tie_word_embeddings=False, attention_bias=True, bos_token_id=0, eos_token_id=0,
                           architectures=["Qwen3ForCausalLM"])
    source = T.Qwen3ForCausalLM(config).to(torch.float64).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in source.named_parameters():
            p.copy_(1 + 0.5 * torch.randn(p.shape, generator=gen) if "norm" in name else
                    0.1 * torch.randn(p.shape, generator=gen) if name.endswith("bias") else 3 * p)
    model = load_model(save_model(source, tmp_path / "m"))
    ref = logits(source, example_inputs("qwen3"))
    assert_same_function(_forward(model, model.params), ref, dtype=torch.float32, what="canonical form")
    g = random_element(model.spec, torch.Generator().manual_seed(2), spread=1.5)
    moved = apply(model.spec, g, model.params)
    assert float((moved["blocks.0.attn.b_Q"] - model.params["blocks.0.attn.b_Q"]).abs().max()) > 1e-3
    assert_same_function(_forward(model, moved), ref, dtype=torch.float32, what="every group")
    assert not math.isclose(float(g["residual.scale"]), 1.0)


def test_clip_qkv_after_qk_norm_restricts_the_ov_maps(tmp_path):
    """OLMoE clamps q, k, v after the QK-norm (`clip_qkv`): the QK maps stay the norm's signs (which commute with
    the clamp), the OV maps shrink to signed permutations; every element keeps the stock forward, a general OV map
    does not."""
    import json

    from factories import make_model

    folder = save_model(make_model("olmoe"), tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "clip_qkv": 0.3}))
    model = load_model(folder)
    ov, qk = model.spec.groups["blocks.0.ov"], model.spec.groups["blocks.0.qk"]
    assert ov.constraints == ("signed_permutation",) and qk.constraints == ("rope", "qk_norm")
    ref = _forward(model, model.params)
    g = random_element(model.spec, torch.Generator().manual_seed(4))
    assert_same_function(_forward(model, apply(model.spec, g, model.params)), ref, dtype=torch.float32, what="every group")
    free = {"blocks.0.ov": G.random_element(dataclasses.replace(ov, constraints=()), torch.Generator().manual_seed(8),
                                            spread=1.5)}
    assert_different_function(_forward(model, apply(model.spec, free, model.params)), ref, dtype=torch.float32,
                              what="a general OV map under clip_qkv")
