"""Post-norms (OLMo-2; Gemma 2 and 3, with norms before the sublayers too) and QK-norm over all heads (OLMo-2): the
reduced group, checked against the stock forward.

`x + γ ⊙ rms(y)` commutes with a residual map O only when `O diag(γ) = diag(γ') O'` (O' orthogonal, acting
on y): for generic γ, signed permutations, with γ permuted and not signed (the "abs" action). Each map
just outside the group must change the logits: a rotation, the signs applied to γ, γ left in place, the
residual scale, a head permutation that leaves the QK-norm weights behind, a rotation of a rotary pair.
With equal post-norm weights a rotation is exact (the derivation's other case).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from checks import assert_different_function, assert_same_function
from factories import example_inputs, loaded_with_logits, make_model, save_model, stock_logits
from symmerge.algebra import groups as G
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.store.model import load_model

ROT = "residual.rotation"
F32 = torch.float32  # OLMo-2's RMSNorm computes in float32


@pytest.fixture(scope="module", params=["olmo2", "gemma2", "gemma3"])
def post(tmp_path_factory, request):
    """(canonical model, its stock logits) of a tiny model with post-norms."""
    return loaded_with_logits(request.param, tmp_path_factory.mktemp(request.param) / "m")


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory):
    return loaded_with_logits("olmo2", tmp_path_factory.mktemp("olmo2") / "m")


def _forward(model, params):
    return stock_logits(model, params, example_inputs(model.shape.arch))


def _posts(model) -> list[str]:
    return [k for k in model.params if k.endswith(".g_post")]


def _with_actions(spec, names, acts):
    return dataclasses.replace(spec, actions={**spec.actions, **{k: acts for k in names}})


def test_the_residual_group_is_the_signed_permutations(post):
    model, ref = post
    group = model.spec.groups[ROT]
    assert group.constraints == ("signed_permutation",) and group.discrete and "residual.scale" not in model.spec.groups
    g = G.random_element(group, torch.Generator().manual_seed(0))
    assert bool((g < 0).any()) and float((g.abs().sum(0) - 1).abs().max()) == 0.0
    moved = apply(model.spec, {ROT: g}, model.params)
    assert_same_function(_forward(model, moved), ref, dtype=F32, what="a signed permutation of the stream")
    haar = G.random_element(dataclasses.replace(group, constraints=()), torch.Generator().manual_seed(1))
    assert G.membership_error(group, haar) > 1e-3


@pytest.mark.parametrize("wrong", ["rotation", "signed_weights", "weights_left", "scale"])
def test_maps_just_outside_the_group_change_the_logits(post, wrong):
    model, ref = post
    group, spec, params = model.spec.groups[ROT], model.spec, model.params
    g = {ROT: G.random_element(group, torch.Generator().manual_seed(0))}
    if wrong == "rotation":  # all of O(d), the post-norm weights left alone (what commutes with RMS alone)
        g = {ROT: G.random_element(dataclasses.replace(group, constraints=()), torch.Generator().manual_seed(1))}
        spec = _with_actions(spec, _posts(model), [])
    elif wrong == "signed_weights":  # the weights moved by P S instead of P
        spec = _with_actions(spec, _posts(model), [dataclasses.replace(spec.actions[_posts(model)[0]][0], how="g")])
    elif wrong == "weights_left":
        spec = _with_actions(spec, _posts(model), [])
    else:  # writers by a, eps by a^2, as under a pre-norm: the post-norm outputs stay unscaled
        a, g = 3.0, {}
        writers = [k for k in params if k == "embed.W_E" or k.endswith(("attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out"))]
        params = {**params, **{k: a * params[k] for k in writers}, "norm.eps": a * a * params["norm.eps"]}
    out = _forward(model, apply(spec, g, params))
    assert_different_function(out, ref, dtype=F32, what=f"the residual map with {wrong}")


def test_the_residual_scale_the_spec_leaves_out_is_exact_as_its_note_says(post):
    """The note's scale: embeddings, post-norm weights and biases (the gate's excepted) by a, the gate by 1/a, eps
    by a^2; the weights of q, k, v, up, the output and down projections unchanged."""
    model, ref = post
    a, p = 3.0, dict(model.params)
    if model.shape.pre_norms:  # Gemma: the writers, the post-norm weights and (QK-norm) q and k by a
        scaled = ("attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out", ".g_post")
        scaled += ("attn.W_Q", "attn.b_Q", "attn.W_K", "attn.b_K") if model.shape.qk_norm else ()
        p.update({k: a * t for k, t in model.params.items() if k == "embed.W_E" or k.endswith(scaled)})
    else:  # OLMo-2: the readers see the stream scaled
        for k, t in model.params.items():
            if k == "embed.W_E" or k.endswith(".g_post") or (".b_" in k and not k.endswith("b_gate")):
                p[k] = a * t
        p.update({k: t / a for k, t in model.params.items() if k.endswith("W_gate")})
    p["norm.eps"] = a * a * model.params["norm.eps"]
    assert any("residual scale a is exact only" in n for n in model.spec.notes)
    assert_same_function(_forward(model, p), ref, dtype=F32, what="the post-norm residual scale")


def test_equal_post_norm_weights_admit_every_rotation(post):
    """With every post-norm weight a constant vector, `O diag(c) = diag(c) O` for all O: a rotation is exact,
    so the restriction to signed permutations is the weights' doing."""
    model, _ = post
    params = {**model.params, **{k: torch.full_like(model.params[k], 0.7 + 0.1 * n) for n, k in enumerate(_posts(model))}}
    ref = _forward(model, params)
    group = model.spec.groups[ROT]
    g = {ROT: G.random_element(dataclasses.replace(group, constraints=()), torch.Generator().manual_seed(1))}
    out = _forward(model, apply(_with_actions(model.spec, _posts(model), []), g, params))
    assert_same_function(out, ref, dtype=F32, what="a rotation under equal post-norm weights")


