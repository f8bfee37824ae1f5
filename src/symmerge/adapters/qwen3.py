"""Qwen3 (`Qwen3ForCausalLM`): the Llama layout plus QK-norm, an RMSNorm on each head's q and k over d_head.

`q = rope(γ_q ⊙ rms(W_Q x))`, likewise k, with one weight vector γ_q (γ_k) of length d_head shared by
all heads and the config's `rms_norm_eps`. The weights sit after the normalisation and before RoPE,
so they cannot be folded into W_Q or W_K: they are canonical tensors of their own (`attn.g_Q`,
`attn.g_K`, `[d_head]`, read and written by `llama.qk_norm_to_canonical` for a shape with `qk_norm`), which
no group moves. What is left of the QK map (`spec._qk_note`, `kinds.PairSigns`): a sign per rotary pair. The
residual rotation, FFN permutation, GLU scale, head permutations and OV maps are Llama's; the residual scale
also scales q and k, whose norms read the same eps. `head_dim` is read from the config (it need not be
hidden_size / num_heads).
"""

from __future__ import annotations

from .llama import LlamaAdapter


class Qwen3Adapter(LlamaAdapter):
    name = "qwen3"
    hf_classes = ("Qwen3ForCausalLM",)
    qk_norm = "head"
