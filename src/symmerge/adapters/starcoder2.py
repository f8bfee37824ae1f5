"""StarCoder2 (`Starcoder2ForCausalLM`): GPT-NeoX's sequential LayerNorm block with Llama's attention names.

A block computes `x += o(attn(ln1(x)))`, then `x += c_proj(act(c_fc(ln2(x))))`: two LayerNorms with weights and
biases, q, k, v, o, `c_fc` and `c_proj` with biases when `use_bias` (the default), grouped KV heads, RoPE on the
whole head paired as Llama pairs it (i with i + d_head/2, `rotary_layout="half"`), an optional sliding window (a
function key: it masks scores only), the final LayerNorm `model.norm` folded into the head (no head bias; tied by
default). LayerNorm model: writers mean-free, the residual rotation fixes the all-ones vector; the group is
GPT-NeoX's with KV groups (a scaled rotation per rotary pair for the QK maps). Dropouts act in training only.
"""

from __future__ import annotations

import torch

from ..algebra.shape import ModelShape
from .base import (
    Adapter,
    HookPoints,
    any_attention_bias,
    final_norm_to_canonical,
    head_weight,
    layernorm_block_from_canonical,
    layernorm_block_to_canonical,
    make_mean_free,
    require,
    rotary_dims,
)

#: under `model.layers.{i}`: the attention's projections (q, k, v, o), the MLP's layers (in, out), the norms (read by
#: attention, by the MLP)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("c_fc", "c_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")


class Starcoder2Adapter(Adapter):
    name = "starcoder2"
    hf_classes = ("Starcoder2ForCausalLM",)
    hooks = HookPoints(norms=("model.layers.{i}.input_layernorm", "model.layers.{i}.post_attention_layernorm"),
                       attn_norm="model.layers.{i}.input_layernorm", final_norm="model.norm",
                       ffn_hidden="model.layers.{i}.mlp.c_proj", block="model.layers.{i}",
                       attention="model.layers.{i}.self_attn")
    function_keys = ("sliding_window", "rope_parameters")

    def shape(self, c) -> ModelShape:
        d, h = c.hidden_size, c.num_attention_heads
        kv = c.num_key_value_heads or h
        require(d % h == 0, f"hidden_size={d} is not divisible by num_attention_heads={h}")
        require(h % kv == 0, f"num_attention_heads={h} is not a multiple of num_key_value_heads={kv}")
        dh = d // h
        return ModelShape(
            arch=self.name, hf_class="Starcoder2ForCausalLM", d_model=d, n_layers=c.num_hidden_layers, n_heads=h,
            n_kv_heads=kv, d_head=dh, d_mlp=c.intermediate_size, vocab=c.vocab_size, norm="layernorm", gated=False,
            parallel=False, rotary_dims=rotary_dims(c, "Starcoder2ForCausalLM"), rotary_layout="half",
            tied=bool(getattr(c, "tie_word_embeddings", False)), eps=float(c.norm_epsilon), eps_in_config=True,
            activation=c.hidden_act,
        )

    def embed_to_canonical(self, get, s):
        return make_mean_free({"embed.W_E": get("model.embed_tokens.weight")}, s)

    def block_to_canonical(self, get, s, i):
        hf = f"model.layers.{i}"
        ln1, ln2 = ((get(f"{hf}.{n}.weight"), get(f"{hf}.{n}.bias")) for n in NORMS)
        return layernorm_block_to_canonical(get, s, i, f"{hf}.self_attn", ATTENTION, ln1, ln2,
                                            tuple(f"{hf}.mlp.{n}" for n in MLP))

    def final_to_canonical(self, get, s):
        w_u = head_weight(get, "model.embed_tokens.weight")
        return final_norm_to_canonical(w_u, None, get("model.norm.weight"), get("model.norm.bias"), s.eps)

    def ends_from_canonical(self, params, s):
        return {"model.embed_tokens.weight": params["embed.W_E"],
                "model.norm.weight": torch.ones(s.d_model, dtype=torch.float64), "model.norm.bias": params["final.b_norm"],
                "lm_head.weight": params["head.W_U"]}

    def block_from_canonical(self, params, s, i):
        hf = f"model.layers.{i}"
        return layernorm_block_from_canonical(params, s, i, f"{hf}.self_attn", ATTENTION,
                                              tuple(f"{hf}.{n}" for n in NORMS), tuple(f"{hf}.mlp.{n}" for n in MLP))

    def export_config(self, config, s, params):
        config = super().export_config(config, s, params)
        config.norm_epsilon = float(params["norm.eps"])
        # one flag for every bias of the blocks: folding the LayerNorm biases gives q, k, v and c_fc biases where the
        # source had none
        config.use_bias = bool(config.use_bias) or any_attention_bias(params, s) or any(
            bool(params[f"blocks.{i}.mlp.b_{c}"].ne(0).any()) for i in range(s.n_layers) for c in ("in", "out"))
        return config