def test_qk_norm_weights_move_with_their_heads(olmo2):
    model, ref = olmo2
    assert model.params["blocks.0.attn.g_Q"].shape == (2, 2, 8) and model.spec.groups["blocks.0.qk"].discrete
    g = {f"blocks.{i}.heads": torch.tensor([1, 0]) for i in range(2)}  # the two KV groups swapped in each layer
    assert_same_function(_forward(model, apply(model.spec, g, model.params)), ref, dtype=F32, what="head permutation")
    left = [f"blocks.{i}.attn.{n}" for i in range(2) for n in ("g_Q", "g_K")]
    out = _forward(model, apply(_with_actions(model.spec, left, []), g, model.params))
    assert_different_function(out, ref, dtype=F32, what="heads permuted, QK-norm weights left in place")


def test_a_rotation_of_a_rotary_pair_changes_the_logits(olmo2):
    model, ref = olmo2
    group = model.spec.groups["blocks.0.qk"]
    shape = (*group.batch, group.rotary_dims // 2)
    angle = torch.full(shape, 1.3, dtype=torch.float64)
    free = torch.eye(group.size - group.rotary_dims, dtype=torch.float64).expand(*group.batch, -1, -1)
    m = group.pairing.blocks(group.size, torch.cos(angle), torch.sin(angle), free)
    assert G.membership_error(group, m) > 1e-3
    out = _forward(model, apply(model.spec, {f"blocks.{i}.qk": m for i in range(2)}, model.params))
    assert_different_function(out, ref, dtype=F32, what="a rotation of the rotary pairs under QK-norm")


def test_learned_residual_permutation_moves_the_post_norm_weights(olmo2, tmp_path):
    """`residual_perm` (permutation matrices, a subgroup of the signed permutations) is learned by straight-through
    estimation; the "abs" action then permutes the post-norm weights through it, and the outputs are stock
    checkpoints computing their inputs' functions."""
    from checks import assert_reported_gap
    from factories import lm_batches
    from symmerge.match.learn_config import LearnConfig
    from symmerge.match.learned import learn
    from symmerge.match.outputs import output_report, save_outputs

    a, _ = olmo2
    b = load_model(save_model(make_model("olmo2", 1), tmp_path / "b"))
    groups = ["residual_perm", "head_perm", "ffn_perm"]
    cfg = LearnConfig(groups=groups, steps=4, lr=0.5, eval_every=2, grid_points=3, progress=False)
    init = random_element(b.spec, torch.Generator().manual_seed(5), groups)  # a permuted start: the weights move
    result = learn(a, b, lm_batches(2, 0), lm_batches(1, 1), cfg, init=init)
    r = result.elements["B"][ROT]
    assert torch.equal(r, r.round()) and sorted(r.argmax(1).tolist()) == list(range(r.shape[0]))
    assert not torch.equal(r, torch.eye(r.shape[0], dtype=r.dtype))
    probe = lm_batches(1, 9)[0]
    for row in output_report(save_outputs(result, a, b, tmp_path / "out"), b.shape.hf_class, probe):
        assert_reported_gap(row, probe)
