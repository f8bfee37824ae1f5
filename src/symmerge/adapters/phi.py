"""Phi-1, Phi-1.5 and Phi-2 (`PhiForCausalLM`): one LayerNorm read by attention and MLP in parallel, partial RoPE,
a head with a bias.

A block computes `x + attn(ln(x)) + mlp(ln(x))`: a single LayerNorm per block, whose weight and bias fold into q,
k, v and into `fc1` alike (canonical `ln1` and `ln2` are the same norm), so the block is GPT-NeoX's parallel one
with its two norms equal. q, k, v, `dense`, `fc1`, `fc2` and the head carry biases; the final LayerNorm folds into
the head and its bias (`head.b_U`). RoPE rotates the first `rotary_dims = d_head * partial_rotary_factor`
dimensions of each head, pairing i with i + rotary_dims/2 (`rotary_layout="half"`). LayerNorm model: writers
mean-free, the residual rotation fixes the all-ones vector; the group is GPT-NeoX's (a scaled rotation per rotary
pair for the QK maps, a full block on the rest of the head; key-value groups when `num_key_value_heads` is set).
The optional QK LayerNorm (`qk_layernorm`) normalises q and k per head over all their dimensions, rotary ones too:
refused.
"""

from __future__ import annotations

import torch

from ..algebra.shape import ModelShape
from .base import (
    Adapter,
    HookPoints,
    final_norm_to_canonical,
    head_weight,
    layernorm_block_from_canonical,
    layernorm_block_to_canonical,
    make_mean_free,
    require,
    rotary_dims,
)

#: the attention's projections (q, k, v, o) under `model.layers.{i}.self_attn`
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "dense")


class PhiAdapter(Adapter):
    name = "phi"
    hf_classes = ("PhiForCausalLM",)
    hooks = HookPoints(norms=("model.layers.{i}.input_layernorm",), attn_norm="model.layers.{i}.input_layernorm",
                       final_norm="model.final_layernorm", ffn_hidden="model.layers.{i}.mlp.fc2",
                       block="model.layers.{i}", attention="model.layers.{i}.self_attn")

    def shape(self, c) -> ModelShape:
        d, h = c.hidden_size, c.num_attention_heads
        kv = getattr(c, "num_key_value_heads", None) or h
        require(not getattr(c, "qk_layernorm", False), "qk_layernorm=True normalises q and k over each head's rotary "
                "and pass-through dimensions together: not supported (Phi is, with qk_layernorm=False as Phi-1, 1.5 "
                "and 2 ship)")
        require(d % h == 0, f"hidden_size={d} is not divisible by num_attention_heads={h}")
        require(h % kv == 0, f"num_attention_heads={h} is not a multiple of num_key_value_heads={kv}")
        dh = d // h
        return ModelShape(
            arch=self.name, hf_class="PhiForCausalLM", d_model=d, n_layers=c.num_hidden_layers, n_heads=h, n_kv_heads=kv,
            d_head=dh, d_mlp=c.intermediate_size, vocab=c.vocab_size, norm="layernorm", gated=False, parallel=True,
            rotary_dims=rotary_dims(c, "PhiForCausalLM"), rotary_layout="half", tied=bool(getattr(c, "tie_word_embeddings", False)),
            eps=float(c.layer_norm_eps), eps_in_config=True, activation=c.hidden_act,
        )

    def embed_to_canonical(self, get, s):
        return make_mean_free({"embed.W_E": get("model.embed_tokens.weight")}, s)

    def block_to_canonical(self, get, s, i):
        hf = f"model.layers.{i}"
        ln = (get(f"{hf}.input_layernorm.weight"), get(f"{hf}.input_layernorm.bias"))  # read by both sublayers
        return layernorm_block_to_canonical(get, s, i, f"{hf}.self_attn", PROJECTIONS, ln, ln,
                                            (f"{hf}.mlp.fc1", f"{hf}.mlp.fc2"))

    def final_to_canonical(self, get, s):
        w_u = head_weight(get, "model.embed_tokens.weight")
        ln = (get("model.final_layernorm.weight"), get("model.final_layernorm.bias"))
        b_u = get("lm_head.bias", None)
        return final_norm_to_canonical(w_u, torch.zeros(s.vocab, dtype=torch.float64) if b_u is None else b_u, *ln, s.eps)

    def ends_from_canonical(self, params, s):
        return {"model.embed_tokens.weight": params["embed.W_E"],
                "model.final_layernorm.weight": torch.ones(s.d_model, dtype=torch.float64),
                "model.final_layernorm.bias": torch.zeros(s.d_model, dtype=torch.float64),
                "lm_head.weight": params["head.W_U"], "lm_head.bias": params["head.b_U"]}

    def block_from_canonical(self, params, s, i):
        hf = f"model.layers.{i}"
        return layernorm_block_from_canonical(params, s, i, f"{hf}.self_attn", PROJECTIONS, (f"{hf}.input_layernorm",),
                                              (f"{hf}.mlp.fc1", f"{hf}.mlp.fc2"))

    def export_config(self, config, s, params):
        config = super().export_config(config, s, params)
        config.layer_norm_eps = float(params["norm.eps"])
        return config
