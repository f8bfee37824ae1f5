"""Activation matching on mixtures of experts (`match/activation_experts.py`): a planted element of the whole
group (experts with their router rows, units and GLU scales inside each expert, the residual rotation, the
heads) is recovered exactly, in memory and streamed; the element does not depend on how many experts are
held at once. tests/test_activation_matching.py aligns planted copies through the CLI and checks the stock
forward; tests/test_activation_stream.py compares the two paths on independent models."""

from __future__ import annotations

import pytest

from factories import EXPERTS, make_model, rel_distance, save_model
from symmerge import cli
from symmerge.algebra.apply import apply
from symmerge.match import activation_experts
from symmerge.match.activation import activation_match
from symmerge.match.activation_stream import activation_match_streaming
from symmerge.store.model import LazyModel, load_model
from test_activation_matching import batches


def _agree(x: dict, y: dict) -> float:
    from test_activation_stream import _agree as agree

    return agree(x, y)


@pytest.fixture(scope="module", params=sorted(EXPERTS))
def planted(request, tmp_path_factory):
    arch, d = request.param, tmp_path_factory.mktemp(request.param)
    a = save_model(make_model(arch, 0), d / "a")
    assert cli.main(["transform", str(a), "-o", str(d / "b"), "--seed", "3"]) == 0
    A, B = load_model(a), load_model(d / "b")
    routers = [(A.params[f"blocks.{i}.moe.W_router"], B.params[f"blocks.{i}.moe.W_router"]) for i in range(2)]
    assert any((ra @ rb.T).abs().argmax(1).tolist() != [0, 1, 2, 3] for ra, rb in routers)  # experts relabelled
    return arch, a, d / "b"


def test_planted_experts_recovered(planted):
    arch, a, b = planted
    A, B = load_model(a), load_model(b)
    assert rel_distance(B.params, A.params) > 0.1
    res = activation_match(A, B, batches(arch))
    assert rel_distance(apply(A.spec, res.g, B.params), A.params) <= 1e-5
    assert all(v > 1 - 1e-9 for k, v in res.extra["fit"].items() if k.endswith("matched_correlation"))
    # negative controls: two experts swapped (with their units and scales), then two units of one expert
    swapped = dict(res.g)
    swapped["blocks.1.experts"] = res.g["blocks.1.experts"][[1, 0, 2, 3]]
    assert rel_distance(apply(A.spec, swapped, B.params), A.params) > 1e-2
    units = dict(res.g)
    units["blocks.0.ffn"] = res.g["blocks.0.ffn"].clone()
    units["blocks.0.ffn"][2, [0, 1]] = res.g["blocks.0.ffn"][2, [1, 0]]
    assert rel_distance(apply(A.spec, units, B.params), A.params) > 1e-3
    if "blocks.0.shared" in res.g:  # ... and two units of a shared expert (Qwen2-MoE)
        shared = dict(res.g)
        shared["blocks.0.shared"] = res.g["blocks.0.shared"].clone()
        shared["blocks.0.shared"][[0, 1]] = res.g["blocks.0.shared"][[1, 0]]
        assert rel_distance(apply(A.spec, shared, B.params), A.params) > 1e-3
    streamed = activation_match_streaming(LazyModel(a), LazyModel(b), batches(arch))
    assert _agree(res.g, streamed.g) <= 1e-9


def test_experts_held_one_at_a_time_give_the_same_element(planted, monkeypatch, tmp_path):
    """Blocks of one expert (co-moments of one pair at a time) against every expert at once, on two
    independent models (no exact answer to fall back on)."""
    arch, a, _ = planted
    b = save_model(make_model(arch, 1), tmp_path / "b")
    whole = activation_match_streaming(LazyModel(a), LazyModel(b), batches(arch))
    sizes = []
    real = activation_experts.expert_hidden

    def hidden(*args):
        sizes.append(real(*args).shape[1])
        return real(*args)

    monkeypatch.setattr(activation_experts, "expert_hidden", hidden)
    monkeypatch.setattr(activation_experts, "MOMENT_ENTRIES", 24 * 24)  # one expert of width 24 per block
    one = activation_match_streaming(LazyModel(a), LazyModel(b), batches(arch))
    assert sizes and all(s == 24 for s in sizes)
    assert _agree(whole.g, one.g) <= 1e-9
    other = activation_match_streaming(LazyModel(a), LazyModel(b), batches(arch, seed=1))  # negative control
    assert _agree(whole.g, other.g) > 1e-3
