"""Canonical form: norm parameters folded away, LayerNorm writers mean-free, head axes explicit.

Canonical tensors (float64; nn.Linear orientation, `y = x W^T + b`):

    embed.W_E       [vocab, d_model]                   token embedding (writer; rows are residual vectors)
    embed.W_pos     [n_positions, d_model]             learned absolute positions (GPT-2, ViT)
    embed.W_patch   [d_model, channels, p, p]          ViT patch projection (writer), embed.b_patch [d_model]
    embed.cls       [d_model]                          ViT CLS token
    blocks.i.attn.W_Q  [n_kv, q_per_kv, d_head, d_model]   b_Q [n_kv, q_per_kv, d_head]
    blocks.i.attn.W_K  [n_kv, d_head, d_model]             b_K [n_kv, d_head]
    blocks.i.attn.W_V  [n_kv, d_head, d_model]             b_V [n_kv, d_head]
    blocks.i.attn.W_O  [n_kv, q_per_kv, d_model, d_head]   b_O [d_model]
    blocks.i.mlp.W_in  [d_mlp, d_model] (up)  W_gate [d_mlp, d_model]  W_out [d_model, d_mlp] (down), biases alike
    final.b_norm    [d_model]    final norm bias / weight, kept when the head has no bias to take it
    head.W_U        [vocab | classes, d_model]         head.b_U [vocab | classes]
    norm.eps        []           the normalisation epsilon (it moves with the residual scale)

Why folding works: a reader sees `norm(x) * gamma + beta`, so `W (n * gamma + beta) + b =
(W diag(gamma)) n + (W beta + b)`. LayerNorm also centres: the component of the stream along the
all-ones vector is never read, so writers can drop it (subtract their mean over d_model); on a
mean-free stream LayerNorm with unit weight and zero bias *is* RMS normalisation.
"""

from __future__ import annotations

import torch

#: residual-space tensors added *after* a normalisation (they turn with the stream but do not scale with it)
POST_NORM = ("final.b_norm",)


def fold_norm(w: torch.Tensor, b: torch.Tensor | None, gamma: torch.Tensor, beta: torch.Tensor | None,
              in_place: bool = False):
    """Fold `x -> n * gamma + beta` into the reader `y = x W^T + b`; W: [out, d_model]. `in_place`: `w` is the
    caller's own and is scaled in place (`scale_residual`)."""
    b_new = torch.zeros(w.shape[0], dtype=w.dtype) if b is None else b.clone()
    if beta is not None:
        b_new = b_new + w @ beta  # the unscaled reader
    return scale_residual(w, gamma, in_place), b_new


def scale_residual(w: torch.Tensor, gamma, in_place: bool = False) -> torch.Tensor:
    """`w * gamma` along the residual (last) axis; with `in_place`, into `w` itself where the product keeps `w`'s
    dtype (a vocabulary-sized head read for the purpose: no second copy), else a new tensor."""
    return w.mul_(gamma) if in_place and torch.result_type(w, gamma) == w.dtype else w * gamma


def mean_free(t: torch.Tensor, axis: int) -> torch.Tensor:
    """Remove the all-ones component along the residual axis of a writer."""
    return t - t.mean(dim=axis, keepdim=True)


def split_q(w: torch.Tensor, n_kv: int, q_per_kv: int, d_head: int) -> torch.Tensor:
    """[n_heads * d_head, d_model] -> [n_kv, q_per_kv, d_head, d_model]; query head h uses KV head h // q_per_kv."""
    return w.reshape(n_kv, q_per_kv, d_head, -1)


def split_kv(w: torch.Tensor, n_kv: int, d_head: int) -> torch.Tensor:
    """[n_kv * d_head, d_model] -> [n_kv, d_head, d_model]."""
    return w.reshape(n_kv, d_head, -1)


def split_o(w: torch.Tensor, n_kv: int, q_per_kv: int, d_head: int) -> torch.Tensor:
    """[d_model, n_heads * d_head] -> [n_kv, q_per_kv, d_model, d_head]."""
    d = w.shape[0]
    return w.reshape(d, n_kv, q_per_kv, d_head).permute(1, 2, 0, 3)  # (nkv, g, d, dh)


def merge_q(w: torch.Tensor) -> torch.Tensor:
    return w.reshape(-1, w.shape[-1])


def merge_o(w: torch.Tensor) -> torch.Tensor:
    n_kv, g, d, dh = w.shape
    return w.permute(2, 0, 1, 3).reshape(d, n_kv * g * dh)
