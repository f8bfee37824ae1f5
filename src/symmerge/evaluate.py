"""Loss and accuracy of a stock HF model on prepared batches (see `symmerge.data.load_batches`).

Language models: mean next-token cross-entropy per predicted token (logits at position t scored
against `labels[:, t + 1]`, positions labelled -100 ignored) and next-token accuracy. Image
classifiers: mean cross-entropy per image and top-1 accuracy. Standard errors are over batches:
the standard deviation of the per-batch means divided by sqrt(n_batches) (NaN for one batch).

`evaluate_params` runs the same forward with `torch.func.functional_call(model, state_dict, kwargs)`,
so interpolated parameters are evaluated by the stock HF forward without building a model per point.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F


def _inputs(batch: dict, dtype: torch.dtype) -> dict:
    """Forward kwargs without labels; floating inputs cast to the model's dtype."""
    return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in batch.items() if k != "labels"}


def batch_scores(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, int, int]:
    """(summed cross-entropy, number of correct predictions, number of scored items) of one batch."""
    if logits.ndim == 3:  # (B, T, V): next-token, HF shift convention
        logits, labels = logits[:, :-1], labels[:, 1:]
    logits = logits.reshape(-1, logits.shape[-1]).to(torch.float64)
    labels = labels.reshape(-1)
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


def _run(forward: Callable[[dict], torch.Tensor], batches: list[dict], dtype: torch.dtype) -> dict:
    total_loss, total_correct, total_n = 0.0, 0, 0
    losses, accs = [], []
    with torch.no_grad():
        for batch in batches:
            loss, correct, n = batch_scores(forward(_inputs(batch, dtype)), batch["labels"])
            total_loss, total_correct, total_n = total_loss + loss, total_correct + correct, total_n + n
            losses.append(loss / max(n, 1))
            accs.append(correct / max(n, 1))
    return {
        "loss": total_loss / max(total_n, 1), "loss_se": mean_se(losses),
        "accuracy": total_correct / max(total_n, 1), "accuracy_se": mean_se(accs),
        "n_batches": len(batches), "n_items": sum(len(b["labels"]) for b in batches), "n_scored": total_n,
    }


def _dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def evaluate(hf_model, batches: list[dict]) -> dict:
    """Mean loss per token / image, accuracy, their standard errors over batches, counts.

    `n_items` counts sequences or images; `n_scored` counts the predictions the means are over."""
    was_training = hf_model.training
    hf_model.eval()
    try:
        return _run(lambda kw: hf_model(**kw).logits, batches, _dtype(hf_model))
    finally:
        hf_model.train(was_training)


def evaluate_params(hf_model, state_dict: dict[str, torch.Tensor], batches: list[dict]) -> dict:
    """`evaluate` with the model's parameters replaced by `state_dict` (functional_call; the model is
    not modified). Names missing from `state_dict` keep the model's own tensors."""
    from torch.func import functional_call

    dtype = next(iter(state_dict.values())).dtype if state_dict else _dtype(hf_model)
    was_training = hf_model.training
    hf_model.eval()
    try:
        return _run(lambda kw: functional_call(hf_model, state_dict, args=(), kwargs=kw).logits, batches, dtype)
    finally:
        hf_model.train(was_training)
