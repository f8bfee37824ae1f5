"""Streaming activation matching (`match/activation_stream.py`) gives the in-memory path's answer
(`match/activation.py`: every activation stored, then solved) on every architecture, reads one block of
each model at a time, and recovers a planted element from checkpoints on disk. The CLI runs it
(`align --method activation`; tests/test_activation_matching.py checks the outputs against the stock
`from_pretrained` forward)."""

from __future__ import annotations

import pytest
import torch

from factories import make_model, rel_distance, save_model
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import identity_element, random_element
from symmerge.algebra.spec import SCALE
from symmerge.match.activation import activation_match
from symmerge.match.activation_stream import activation_match_streaming
from symmerge.store.model import LazyModel, load_model
from symmerge.store.stream import write_streaming
from test_activation_matching import batches
from test_weight_matching import SUPPORTED


def _agree(x: dict, y: dict) -> float:
    """The largest difference between two elements, relative to each group's size (permutations: 0 or inf)."""
    worst = 0.0
    for k in x:
        if x[k].dtype == torch.long:
            worst = max(worst, 0.0 if torch.equal(x[k], y[k]) else float("inf"))
        else:
            worst = max(worst, float((x[k] - y[k]).abs().max() / x[k].abs().max().clamp_min(1e-300)))
    return worst


def _pair(tmp_path, arch):
    a, b = save_model(make_model(arch, 0), tmp_path / "a"), save_model(make_model(arch, 1), tmp_path / "b")
    return a, b


@pytest.mark.parametrize("arch", SUPPORTED)
def test_streaming_equals_in_memory(arch, tmp_path):
    """Two independent models: every element, the objective and the fit figures as the in-memory path's."""
    a, b = _pair(tmp_path, arch)
    A, B = load_model(a), load_model(b)
    ref = activation_match(A, B, batches(arch))
    got = activation_match_streaming(LazyModel(a), LazyModel(b), batches(arch))
    assert _agree(ref.g, got.g) <= 1e-9
    assert max(abs(u - v) for u, v in zip(ref.history, got.history)) <= 1e-12
    # it did something: the element is no identity (on two random OLMo-2s it lowers the weight objective)
    assert _agree(ref.g, identity_element(B.spec)) > 1e-3 and ref.history[-1] != ref.history[0]
    assert all(abs(ref.extra["fit"][k] - got.extra["fit"][k]) <= 1e-10 for k in ref.extra["fit"])
    # negative control: other batches give other elements, so the comparison above can fail
    other = activation_match_streaming(LazyModel(a), LazyModel(b), batches(arch, seed=1))
    assert _agree(ref.g, other.g) > 1e-3


def test_streaming_equals_in_memory_with_padding_and_every_family(tmp_path):
    """Masked tokens are left out as in memory; with the residual scale (set from the weights) too."""
    a, b = _pair(tmp_path, "llama")
    data = batches("llama")
    for k, batch in enumerate(data):
        batch["attention_mask"][k % 4, -(3 + k):] = 0
    ref = activation_match(load_model(a), load_model(b), data, None)
    got = activation_match_streaming(LazyModel(a), LazyModel(b), data, None)
    assert SCALE in got.g and float(got.g[SCALE]) != 1.0 and _agree(ref.g, got.g) <= 1e-9
    assert ref.extra["fit"]["tokens"] == got.extra["fit"]["tokens"] == sum(int(x["attention_mask"].sum()) for x in data)
    unmasked = [{**x, "attention_mask": torch.ones_like(x["attention_mask"])} for x in data]
    assert _agree(ref.g, activation_match_streaming(LazyModel(a), LazyModel(b), unmasked, None).g) > 1e-3


class _Counting:
    """A LazyModel whose parts are tracked: how many are alive at once."""

    def __init__(self, lazy):
        self.lazy, self.alive, self.peak = lazy, 0, 0

    def __getattr__(self, name):
        return getattr(self.lazy, name)

    def part(self, key):
        import weakref

        class Part(dict):
            pass

        p = Part(self.lazy.part(key))
        self.alive += 1
        self.peak = max(self.peak, self.alive)
        weakref.finalize(p, self._free)
        return p

    def _free(self):
        self.alive -= 1


@pytest.mark.parametrize("arch", [a for a in ("gpt_neox", "llama", "vit") if a in SUPPORTED])
def test_streaming_recovers_a_planted_element_one_block_at_a_time(arch, tmp_path):
    a = save_model(make_model(arch, 0), tmp_path / "a")
    lazy = LazyModel(a)
    g = random_element(lazy.spec, torch.Generator().manual_seed(2))
    write_streaming(lazy, lambda part: apply(lazy.spec, g, part), tmp_path / "b", progress=False)
    src_a, src_b = _Counting(LazyModel(a)), _Counting(LazyModel(tmp_path / "b"))
    res = activation_match_streaming(src_a, src_b, batches(arch))
    A, B = load_model(a), load_model(tmp_path / "b")
    assert rel_distance(B.params, A.params) > 0.1
    assert rel_distance(apply(A.spec, res.g, B.params), A.params) <= 1e-5
    assert src_a.peak <= 2 and src_b.peak <= 2, (src_a.peak, src_b.peak)
    shuffled = dict(res.g)  # negative control: one FFN unit pair swapped
    shuffled["blocks.0.ffn"] = res.g["blocks.0.ffn"].clone()
    shuffled["blocks.0.ffn"][[0, 1]] = shuffled["blocks.0.ffn"][[1, 0]]
    assert rel_distance(apply(A.spec, shuffled, B.params), A.params) > 1e-3
