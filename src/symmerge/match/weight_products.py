"""The matrix products behind weight matching's assignment costs, `x @ y^T`, exact or from bfloat16 operands.

`cross(x, y, products)` contracts the last axis of `x [*batch, n, m]` and `y [*batch, k, m]` into
`[*batch, n, k]`:

- `products=None` (`EXACT`): in the operands' dtype (the algebra's precision), as `x @ y^T`;
- `products="bfloat16"` (`BF16`): both operands rounded to bfloat16, products accumulated and returned in
  float32. The products of two bfloat16 numbers are exact in float32, so the result is the float32 GEMM of
  the rounded operands up to summation order. On CPUs with AVX512-BF16/AMX, MKL's `cblas_gemm_bf16bf16f32`
  (exported by torch's own `libtorch_cpu`) runs it several times faster than a float32 GEMM
  (`benchmarks/cost_products.py` measures the two side by side); where the symbol is missing, or on another
  device, the rounded operands are multiplied in float32 instead (the same numbers, slower).

Weight matching uses `BF16` only for the cost matrices that *propose* an assignment (FFN units, head
circuits): every candidate is still judged by its exact distance in the algebra's precision
(`weight_state.State.offer`), so the objective stays monotone and exactly reported. What rounding can
change is which of two nearly tied assignments is proposed: a stored bf16 checkpoint carries no more
digits than the operands keep, but canonical tensors (mean-free writers, folded norms) and B under a
rotation are rounded afresh, by at most 2^-9 relative per entry.

Where the products run: `Products(precision, device)` names a device too (`--device` of weight matching):
the operands are copied there, multiplied, and the result comes back to the operands' device. On a GPU
the bf16 form multiplies the rounded operands in float32 (TF32 stays off, torch's default for matmul), so
the numbers are the CPU's up to summation order.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import NamedTuple

import torch

EXACT, BF16 = None, "bfloat16"
#: what `--cost-products` offers, in that order (the first is the default)
CHOICES = ("exact", BF16)

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


class Products(NamedTuple):
    """How the products run: `precision` (`EXACT` or `BF16`) and `device` (None: where the operands are)."""

    precision: str | None = EXACT
    device: torch.device | None = None


def on_device(fn, device: torch.device | None, *tensors: torch.Tensor) -> torch.Tensor:
    """`fn(*tensors)` computed on `device` (None: where the tensors are), the result on the first tensor's device."""
    if device is None or torch.device(device) == tensors[0].device:
        return fn(*tensors)
    return fn(*(t.to(device) for t in tensors)).to(tensors[0].device)


@functools.lru_cache(maxsize=1)
def _mkl_gemm():
    """MKL's bf16 x bf16 -> f32 GEMM from torch's CPU library, or None where torch does not export it."""
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        fn = ctypes.CDLL(str(lib)).cblas_gemm_bf16bf16f32
    except (OSError, AttributeError):
        return None
    fn.restype = None
    fn.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                        ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    return fn


def _gemm_bf16(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`x [n, m] @ y [k, m]^T` of bf16 matrices in float32, by MKL (both contiguous, row-major)."""
    x, y = x.contiguous(), y.contiguous()
    n, m, k = x.shape[0], x.shape[1], y.shape[0]
    out = torch.empty(n, k, dtype=torch.float32)
    if n and k and m:
        _mkl_gemm()(_ROW_MAJOR, _NO_TRANS, _TRANS, n, k, m, 1.0, x.data_ptr(), m, y.data_ptr(), m, 0.0, out.data_ptr(), k)
    else:
        out.zero_()
    return out


def mkl_available() -> bool:
    return _mkl_gemm() is not None


def operand(x: torch.Tensor, products: str | Products | None = EXACT) -> torch.Tensor:
    """`x` as `cross` multiplies it: rounded to bfloat16 for bf16 products, else unchanged."""
    precision = products.precision if isinstance(products, Products) else products
    return x.to(torch.bfloat16) if precision == BF16 else x


def cross(x: torch.Tensor, y: torch.Tensor, products: str | Products | None = EXACT) -> torch.Tensor:
    """`x @ y^T` over the last axis, batched over the leading ones (see the module docstring); `products`: a
    precision, or `Products` (a precision and a device)."""
    if isinstance(products, Products):
        return on_device(lambda a, b: cross(a, b, products.precision), products.device, x, y)
    if products in (EXACT, "exact"):
        return x @ y.transpose(-1, -2)
    if products != BF16:
        raise ValueError(f"internal: unknown products {products!r}; choose from {CHOICES}")
    xb, yb = x.to(torch.bfloat16), y.to(torch.bfloat16)
    big = max(x.shape[-2], y.shape[-2], x.shape[-1]) >= 2**31
    if x.device.type != "cpu" or not mkl_available() or big:
        return xb.float() @ yb.float().transpose(-1, -2)
    lead = torch.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    count = 1
    for n in lead:
        count *= n
    xs = xb.expand(*lead, *x.shape[-2:]).reshape(count, *x.shape[-2:])
    ys = yb.expand(*lead, *y.shape[-2:]).reshape(count, *y.shape[-2:])
    out = [_gemm_bf16(a, b) for a, b in zip(xs, ys)]
    out = torch.stack(out) if out else torch.empty(0, x.shape[-2], y.shape[-2])
    return out.reshape(*lead, x.shape[-2], y.shape[-2])
