"""The one evaluation service: batches and canonical parameters through the *stock* HF forward.

- `model_inputs`: a batch as forward kwargs (floating inputs cast to the model's dtype and device).
- `evaluate(hf_model, batches)`: loss and accuracy of a stock model. Language models: mean next-token
  cross-entropy per predicted token (logits at position t scored against `labels[:, t + 1]`,
  positions labelled -100 ignored) and next-token accuracy. Image classifiers: mean cross-entropy per
  image and top-1 accuracy. Standard errors are over batches: the standard deviation of the per-batch
  means divided by sqrt(n_batches) (NaN for one batch). `evaluate_params` does the same with the
  model's parameters replaced by a state dict (`torch.func.functional_call`; the model is untouched).
- `StockForward`: one stock HF model built once for a model's shape, dtype and device, through which
  any canonical parameters run (a point on a path, an endpoint moved by a group element, a weighted
  point of several models): the barrier, the learning objective, the demo's and the outputs' checks.
- `interpolate` and `grid`: the one interpolation formula and the one λ grid.

The HF model holds a fixed normalisation eps, while a residual scale `a` moves a model's eps to
`a^2 eps` (`norm.eps` is a canonical tensor) and interpolation mixes the endpoints' eps. Because
norm(c x; c^2 eps) = norm(x; eps), `at_eps` brings canonical parameters to the HF model's eps with
the residual scale `c = sqrt(eps0 / eps)`: exact in real arithmetic and differentiable (in floating
point the moved weights are rounded once; an endpoint whose eps differs from the template's is then
equal to its stock forward to that rounding, not bit for bit).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch.func import functional_call

from ..algebra.apply import apply
from ..algebra.spec import SCALE
from ..errors import SymmergeError
from ..store.model import Model, build_hf_model, export_state_dict

Params = dict[str, torch.Tensor]


def model_inputs(batch: dict, dtype: torch.dtype, device=None, labels: bool = False) -> dict:
    """Forward kwargs of a batch: floating tensors cast to `dtype` (and moved to `device` when given);
    `labels` dropped unless asked for (then the HF model computes its own loss)."""
    return {k: (v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) if torch.is_tensor(v) else v)
            for k, v in batch.items() if labels or k != "labels"}


def interpolate(a: Params, b: Params, lam) -> Params:
    """(1 - lam)·a + lam·b, tensor by tensor, computed as that sum at every lam, endpoints included (the
    learning loop's figures depend on it to the last bit; `torch.lerp` rounds differently, and a
    shortcut at 0 and 1 would hand the forward tensors of another memory layout). `lam` a number or a
    0-dim tensor. At lam = 0 or 1 the values are exactly a's or b's where both are finite.

    A 0-dim value equal on both sides (the canonical `norm.eps`) is kept as it is: the sum would put
    9.999999999999999e-06 for 1e-05 into the written config."""
    return {k: a[k] if a[k].dim() == 0 and torch.equal(a[k], b[k]) else (1 - lam) * a[k] + lam * b[k] for k in a}


def grid(points: int, interior: bool = False) -> list[float]:
    """`points` evenly spaced λ in [0, 1], both endpoints included. A curve needs its two endpoints;
    with `interior`, a barrier's grid, one point between them too."""
    least = 3 if interior else 2
    if points < least:
        what = "a barrier" if interior else "a λ grid"
        why = "both endpoints and one between" if interior else "the endpoints"
        raise SymmergeError(f"{what} needs at least {least} grid points ({why})")
    return [i / (points - 1) for i in range(points)]


def at_eps(model: Model, params: Params, eps0: float) -> Params:
    """`params` moved by the residual scale c = sqrt(eps0 / eps) so that their normalisation eps is
    `eps0` (the function is unchanged; see the module docstring). Only for models with a residual scale."""
    c = torch.sqrt(eps0 / params["norm.eps"].to(torch.float64))
    return apply(model.spec, {SCALE: c}, params)


