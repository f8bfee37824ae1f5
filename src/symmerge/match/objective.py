"""The task loss of an interpolated model, computed with the stock Hugging Face forward.

Canonical parameters (already moved by group elements) are interpolated, exported by the adapter
and run through `torch.func.functional_call` on one stock HF model built once: there is a single
forward implementation, the one users run, and gradients reach whatever produced the parameters
(the group elements) and nothing else (the HF model's own weights are frozen and unused).

The HF model holds a fixed normalisation eps, while a residual scale `a` moves a model's eps to
`a^2 eps` (`norm.eps` is a canonical tensor) and interpolation mixes the endpoints' eps. Because
norm(c x; c^2 eps) = norm(x; eps), the interpolated parameters are brought back to the HF model's
eps by the residual scale `c = sqrt(eps0 / eps)`, which is exact and differentiable.
"""

from __future__ import annotations

import math

import torch
from torch.func import functional_call

from .. import SymmergeError
from ..apply import apply
from ..barrier import above_line
from ..model import Model, build_hf_model, export_state_dict

Params = dict[str, torch.Tensor]


def interpolate(a: Params, b: Params, lam) -> Params:
    """(1 - lam) a + lam b, tensor by tensor (lam a float or a 0-dim tensor)."""
    return {k: (1 - lam) * a[k] + lam * b[k] for k in a}


class Objective:
    """Loss of canonical parameters under the stock HF forward of `model`'s class, in `dtype`."""

    def __init__(self, model: Model, dtype: torch.dtype = torch.float32):
        self.model, self.dtype = model, dtype
        config, sd = export_state_dict(model, dtype=dtype)
        self.hf = build_hf_model(config, sd, model.shape.hf_class)
        self.hf.requires_grad_(False)
        self.keys = set(self.hf.state_dict())  # the export may hold zero biases the class has no slot for
        self.eps0 = float(model.params["norm.eps"]) if "norm.eps" in model.params else None
        self.rescale = self.eps0 is not None and "residual.scale" in model.spec.groups

    def cast(self, params: Params) -> Params:
        """Frozen canonical parameters in the training dtype (done once per model)."""
        return {k: v.detach().to(self.dtype) for k, v in params.items()}

    def state_dict(self, params: Params) -> Params:
        """HF state dict of canonical `params`, with eps brought back to the HF model's own."""
        if self.rescale:
            c = torch.sqrt(self.eps0 / params["norm.eps"].to(torch.float64))
            params = apply(self.model.spec, {"residual.scale": c}, params)
        sd = self.model.adapter.from_canonical(params, self.model.shape)
        return {k: v.to(self.dtype) for k, v in sd.items() if k in self.keys}

    def forward(self, params: Params, batch: dict):
        inputs = {k: (v.to(self.dtype) if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in batch.items()}
        return functional_call(self.hf, self.state_dict(params), args=(), kwargs=inputs)

    def loss(self, params: Params, batch: dict) -> torch.Tensor:
        if "labels" not in batch:
            raise SymmergeError("each batch needs 'labels' (the task loss is the HF model's loss)")
        return self.forward(params, batch).loss

    @torch.no_grad()
    def mean_loss(self, params: Params, batches: list[dict]) -> float:
        return sum(float(self.loss(params, b)) for b in batches) / len(batches)


def barrier(lams: list[float], losses: list[float]) -> float:
    """max over the grid of L(lam) minus the straight line between the endpoint losses (NaN if any loss is)."""
    if not all(math.isfinite(x) for x in losses):
        return math.nan
    return max(above_line(lams, losses))


def highest_excess(lams: list[float], losses: list[float]) -> float:
    """max over the interior grid points of L(lam) minus the straight line: the barrier without its floor
    at 0 (negative when the whole path lies below the line; NaN if any loss is)."""
    if not all(math.isfinite(x) for x in losses):
        return math.nan
    return max(above_line(lams, losses)[1:-1])


def grid(points: int) -> list[float]:
    if points < 3:
        raise SymmergeError("a barrier needs at least 3 grid points (both endpoints and one between)")
    return [i / (points - 1) for i in range(points)]
