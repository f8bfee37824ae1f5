"""The assignment costs' products (`match/weight_products.py`): bfloat16 operands with float32 accumulation
equal the float64 product of the rounded operands to float32 accuracy; weight matching with them still
recovers a planted element and never lowers the objective."""

from __future__ import annotations

import pytest
import torch

from factories import rel_distance
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.algebra.spec import build_spec
from symmerge.match.weight import weight_match
from symmerge.match.weight_products import BF16, cross, mkl_available
from test_weight_matching import SYNTHETIC, synthetic_params


@pytest.mark.parametrize("shape", [(37, 300, 29), (2, 3, 16, 70, 16), (5, 0, 4)])
def test_bf16_products_equal_the_rounded_operands_product(shape):
    gen = torch.Generator().manual_seed(0)
    *lead, n, m, k = shape
    x = torch.randn(*lead, n, m, generator=gen)
    y = torch.randn(*lead, k, m, generator=gen)
    got = cross(x, y, BF16)
    rounded = x.bfloat16().double() @ y.bfloat16().double().transpose(-1, -2)
    assert got.dtype == torch.float32 and got.shape == rounded.shape
    # float32 accumulation of exact products: error ~ sqrt(m) eps32 |x||y|
    tol = 8 * m**0.5 * torch.finfo(torch.float32).eps * (float(x.abs().max() * y.abs().max()) if m else 0.0) + 1e-30
    assert (float((got.double() - rounded).abs().max()) if got.numel() else 0.0) <= tol
    if n * m * k:  # negative control: the unrounded product is further away than the tolerance
        exact = x.double() @ y.double().transpose(-1, -2)
        assert float((got.double() - exact).abs().max()) > tol
        assert torch.equal(cross(x, y), x @ y.transpose(-1, -2))


def test_mkl_kernel_is_found_on_this_build():
    """The CPU wheels this project pins export MKL's bf16 GEMM; without it `cross` falls back (slower, equal)."""
    assert mkl_available()


@pytest.mark.parametrize("name", SYNTHETIC)
def test_weight_matching_with_bf16_costs_recovers_a_planted_element(name):
    shape = SYNTHETIC[name]
    spec, params = build_spec(shape), synthetic_params(shape, 3)
    params = {k: v.float() for k, v in params.items()}
    g = random_element(spec, torch.Generator().manual_seed(11))
    B = apply(spec, g, params)
    res = weight_match(spec, params, B, None, max_iters=10, dtype=torch.float32, products=BF16)
    assert rel_distance(B, params) > 0.1
    assert rel_distance(apply(spec, res.g, B), params) <= 1e-4
    assert all(y >= x - 1e-6 for x, y in zip(res.history, res.history[1:])), res.history