class StockForward:
    """The stock HF forward of `model`'s class, built once, for canonical parameters of that shape.

    `dtype` (default: the checkpoint's) and `device` (default: the CPU) are where the forward runs;
    canonical parameters stay in whatever dtype the caller keeps them, and are cast only in
    `state_dict`. The HF model's own weights are frozen and never used: gradients reach whatever
    produced the parameters (the group elements) and nothing else."""

    def __init__(self, model: Model, dtype: torch.dtype | None = None, device=None):
        self.model, self.dtype, self.device = model, dtype or model.dtype, device
        config, sd = export_state_dict(model, dtype=self.dtype)
        self.hf = build_hf_model(config, sd, model.shape.hf_class)
        if device is not None:
            self.hf.to(device)
        self.hf.requires_grad_(False)
        self.keys = set(self.hf.state_dict())  # the export may hold zero biases the class has no slot for
        self.eps0 = float(model.params["norm.eps"]) if "norm.eps" in model.params else None
        self.rescale = self.eps0 is not None and SCALE in model.spec.groups

    def state_dict(self, params: Params) -> Params:
        """HF state dict of canonical `params`, at the HF model's eps, in the forward's dtype and device."""
        if self.rescale:
            params = at_eps(self.model, params, self.eps0)
        sd = self.model.adapter.from_canonical(params, self.model.shape)
        return {k: v.to(device=self.device, dtype=self.dtype) for k, v in sd.items() if k in self.keys}

    def forward(self, params: Params, batch: dict, labels: bool = True):
        """The HF model's output on `batch` with `params` (with its loss when the batch has labels)."""
        inputs = model_inputs(batch, self.dtype, self.device, labels=labels)
        return functional_call(self.hf, self.state_dict(params), args=(), kwargs=inputs)

    def logits(self, params: Params, batch: dict) -> torch.Tensor:
        return self.forward(params, batch, labels=False).logits

    def loss(self, params: Params, batch: dict) -> torch.Tensor:
        """The HF model's own loss (what the learning objective differentiates)."""
        if "labels" not in batch:
            raise SymmergeError("each batch needs 'labels' (the task loss is the HF model's loss)")
        return self.forward(params, batch).loss

    @torch.no_grad()
    def mean_loss(self, params: Params, batches: list[dict]) -> float:
        return sum(float(self.loss(params, b)) for b in batches) / len(batches)

    def scores(self, params: Params, batches: list[dict]) -> dict:
        """`evaluate`'s loss, accuracy and standard errors for `params` (the barrier's figures)."""
        return evaluate_params(self.hf, self.state_dict(params), batches)

    @torch.no_grad()
    def logit_change(self, params: Params, batch: dict, reference: Params | None = None) -> float:
        """Largest |logit difference| between `params` and `reference` (default: the model's own)."""
        ref = self.model.params if reference is None else reference
        return max_abs_diff(self.logits(params, batch), self.logits(ref, batch))


def max_abs_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x - y).abs().max())


def batch_scores(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, int, int]:
    """(summed cross-entropy, number of correct predictions, number of scored items) of one batch."""
    if logits.ndim == 3:  # (B, T, V): next-token, HF shift convention
        logits, labels = logits[:, :-1], labels[:, 1:]
    logits = logits.reshape(-1, logits.shape[-1]).to(torch.float64)
    labels = labels.reshape(-1).to(logits.device)
    keep = labels != -100
    logits, labels = logits[keep], labels[keep]
    loss = F.cross_entropy(logits, labels, reduction="sum")
    correct = (logits.argmax(-1) == labels).sum()
    return float(loss), int(correct), int(labels.numel())


def mean_se(values: list[float]) -> float:
    """Standard error of the mean of `values` (NaN for fewer than two)."""
    n = len(values)
    if n < 2:
        return float("nan")
    m = sum(values) / n
    return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n)


def _run(forward: Callable[[dict], torch.Tensor], batches: list[dict], dtype: torch.dtype, device) -> dict:
    total_loss, total_correct, total_n = 0.0, 0, 0
    losses, accs = [], []
    with torch.no_grad():
        for batch in batches:
            loss, correct, n = batch_scores(forward(model_inputs(batch, dtype, device)), batch["labels"])
            total_loss, total_correct, total_n = total_loss + loss, total_correct + correct, total_n + n
            losses.append(loss / max(n, 1))
            accs.append(correct / max(n, 1))
    return {
        "loss": total_loss / max(total_n, 1), "loss_se": mean_se(losses),
        "accuracy": total_correct / max(total_n, 1), "accuracy_se": mean_se(accs),
        "n_batches": len(batches), "n_items": sum(len(b["labels"]) for b in batches), "n_scored": total_n,
    }


def _first(tensors) -> torch.Tensor:
    return next(iter(tensors))


def evaluate(hf_model, batches: list[dict]) -> dict:
    """Mean loss per token / image, accuracy, their standard errors over batches, counts.

    `n_items` counts sequences or images; `n_scored` counts the predictions the means are over."""
    w = _first(hf_model.parameters())
    was_training = hf_model.training
    hf_model.eval()
    try:
        return _run(lambda kw: hf_model(**kw).logits, batches, w.dtype, w.device)
    finally:
        hf_model.train(was_training)


def evaluate_params(hf_model, state_dict: Params, batches: list[dict]) -> dict:
    """`evaluate` with the model's parameters replaced by `state_dict` (functional_call; the model is
    not modified). Names missing from `state_dict` keep the model's own tensors."""
    w = _first(state_dict.values()) if state_dict else _first(hf_model.parameters())
    was_training = hf_model.training
    hf_model.eval()
    try:
        return _run(lambda kw: functional_call(hf_model, state_dict, args=(), kwargs=kw).logits, batches, w.dtype, w.device)
    finally:
        hf_model.train(was_training)
