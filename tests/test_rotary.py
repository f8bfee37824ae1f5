"""The rotary pairing (symmerge.algebra.rotary), both layouts, checked against the stock RoPE code of transformers.

A QK map M is a symmetry exactly when it commutes with the rotation R_p of every position p: then
(R_p M^T q) . (R_p' M^{-1} k) = q . (R_p^T R_p') k for all positions. The rotations R_p are built here
from transformers' own functions (`rotate_half` for the "half" layout, GPT-J's `apply_rotary_pos_emb`
for "interleaved"), so the test does not trust symmerge's idea of the layout.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_rotary
from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions
from transformers.models.llama.modeling_llama import rotate_half

from symmerge import SymmergeError
from symmerge.algebra import groups as G
from symmerge.algebra.spec import build_spec
from symmerge.match.costs import circuit_similarity
from symmerge.match.parametrize import parametrization
from symmerge.match.solvers import solve_map

LAYOUTS = ("half", "interleaved")
N, R, POSITIONS = 6, 4, 16
EPS = torch.finfo(torch.float64).eps


def _stock_rotations(layout: str, n: int = N, r: int = R, positions: int = POSITIONS) -> torch.Tensor:
    """`[positions, n, n]`: the stock RoPE rotation of one head at every position (pass-through beyond r)."""
    sincos = create_sinusoidal_positions(positions, r).to(torch.float64)  # [pos, r]: sin | cos of pos * freq
    sin, cos = sincos[:, : r // 2], sincos[:, r // 2 :]
    eye = torch.eye(r, dtype=torch.float64)
    if layout == "interleaved":  # GPT-J: tensor [batch, seq, heads, r]; the "heads" are the basis vectors
        out = gptj_rotary(eye.expand(1, positions, r, r), sin[None], cos[None])[0]  # [pos, j, :] = R_p e_j
    else:  # rotate_half (Llama, NeoX): cos and sin repeated over the two halves
        c, s = torch.cat([cos, cos], -1)[:, None, :], torch.cat([sin, sin], -1)[:, None, :]
        out = eye * c + rotate_half(eye.expand(positions, r, r)) * s
    rot = torch.eye(n, dtype=torch.float64).repeat(positions, 1, 1)
    rot[:, :r, :r] = out.transpose(-1, -2)  # columns R_p e_j
    return rot


def _group(layout: str, constraints=("rope",)) -> G.Group:
    return G.Group("m", "qk_map", "invertible", N, batch=(3,), constraints=constraints, rotary_dims=R,
                   rotary_layout=layout)


def _commutator(m: torch.Tensor, rot: torch.Tensor) -> float:
    """max over positions and batch of |M R_p - R_p M|, relative to |M|."""
    m = m.unsqueeze(-3)  # [*batch, 1, n, n] against rot [pos, n, n]
    return float(((m @ rot - rot @ m).abs().amax() / m.abs().amax()))


def test_stock_rotations_differ_between_layouts():
    """Negative control for the tests below: the two layouts really pair different dimensions."""
    assert float((_stock_rotations("half") - _stock_rotations("interleaved")).abs().max()) > 0.1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("constraints", [("rope",), ("rope", "signed_permutation"), ("rope", "qk_norm")])
@pytest.mark.parametrize("seed", range(3))
def test_random_elements_commute_with_every_position(layout, constraints, seed):
    grp = _group(layout, constraints)
    m = G.random_element(grp, torch.Generator().manual_seed(seed))
    assert G.membership_error(grp, m) <= 64 * EPS
    assert _commutator(m, _stock_rotations(layout)) <= 64 * EPS, f"{layout}: the map does not commute with RoPE"
    other = "half" if layout == "interleaved" else "interleaved"
    if constraints == ("rope",):  # a quarter turn or a sign per pair can commute with both layouts' rotations
        assert _commutator(m, _stock_rotations(other)) > 1e-3, "negative control: the other layout's rotation"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_commuting_maps_are_rejected(layout):
    grp = _group(layout)
    free = G.random_element(dataclasses.replace(grp, constraints=()), torch.Generator().manual_seed(1))
    assert _commutator(free, _stock_rotations(layout)) > 1e-3
    assert G.membership_error(grp, free) > 1e-3
    other = G.random_element(_group("half" if layout == "interleaved" else "interleaved"), torch.Generator().manual_seed(2))
    assert _commutator(other, _stock_rotations(layout)) > 1e-3
    assert G.membership_error(grp, other) > 1e-3, "a map for the other pairing must not pass as a member"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("constraints", [("rope",), ("rope", "signed_permutation"), ("rope", "qk_norm")])
def test_solver_recovers_a_planted_map(layout, constraints):
    grp = _group(layout, constraints)
    gen = torch.Generator().manual_seed(0)
    m = G.random_element(grp, gen)
    xb, yb = torch.randn(3, N, 20, generator=gen, dtype=torch.float64), torch.randn(3, N, 20, generator=gen, dtype=torch.float64)
    xa, ya = m @ xb, G.inverse_transpose(grp, m) @ yb
    found = solve_map(grp, xa, xb, ya, yb)
    assert float((found - m).abs().max()) <= 1e-9 and G.membership_error(grp, found) <= 64 * EPS
    other = G.random_element(grp, gen)  # negative control: data planted by another element gives another map
    found = solve_map(grp, other @ xb, xb, G.inverse_transpose(grp, other) @ yb, yb)
    assert float((found - m).abs().max()) > 1e-3


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("method", ["polar", "direct"])  # expm reaches only det > 0 (test_parametrize)
def test_parametrization_round_trip_stays_commuting(layout, method):
    grp = _group(layout)
    m = G.random_element(grp, torch.Generator().manual_seed(4), spread=1.5)
    p = parametrization(grp, method)
    raw, fixed = p.from_element(m)
    assert float((p.element(raw, fixed) - m).abs().max()) <= 1e-9
    moved = p.element({k: v + 0.1 for k, v in raw.items()}, fixed)
    assert float((moved - m).abs().max()) > 1e-3  # negative control: other raw values give another element
    assert _commutator(moved, _stock_rotations(layout)) <= 1e-12, "every raw value must stay in the group"


def test_spec_reads_the_layout_and_refuses_unknown_ones():
    from factories import make_model
    from symmerge.adapters import adapter_for

    config = make_model("llama").config
    shape = adapter_for(config).shape(config)
    assert shape.rotary_layout == "half"
    spec = build_spec(dataclasses.replace(shape, rotary_layout="interleaved"))
    assert spec.groups["blocks.0.qk"].pairing.layout == "interleaved"
    with pytest.raises(SymmergeError, match="rotary layout 'pairs_of_three' is not implemented"):
        build_spec(dataclasses.replace(shape, rotary_layout="pairs_of_three"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_head_similarity_compares_circuits_frequency_by_frequency(layout):
    """Weight matching's head cost under RoPE: unchanged by a RoPE-commuting map of B's head, and lower for a copy
    of the head whose rotary pairs trade frequencies (another function), which the unconstrained circuits
    `X^T Y` cannot tell from the head itself (the negative control)."""
    grp = _group(layout)
    gen = torch.Generator().manual_seed(5)
    xa, ya = (torch.randn(3, 1, N, 20, generator=gen, dtype=torch.float64) for _ in range(2))
    m = G.random_element(grp, gen).unsqueeze(1)  # [heads, 1, n, n]
    mapped = (m @ xa, G.inverse_transpose(grp, m.squeeze(1)).unsqueeze(1) @ ya)
    pairs = grp.pairing
    order = torch.arange(N)
    order[pairs.first] = pairs.first.flip(0)  # pair k takes pair (R/2 - 1 - k)'s frequency
    order[pairs.second] = pairs.second.flip(0)
    swapped = (xa[:, :, order], ya[:, :, order])

    def diag(sim):
        return sim[:, 0, :, 0].diagonal()

    own = diag(circuit_similarity(xa, xa, ya, ya, pairing=pairs))
    assert float((diag(circuit_similarity(xa, mapped[0], ya, mapped[1], pairing=pairs)) - own).abs().max()) \
        <= 1e-9 * float(own.abs().max())
    assert bool((diag(circuit_similarity(xa, swapped[0], ya, swapped[1], pairing=pairs)) < own - 0.05 * own.abs()).all())
    plain = diag(circuit_similarity(xa, xa, ya, ya))
    assert float((diag(circuit_similarity(xa, swapped[0], ya, swapped[1])) - plain).abs().max()) \
        <= 1e-9 * float(plain.abs().max()), "the unconstrained circuits do not see the frequencies"


@pytest.mark.parametrize("arch,rotates_part", [("llama", False), ("qwen3", False), ("starcoder2", False),
                                               ("phi3", True), ("gpt_neox", True)])
def test_the_rotary_dimensions_are_the_stock_classs(tmp_path, arch, rotates_part):
    """A config carrying `partial_rotary_factor` 0.5 is read as its class reads it: Llama, Qwen3 and StarCoder2
    ignore it and rotate the whole head, Phi-3 and GPT-NeoX rotate half. Every family's random element keeps the
    stock forward; the control is the group built for the other reading, which breaks it."""
    import transformers as T

    from checks import assert_different_function, assert_same_function
    from factories import example_inputs, make_config, randomised, stock_logits
    from symmerge.algebra.apply import apply
    from symmerge.algebra.elements import random_element
    from symmerge.store.model import load_model

    config = make_config(arch)
    config.rope_parameters = {**(config.rope_parameters or {}), "partial_rotary_factor": 0.5}
    if arch == "gpt_neox":
        config.rotary_pct = 0.5
    torch.manual_seed(0)
    hf = randomised(T.AutoModelForCausalLM.from_config(config), 0).to(torch.float64).eval()
    hf.save_pretrained(tmp_path / "m")
    model = load_model(tmp_path / "m")
    d_head = model.shape.d_head
    assert model.shape.rotary_dims == (d_head // 2 if rotates_part else d_head)
    x = example_inputs(arch)
    ref = stock_logits(model, model.params, x)
    g = random_element(model.spec, torch.Generator().manual_seed(3))
    assert_same_function(stock_logits(model, apply(model.spec, g, model.params), x), ref, dtype=torch.float32,
                         what=f"{arch}, every family")
    other = dataclasses.replace(model.shape, rotary_dims=d_head if rotates_part else d_head // 2)
    wrong = build_spec(other)
    g = random_element(wrong, torch.Generator().manual_seed(3))
    assert_different_function(stock_logits(model, apply(wrong, g, model.params), x), ref, dtype=torch.float32,
                              what=f"{arch} under the other reading of the factor")


@pytest.mark.parametrize("arch", ["gemma3", "olmo3"])
def test_a_model_whose_layers_all_slide_is_placed_by_its_sliding_frequencies(tmp_path, arch):
    """A class that rotates each layer type with its own parameters holds frequencies only for the types its
    layers use: a Gemma 3 or OLMo-3 whose every layer is a sliding-window layer loads, its rotary pairs placed by
    the sliding layers' frequencies, and every family's random element keeps the stock forward. Control: the
    full-attention layers' frequencies of the same config differ (Gemma 3's other base), so the test tells which
    type was read."""
    import transformers as T

    from checks import assert_same_function
    from factories import example_inputs, make_config, randomised, stock_logits
    from symmerge.adapters.base import rotary_module
    from symmerge.algebra.apply import apply
    from symmerge.algebra.elements import random_element
    from symmerge.store.model import load_model

    config = make_config(arch)
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    torch.manual_seed(0)
    hf = randomised(T.AutoModelForCausalLM.from_config(config), 0).to(torch.float64).eval()
    hf.save_pretrained(tmp_path / "m")
    model = load_model(tmp_path / "m")
    inv_freq, _ = model.adapter.rotary_frequencies(model.config, model.shape)
    emb = rotary_module(model.config, model.shape.hf_class)
    sliding = getattr(emb, "sliding_attention_inv_freq", getattr(emb, "inv_freq", None))
    assert torch.equal(inv_freq, sliding)
    if arch == "gemma3":
        full = make_config(arch)  # the same config with its full-attention layer
        assert not torch.allclose(inv_freq, rotary_module(full, model.shape.hf_class).full_attention_inv_freq)
    x = example_inputs(arch)
    g = random_element(model.spec, torch.Generator().manual_seed(3))
    assert_same_function(stock_logits(model, apply(model.spec, g, model.params), x),
                         stock_logits(model, model.params, x), dtype=torch.float32, what=f"{arch}, every layer sliding")
