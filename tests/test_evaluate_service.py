"""The evaluation service (`symmerge.evaluation.forward`): one interpolation formula, one λ grid, one input cast,
and canonical parameters through the stock forward at the HF model's eps."""

from __future__ import annotations

import pytest
import torch

from factories import lm_batches
from symmerge import SymmergeError
from symmerge.algebra.apply import apply
from symmerge.evaluation.forward import StockForward, evaluate, grid, interpolate, model_inputs
from symmerge.store.model import hf_class, load_model


def test_interpolate_is_the_written_sum_at_every_lambda():
    """(1 - λ)·a + λ·b as written (the learning loop's figures depend on it to the last bit), endpoints
    included; a 0-dim tensor λ gets its gradient. Negative control: `torch.lerp` rounds differently."""
    gen = torch.Generator().manual_seed(0)
    a, b = ({"x": torch.randn(1000, generator=gen)} for _ in range(2))
    for lam in (0.0, 0.3, 0.5, 0.7, 1.0):
        assert torch.equal(interpolate(a, b, lam)["x"], (1 - lam) * a["x"] + lam * b["x"]), lam
    assert torch.equal(interpolate(a, b, 0.0)["x"], a["x"]) and torch.equal(interpolate(a, b, 1.0)["x"], b["x"])
    assert not all(torch.equal(torch.lerp(a["x"], b["x"], lam), interpolate(a, b, lam)["x"]) for lam in (0.3, 0.7))
    lam = torch.tensor(0.4, requires_grad=True)
    interpolate(a, b, lam)["x"].sum().backward()
    assert float(lam.grad) == pytest.approx(float((b["x"] - a["x"]).sum()), rel=1e-5)


def test_grid_and_its_minimum():
    assert grid(5) == [0.0, 0.25, 0.5, 0.75, 1.0] and grid(2) == [0.0, 1.0]
    assert grid(3, interior=True) == [0.0, 0.5, 1.0]
    with pytest.raises(SymmergeError, match="at least 2 grid points"):
        grid(1)
    with pytest.raises(SymmergeError, match="at least 3 grid points"):
        grid(2, interior=True)


def test_model_inputs_cast_floats_keep_ids_and_drop_labels():
    ids, pixels = torch.arange(6).reshape(2, 3), torch.rand(2, 1, 4, 4)
    batch = {"input_ids": ids, "pixel_values": pixels, "labels": ids}
    out = model_inputs(batch, torch.float64)
    assert set(out) == {"input_ids", "pixel_values"} and out["input_ids"] is ids
    assert out["pixel_values"].dtype == torch.float64 and torch.equal(out["pixel_values"], pixels.double())
    assert model_inputs(batch, torch.float64, labels=True)["labels"] is ids


def test_stock_forward_is_the_stock_model_at_any_eps(model_dirs):
    """Through the service, A's canonical parameters score what the stock model loaded from A's folder
    scores, and a·A (residual scale a: eps moved to a^2 eps) scores the same, float64. Negative control:
    without the eps put back, a·A scores differently."""
    path = model_dirs["gpt2"]
    a, batches = load_model(path), lm_batches(2, 0)
    fwd = StockForward(a)
    assert fwd.dtype == torch.float64
    stock = evaluate(hf_class(a.shape.hf_class).from_pretrained(path, dtype=torch.float64), batches)
    own = fwd.scores(a.params, batches)
    assert own["loss"] == pytest.approx(stock["loss"], rel=1e-12) and own["accuracy"] == stock["accuracy"]
    scaled = apply(a.spec, {"residual.scale": torch.tensor(0.01, dtype=torch.float64)}, a.params)
    assert fwd.scores(scaled, batches)["loss"] == pytest.approx(stock["loss"], rel=1e-12)
    assert fwd.logit_change(scaled, batches[0]) < 1e-10
    fwd.rescale = False
    assert abs(fwd.scores(scaled, batches)["loss"] - stock["loss"]) > 1e-3


def test_interpolate_keeps_a_scalar_equal_on_both_sides():
    """The canonical eps of two models with one config eps stays that eps (it is written into the config);
    negative control: the written sum at λ = 0.3 is one rounding off 1e-05."""
    a = {"norm.eps": torch.tensor(1e-5, dtype=torch.float64), "x": torch.ones(3, dtype=torch.float64)}
    b = {"norm.eps": torch.tensor(1e-5, dtype=torch.float64), "x": torch.zeros(3, dtype=torch.float64)}
    assert float(interpolate(a, b, 0.3)["norm.eps"]) == 1e-5
    assert float(0.7 * a["norm.eps"] + 0.3 * b["norm.eps"]) != 1e-5
    other = {**b, "norm.eps": torch.tensor(4e-5, dtype=torch.float64)}  # unequal scalars are interpolated
    assert float(interpolate(a, other, 0.5)["norm.eps"]) == pytest.approx(2.5e-5, rel=1e-15)
