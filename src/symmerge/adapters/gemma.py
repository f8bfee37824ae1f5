"""Gemma 2 (`Gemma2ForCausalLM`) and Gemma 3 text (`Gemma3ForCausalLM`): norms before and after each sublayer.

A block computes `x += n_pa(attn(n_in(x)))`, then `x += n_pf(mlp(n_pre(x)))`, every norm an RMSNorm with weight
`1 + w` (`w` stored, 0 at initialisation; the product in float32), and the model reads `sqrt(d_model) · E[token]`
(a constant of the class, which commutes with every linear map of the stream: `embed.W_E` is E as stored). The
MLP is GeGLU (`gelu_tanh(gate) * up`); attention scores are scaled by `query_pre_attn_scalar^-1/2` and soft-capped
by `tanh(s / c) · c` (Gemma 2), which see the score only: the head maps keep it. Sliding-window layers alternate
with global ones; Gemma 3 rotates its sliding layers with another RoPE base (the same pairs, so the same QK group)
and adds QK-norm per head before RoPE (Qwen3's: a sign per rotary pair). The final logits are soft-capped too.

Canonical tensors: the pre-norms' `1 + w` fold into their readers (q, k, v; gate, up) and the final norm's into
the head, as for Gemma 1 (`gemma1.py`, whose adapter this one extends); the post-norms' `1 + w` are `attn.g_post`
and `mlp.g_post` (`[d_model]`, as OLMo-2's) and the QK-norm's `attn.g_Q`, `attn.g_K` (`[d_head]`); the export
writes `w = γ - 1` (`norm_offset`). The group
(`spec.py`, `ModelShape.post_norm`): a norm on each sublayer's output restricts the residual map to what commutes
with it, `O diag(γ) = diag(γ') O'`, the signed permutations for generic γ, the post-norm weights permuted along
and not signed; no residual scale (the eps is shared by the post-norms, whose inputs the scale does not reach).
Heads, FFN units, GLU scales, OV maps as Llama's; QK maps scaled rotations per rotary pair (Gemma 2) or their
signs (Gemma 3). Embeddings are tied in the checkpoints, the head written as Gemma 1's is.
"""

from __future__ import annotations

import dataclasses

import torch

from ..algebra.shape import ModelShape
from .base import HookPoints
from .gemma1 import Gemma1Adapter
from .llama import (
    decoder_attention_from_canonical,
    decoder_attention_to_canonical,
    decoder_mlp_from_canonical,
    decoder_mlp_to_canonical,
    qk_norm_from_canonical,
    qk_norm_to_canonical,
)

#: (the part whose output a post-norm normalises, its pre-norm, its post-norm)
NORMS = (("attn", "input_layernorm", "post_attention_layernorm"), ("mlp", "pre_feedforward_layernorm", "post_feedforward_layernorm"))


class GemmaAdapter(Gemma1Adapter):
    name = "gemma"
    hf_classes = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
    hooks = HookPoints(norms=("model.layers.{i}.input_layernorm", "model.layers.{i}.pre_feedforward_layernorm"),
                       attn_norm="model.layers.{i}.input_layernorm", final_norm="model.norm",
                       ffn_hidden="model.layers.{i}.mlp.down_proj", block="model.layers.{i}",
                       attention="model.layers.{i}.self_attn")
    function_keys = ("sliding_window", "layer_types", "query_pre_attn_scalar", "attn_logit_softcapping",
                     "final_logit_softcapping", "use_bidirectional_attention", "rope_parameters")
    def shape(self, c) -> ModelShape:
        s = super().shape(c)
        return dataclasses.replace(s, post_norm=True, qk_norm="head" if s.hf_class == "Gemma3ForCausalLM" else "")

    def attention_to_canonical(self, get, s, i):
        hf, (part, pre, post) = f"model.layers.{i}", NORMS[0]
        return {**decoder_attention_to_canonical(get, s, i, (self._gamma(get, f"{hf}.{pre}"), None)),
                **qk_norm_to_canonical(get, s, i, self.norm_offset), f"blocks.{i}.{part}.g_post": self._gamma(get, f"{hf}.{post}")}

    def mlp_to_canonical(self, get, s, i):
        hf, (part, pre, post) = f"model.layers.{i}", NORMS[1]
        return {**decoder_mlp_to_canonical(get, s, i, (self._gamma(get, f"{hf}.{pre}"), None)),
                f"blocks.{i}.{part}.g_post": self._gamma(get, f"{hf}.{post}")}

    def _norms(self, params, i: int, k: int) -> dict[str, torch.Tensor]:
        """Block i's k-th pair of stock norm weights: the pre-norm at unit weight (w = 0), the post-norm's γ - 1."""
        hf, (part, pre, post) = f"model.layers.{i}", NORMS[k]
        g = params[f"blocks.{i}.{part}.g_post"]
        return {f"{hf}.{pre}.weight": torch.zeros_like(g), f"{hf}.{post}.weight": g - self.norm_offset}

    def attention_from_canonical(self, params, s, i):
        return {**decoder_attention_from_canonical(params, i, False, s.d_model),
                **qk_norm_from_canonical(params, s, i, self.norm_offset), **self._norms(params, i, 0)}

    def mlp_from_canonical(self, params, s, i):
        return {**decoder_mlp_from_canonical(params, i), **self._norms(params, i, 1)}
