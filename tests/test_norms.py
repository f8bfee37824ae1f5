"""Weight matching's squared norms and distances (`match/norms.py`) keep float32's accuracy at any size.

The objectives weight matching compares are sums of `||A||^2` and `||A - g.B||^2` over tensors as large as a
vocabulary's embedding. The reference is float64 arithmetic on the same values; the control is the single
reduction the module replaces, whose float32 error grows with the entries summed."""

from __future__ import annotations

import pytest
import torch

from symmerge.match.norms import sqdist, sqnorm
from symmerge.runtime.row_blocks import ENTRIES as BLOCK


def _rel(got: float, want: float) -> float:
    return abs(got - want) / abs(want)


def test_a_large_float32_tensor_keeps_float32_accuracy():
    """2^24 entries (four BLOCKs, a ninth of Gemma-3-1B's embedding): within 1e-6 of float64, where one
    `vector_norm` of the whole tensor is off by more (the control)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 4096, generator=gen) * 0.02
    y = torch.randn(4096, 4096, generator=gen) * 0.02
    norm64, dist64 = float(x.double().square().sum()), float((x.double() - y.double()).square().sum())
    assert _rel(sqnorm(x), norm64) < 1e-6
    assert _rel(sqdist(x, y), dist64) < 1e-6
    single = float(torch.linalg.vector_norm(x)) ** 2
    if _rel(single, norm64) < 1e-5:
        pytest.skip("this machine's float32 vector_norm is accurate at 2^24 entries: the control cannot show the "
                    "error the chunks avoid")


@pytest.mark.parametrize("shape", [(), (0, 3), (7,), (5, 3, 4), (BLOCK // 3 + 5, 3)])
def test_every_shape_and_layout_in_float64_is_exact(shape):
    """Scalars, empty tensors, and tensors of more than one BLOCK, contiguous and transposed: float64 sums to
    rounding (1e-12 relative)."""
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(shape, generator=gen, dtype=torch.float64), torch.randn(shape, generator=gen, dtype=torch.float64)
    views = [(x, y)] + ([(x.transpose(0, -1), y.transpose(0, -1))] if x.dim() > 1 else [])
    for u, w in views:
        want_n, want_d = float(u.square().sum()), float((u - w).square().sum())
        assert sqnorm(u) == pytest.approx(want_n, rel=1e-12, abs=1e-300)
        assert sqdist(u, w) == pytest.approx(want_d, rel=1e-12, abs=1e-300)


def test_tensors_of_two_shapes_are_refused():
    with pytest.raises(ValueError, match="shapes"):
        sqdist(torch.zeros(2, 3), torch.zeros(3, 2))
