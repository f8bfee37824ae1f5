"""GPT-2 (`GPT2LMHeadModel`): Conv1D weights, fused `c_attn`, learned positions, tied embeddings.

Conv1D stores weights as `[in, out]` (`y = x W + b`), the transpose of nn.Linear: we transpose on
the way in and out. `c_attn` holds q, k and v side by side along its output axis, each `[n_heads,
d_head]`. LayerNorm: writers are made mean-free and the residual rotation must fix the all-ones
vector. The LM head has no bias, so the final LayerNorm's bias survives as `final.b_norm`.
"""

from __future__ import annotations

import torch

from ..algebra.canonical import fold_norm
from ..algebra.shape import ModelShape
from .base import (
    Adapter,
    HookPoints,
    attention_from_canonical,
    attention_to_canonical,
    final_norm_to_canonical,
    fold_attention,
    head_weight,
    make_mean_free,
    require,
)


class GPT2Adapter(Adapter):
    name = "gpt2"
    hf_classes = ("GPT2LMHeadModel",)
    # checkpoints saved from GPT2Model (as the original release) have no "transformer." prefix
    renames = ((r"^(?!transformer\.|lm_head\.)", "transformer."),)
    hooks = HookPoints(norms=("transformer.h.{i}.ln_1", "transformer.h.{i}.ln_2"), attn_norm="transformer.h.{i}.ln_1",
                       final_norm="transformer.ln_f", ffn_hidden="transformer.h.{i}.mlp.c_proj",
                       block="transformer.h.{i}", attention="transformer.h.{i}.attn")
    function_keys = ("scale_attn_by_inverse_layer_idx",)

    def score_scale(self, config, s) -> float:
        """`scale_attn_weights=False` leaves the scores unscaled."""
        return s.d_head ** -0.5 if config.scale_attn_weights else 1.0

    def shape(self, c) -> ModelShape:
        d, h = c.n_embd, c.n_head
        require(d % h == 0, f"n_embd={d} is not divisible by n_head={h}")
        return ModelShape(
            arch=self.name, hf_class="GPT2LMHeadModel", d_model=d, n_layers=c.n_layer, n_heads=h, n_kv_heads=h,
            d_head=d // h, d_mlp=c.n_inner or 4 * d, vocab=c.vocab_size, norm="layernorm", gated=False,
            parallel=False, rotary_dims=0, rotary_layout="none", tied=bool(c.tie_word_embeddings),
            eps=float(c.layer_norm_epsilon), eps_in_config=True, activation=c.activation_function,
            n_positions=c.n_positions,
        )

    def embed_to_canonical(self, get, s):
        return make_mean_free({"embed.W_E": get("transformer.wte.weight"), "embed.W_pos": get("transformer.wpe.weight")}, s)

    def block_to_canonical(self, get, s, i):
        p, hf = f"blocks.{i}", f"transformer.h.{i}"
        w = get(f"{hf}.attn.c_attn.weight").T  # (3d, d): Conv1D -> nn.Linear
        b = get(f"{hf}.attn.c_attn.bias")
        q, k, v = w.chunk(3, 0)
        bq, bk, bv = b.chunk(3, 0)
        q, k, v, bq, bk, bv = fold_attention(q, k, v, bq, bk, bv, get(f"{hf}.ln_1.weight"), get(f"{hf}.ln_1.bias"))
        out = attention_to_canonical(p, s, q, k, v, get(f"{hf}.attn.c_proj.weight").T, bq, bk, bv, get(f"{hf}.attn.c_proj.bias"))
        w_in, b_in = fold_norm(get(f"{hf}.mlp.c_fc.weight").T, get(f"{hf}.mlp.c_fc.bias"), get(f"{hf}.ln_2.weight"), get(f"{hf}.ln_2.bias"))
        out.update({f"{p}.mlp.W_in": w_in, f"{p}.mlp.b_in": b_in,
                    f"{p}.mlp.W_out": get(f"{hf}.mlp.c_proj.weight").T, f"{p}.mlp.b_out": get(f"{hf}.mlp.c_proj.bias")})
        return make_mean_free(out, s)

    def final_to_canonical(self, get, s):
        w_u = head_weight(get, "transformer.wte.weight")
        return final_norm_to_canonical(w_u, None, get("transformer.ln_f.weight"), get("transformer.ln_f.bias"), s.eps)

    def ends_from_canonical(self, params, s):
        return {"transformer.wte.weight": params["embed.W_E"], "transformer.wpe.weight": params["embed.W_pos"],
                "transformer.ln_f.weight": torch.ones(s.d_model, dtype=torch.float64),
                "transformer.ln_f.bias": params["final.b_norm"], "lm_head.weight": params["head.W_U"]}

    def block_from_canonical(self, params, s, i):
        ones, zeros = torch.ones(s.d_model, dtype=torch.float64), torch.zeros(s.d_model, dtype=torch.float64)
        p, hf = f"blocks.{i}", f"transformer.h.{i}"
        q, k, v, o, bq, bk, bv, bo = attention_from_canonical(p, params)
        return {
            f"{hf}.ln_1.weight": ones, f"{hf}.ln_1.bias": zeros, f"{hf}.ln_2.weight": ones, f"{hf}.ln_2.bias": zeros,
            f"{hf}.attn.c_attn.weight": torch.cat([q, k, v], 0).T, f"{hf}.attn.c_attn.bias": torch.cat([bq, bk, bv]),
            f"{hf}.attn.c_proj.weight": o.T, f"{hf}.attn.c_proj.bias": bo,
            f"{hf}.mlp.c_fc.weight": params[f"{p}.mlp.W_in"].T, f"{hf}.mlp.c_fc.bias": params[f"{p}.mlp.b_in"],
            f"{hf}.mlp.c_proj.weight": params[f"{p}.mlp.W_out"].T, f"{hf}.mlp.c_proj.bias": params[f"{p}.mlp.b_out"],
        }

    def export_config(self, config, s, params):
        config = super().export_config(config, s, params)
        config.layer_norm_epsilon = float(params["norm.eps"])
        return config
