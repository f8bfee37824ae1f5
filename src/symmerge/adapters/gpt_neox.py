"""GPT-NeoX / Pythia (`GPTNeoXForCausalLM`): per-head fused QKV, partial rotary, parallel residual, untied head.

`query_key_value` is fused *per head*: its output axis is `[n_heads, 3, d_head]` (q, k, v of head 0,
then of head 1, ...), not `[3, n_heads, d_head]` as GPT-2's `c_attn`. RoPE rotates the first
`rotary_dims = d_head * partial_rotary_factor` dimensions of each head (Pythia: 25%), pairing i with
i + rotary_dims/2. LayerNorm model: writers mean-free, rotation fixes the all-ones vector; the head has
no bias, so the final LayerNorm's bias survives as `final.b_norm`. Both parallel and sequential
residuals have the same group: each sub-block reads its own LayerNorm of the stream.
"""

from __future__ import annotations

import torch

from ..algebra.canonical import fold_norm
from ..algebra.shape import ModelShape
from .base import (
    Adapter,
    HookPoints,
    any_attention_bias,
    attention_from_canonical,
    attention_to_canonical,
    final_norm_to_canonical,
    fold_attention,
    head_weight,
    make_mean_free,
    require,
    rotary_dims,
)


class GPTNeoXAdapter(Adapter):
    name = "gpt_neox"
    hf_classes = ("GPTNeoXForCausalLM",)
    renames = ((r"^embed_out\.", "lm_head."),)  # stock save_pretrained still writes the head as embed_out
    hooks = HookPoints(norms=("gpt_neox.layers.{i}.input_layernorm", "gpt_neox.layers.{i}.post_attention_layernorm"),
                       attn_norm="gpt_neox.layers.{i}.input_layernorm", final_norm="gpt_neox.final_layer_norm",
                       ffn_hidden="gpt_neox.layers.{i}.mlp.dense_4h_to_h",
                       block="gpt_neox.layers.{i}",
                       attention="gpt_neox.layers.{i}.attention")
    save_renames = ((r"^lm_head\.", "embed_out."),)

    def shape(self, c) -> ModelShape:
        d, h = c.hidden_size, c.num_attention_heads
        require(d % h == 0, f"hidden_size={d} is not divisible by num_attention_heads={h}")
        dh = d // h
        return ModelShape(
            arch=self.name, hf_class="GPTNeoXForCausalLM", d_model=d, n_layers=c.num_hidden_layers, n_heads=h,
            n_kv_heads=h, d_head=dh, d_mlp=c.intermediate_size, vocab=c.vocab_size, norm="layernorm", gated=False,
            parallel=bool(c.use_parallel_residual), rotary_dims=rotary_dims(c, "GPTNeoXForCausalLM"), rotary_layout="half",
            tied=bool(getattr(c, "tie_word_embeddings", False)), eps=float(c.layer_norm_eps), eps_in_config=True,
            activation=c.hidden_act,
        )

    def embed_to_canonical(self, get, s):
        return make_mean_free({"embed.W_E": get("gpt_neox.embed_in.weight")}, s)

    def block_to_canonical(self, get, s, i):
        p, hf = f"blocks.{i}", f"gpt_neox.layers.{i}"
        h, dh, d = s.n_heads, s.d_head, s.d_model
        w = get(f"{hf}.attention.query_key_value.weight").reshape(h, 3, dh, d)  # (h, [q|k|v], dh, d)
        b = get(f"{hf}.attention.query_key_value.bias", None)
        b = torch.zeros(h, 3, dh, dtype=torch.float64) if b is None else b.reshape(h, 3, dh)
        q, k, v = (w[:, j].reshape(h * dh, d) for j in range(3))
        bq, bk, bv = (b[:, j].reshape(h * dh) for j in range(3))
        ln1 = (get(f"{hf}.input_layernorm.weight"), get(f"{hf}.input_layernorm.bias"))
        q, k, v, bq, bk, bv = fold_attention(q, k, v, bq, bk, bv, *ln1)
        out = attention_to_canonical(p, s, q, k, v, get(f"{hf}.attention.dense.weight"), bq, bk, bv,
                                     get(f"{hf}.attention.dense.bias", None))
        ln2 = (get(f"{hf}.post_attention_layernorm.weight"), get(f"{hf}.post_attention_layernorm.bias"))
        w_in, b_in = fold_norm(get(f"{hf}.mlp.dense_h_to_4h.weight"), get(f"{hf}.mlp.dense_h_to_4h.bias"), *ln2)
        out.update({f"{p}.mlp.W_in": w_in, f"{p}.mlp.b_in": b_in, f"{p}.mlp.W_out": get(f"{hf}.mlp.dense_4h_to_h.weight"),
                    f"{p}.mlp.b_out": get(f"{hf}.mlp.dense_4h_to_h.bias")})
        return make_mean_free(out, s)

    def final_to_canonical(self, get, s):
        w_u = head_weight(get, "gpt_neox.embed_in.weight")
        ln = (get("gpt_neox.final_layer_norm.weight"), get("gpt_neox.final_layer_norm.bias"))
        return final_norm_to_canonical(w_u, None, *ln, s.eps)

    def ends_from_canonical(self, params, s):
        return {"gpt_neox.embed_in.weight": params["embed.W_E"],
                "gpt_neox.final_layer_norm.weight": torch.ones(s.d_model, dtype=torch.float64),
                "gpt_neox.final_layer_norm.bias": params["final.b_norm"], "lm_head.weight": params["head.W_U"]}

    def block_from_canonical(self, params, s, i):
        ones, zeros = torch.ones(s.d_model, dtype=torch.float64), torch.zeros(s.d_model, dtype=torch.float64)
        h, dh, d = s.n_heads, s.d_head, s.d_model
        p, hf = f"blocks.{i}", f"gpt_neox.layers.{i}"
        q, k, v, o, bq, bk, bv, bo = attention_from_canonical(p, params)
        w = torch.stack([t.reshape(h, dh, d) for t in (q, k, v)], 1).reshape(3 * h * dh, d)  # per-head fused
        b = torch.stack([t.reshape(h, dh) for t in (bq, bk, bv)], 1).reshape(3 * h * dh)
        return {
            f"{hf}.input_layernorm.weight": ones, f"{hf}.input_layernorm.bias": zeros,
            f"{hf}.post_attention_layernorm.weight": ones, f"{hf}.post_attention_layernorm.bias": zeros,
            f"{hf}.attention.query_key_value.weight": w, f"{hf}.attention.query_key_value.bias": b,
            f"{hf}.attention.dense.weight": o, f"{hf}.attention.dense.bias": bo,
            f"{hf}.mlp.dense_h_to_4h.weight": params[f"{p}.mlp.W_in"], f"{hf}.mlp.dense_h_to_4h.bias": params[f"{p}.mlp.b_in"],
            f"{hf}.mlp.dense_4h_to_h.weight": params[f"{p}.mlp.W_out"], f"{hf}.mlp.dense_4h_to_h.bias": params[f"{p}.mlp.b_out"],
        }

    def export_config(self, config, s, params):
        config = super().export_config(config, s, params)
        config.layer_norm_eps = float(params["norm.eps"])
        # folding the LayerNorm bias gives q, k, v biases even where the source had none
        config.attention_bias = bool(config.attention_bias) or any_attention_bias(params, s)
        return config
