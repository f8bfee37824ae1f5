"""Command R and Aya (`CohereForCausalLM`): one LayerNorm read by attention and a gated MLP in parallel, interleaved
RoPE, a logit multiplier.

A block computes `x + attn(ln(x)) + mlp(ln(x))` with Llama's tensor names (`self_attn.{q,k,v,o}_proj`, SwiGLU
`mlp.{gate,up,down}_proj`) and a single LayerNorm `input_layernorm` that centres and has a weight but no bias
(computed in float32); its weight folds into q, k, v, gate and up alike, so canonical `ln1` and `ln2` are the
same norm, as Phi's. RoPE pairs dimensions (2k, 2k + 1) (`rotary_layout="interleaved"`) over the whole head; the
final LayerNorm `model.norm` folds into the (tied by default) head, and the logits are multiplied by
`logit_scale`, a scalar of the config. LayerNorm model: writers mean-free, the residual rotation fixes the
all-ones vector, the residual scale moves the eps in the config; heads, KV groups, QK and OV maps, FFN units and
GLU scales as Llama's. The optional QK LayerNorm (`use_qk_norm`, centred, a weight per head and dimension) is
refused.
"""

from __future__ import annotations

import dataclasses

import torch

from ..algebra.shape import ModelShape
from .base import Adapter, HookPoints, final_norm_to_canonical, head_weight, make_mean_free, require
from .llama import (
    _decoder_shape,
    decoder_attention_from_canonical,
    decoder_block_to_canonical,
    decoder_ends_from_canonical,
    decoder_mlp_from_canonical,
)


class CohereAdapter(Adapter):
    name = "cohere"
    hf_classes = ("CohereForCausalLM",)
    hooks = HookPoints(norms=("model.layers.{i}.input_layernorm",), attn_norm="model.layers.{i}.input_layernorm",
                       final_norm="model.norm", ffn_hidden="model.layers.{i}.mlp.down_proj", block="model.layers.{i}",
                       attention="model.layers.{i}.self_attn")
    function_keys = ("logit_scale", "rope_parameters")

    def shape(self, c) -> ModelShape:
        require(not getattr(c, "use_qk_norm", False), "use_qk_norm=True normalises q and k per head with a centring "
                "LayerNorm whose weights differ per head: not supported (Command R and Aya ship without it)")
        s = _decoder_shape(self, c, "CohereForCausalLM", "layernorm", eps_in_config=True)
        return dataclasses.replace(s, parallel=True, rotary_layout="interleaved", eps=float(c.layer_norm_eps))

    def embed_to_canonical(self, get, s):
        return make_mean_free({"embed.W_E": get("model.embed_tokens.weight")}, s)

    def block_to_canonical(self, get, s, i):
        ln = (get(f"model.layers.{i}.input_layernorm.weight"), None)  # read by both sublayers
        return make_mean_free(decoder_block_to_canonical(get, s, i, ln, ln), s)

    def final_to_canonical(self, get, s):
        w_u = head_weight(get, "model.embed_tokens.weight")
        return final_norm_to_canonical(w_u, None, get("model.norm.weight"), None, s.eps)

    def ends_from_canonical(self, params, s):
        return decoder_ends_from_canonical(params, s, norm_weights=True)

    def block_from_canonical(self, params, s, i):
        return {**decoder_attention_from_canonical(params, i, False, s.d_model), **decoder_mlp_from_canonical(params, i),
                f"model.layers.{i}.input_layernorm.weight": torch.ones(s.d_model, dtype=torch.float64)}

    def export_config(self, config, s, params):
        config = super().export_config(config, s, params)
        config.layer_norm_eps = float(params["norm.eps"])
        return config
