"""A language-model pair's midpoint excess at every predicted position: the loss of the canonical average of A and
B (as `symmerge barrier` and `interpolate` form it) minus the mean of the endpoints' losses, token by token.

The pair's barrier at λ = 1/2 is this excess's mean. `barrier_by_position.py` averages it per position in the
window and `barrier_by_token.py` per class of input token."""

from __future__ import annotations

import torch

from symmerge.evaluation.forward import StockForward, interpolate


def token_losses(forward: StockForward, params: dict, batches: list[dict]) -> torch.Tensor:
    """Next-token loss of every predicted position of `batches` (float64, [windows, T - 1])."""
    out = []
    with torch.no_grad():
        for batch in batches:
            ids = batch["input_ids"]
            logits = forward.forward(params, batch, labels=False).logits[:, :-1].double()
            out.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none"))
    return torch.cat(out)


def excess(a, b, batches: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the midpoint's loss minus the endpoints' mean, the endpoints' mean) at every predicted position of
    `batches` ([windows, T - 1] each), for models `a` and `b` of one class."""
    forward = StockForward(a)
    ends = (token_losses(forward, a.params, batches) + token_losses(forward, b.params, batches)) / 2
    return token_losses(forward, interpolate(a.params, b.params, 0.5), batches) - ends, ends
