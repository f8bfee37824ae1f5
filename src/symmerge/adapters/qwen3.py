"""Qwen3 (`Qwen3ForCausalLM`): the Llama layout plus QK-norm, an RMSNorm on each head's q and k over d_head.

`q = rope(γ_q ⊙ rms(W_Q x))`, likewise k, with one weight vector γ_q (γ_k) of length d_head shared by
all heads and the config's `rms_norm_eps`. The weights sit after the normalisation and before RoPE,
so they cannot be folded into W_Q or W_K: they are canonical tensors of their own (`attn.g_Q`,
`attn.g_K`, `[d_head]`), which no group moves. What is left of the QK map (`spec._qk_note`,
`kinds.PairSigns`): a sign per rotary pair. The residual rotation, FFN permutation, GLU scale, head
permutations and OV maps are Llama's; the residual scale also scales q and k, whose norms read the
same eps. `head_dim` is read from the config (it need not be hidden_size / num_heads).
"""

from __future__ import annotations

import dataclasses

from .llama import LlamaAdapter, _decoder_shape, decoder_block_from_canonical


class Qwen3Adapter(LlamaAdapter):
    name = "qwen3"
    hf_classes = ("Qwen3ForCausalLM",)

    def shape(self, c):
        return dataclasses.replace(_decoder_shape(self, c, "Qwen3ForCausalLM", "rmsnorm", True), qk_norm="head")

    def block_to_canonical(self, get, s, i):
        hf = f"model.layers.{i}.self_attn"
        return {**super().block_to_canonical(get, s, i),
                f"blocks.{i}.attn.g_Q": get(f"{hf}.q_norm.weight"), f"blocks.{i}.attn.g_K": get(f"{hf}.k_norm.weight")}

    def block_from_canonical(self, params, s, i):
        hf, p = f"model.layers.{i}.self_attn", f"blocks.{i}.attn"
        return {**decoder_block_from_canonical(params, s, i, norm_weights=True),
                f"{hf}.q_norm.weight": params[f"{p}.g_Q"], f"{hf}.k_norm.weight": params[f"{p}.g_K"]}
