"""OLMo-2 (`Olmo2ForCausalLM`) and OLMo-3 (`Olmo3ForCausalLM`): post-norms, QK-norm over the whole projection,
SwiGLU, RoPE, GQA; EXAONE 4 (`Exaone4ForCausalLM`): the same blocks with a QK-norm per head.

A block computes `x += γ_a ⊙ rms(attn(x))`, then `x += γ_m ⊙ rms(mlp(x))`: q, k, v, gate and up read
the raw stream (nothing to fold), and each sublayer's output is normalised before it is added. The
final norm reads the stream as in Llama and folds into the head. QK-norm: `q = rope(view(γ_q ⊙
rms(W_Q x)))` with one RMS over all heads and a weight per entry (`[n_heads * d_head]`), likewise k.

Canonical tensors beyond Llama's: `attn.g_post`, `mlp.g_post` (`[d_model]`, the post-norm weights),
`attn.g_Q` (`[n_kv, q_per_kv, d_head]`) and `attn.g_K` (`[n_kv, d_head]`). The group (`spec.py`): the
residual map is a signed permutation (post-norm weights permuted along), no residual scale, a sign per
rotary pair for the QK map (the QK-norm weights move with their heads); head and FFN permutations, GLU
scales and OV maps as in Llama. No norm reads the stream before the readers: activation matching reads
the stream where the attention and the MLP take it in (`HookPoints.reads_inputs`).
"""

from __future__ import annotations

import dataclasses

from .base import HookPoints
from .llama import (
    LlamaAdapter,
    decoder_block_from_canonical,
    decoder_block_to_canonical,
    decoder_ends_from_canonical,
    qk_norm_from_canonical,
    qk_norm_to_canonical,
)

POST = (("attn", "post_attention_layernorm"), ("mlp", "post_feedforward_layernorm"))


class Olmo2Adapter(LlamaAdapter):
    name = "olmo2"
    hf_classes = ("Olmo2ForCausalLM",)
    hooks = HookPoints(norms=("model.layers.{i}.self_attn", "model.layers.{i}.mlp"), attn_norm="model.layers.{i}.self_attn",
                       final_norm="model.norm", ffn_hidden="model.layers.{i}.mlp.down_proj", block="model.layers.{i}",
                       attention="model.layers.{i}.self_attn", reads_inputs=True)
    function_keys = ()
    qk_norm = "projection"

    def shape(self, c):
        return dataclasses.replace(super().shape(c), post_norm=True, pre_norms=False)

    def block_to_canonical(self, get, s, i):
        hf, p = f"model.layers.{i}", f"blocks.{i}"
        out = {**decoder_block_to_canonical(get, s, i, (1.0, None), (1.0, None)), **qk_norm_to_canonical(get, s, i)}
        out.update({f"{p}.{part}.g_post": get(f"{hf}.{norm}.weight") for part, norm in POST})
        return out

    def ends_from_canonical(self, params, s):
        return decoder_ends_from_canonical(params, s, norm_weights=True)

    def block_from_canonical(self, params, s, i):
        hf, p = f"model.layers.{i}", f"blocks.{i}"
        sd = {**decoder_block_from_canonical(params, s, i, norm_weights=False), **qk_norm_from_canonical(params, s, i)}
        sd.update({f"{hf}.{norm}.weight": params[f"{p}.{part}.g_post"] for part, norm in POST})
        return sd


class Olmo3Adapter(Olmo2Adapter):
    """OLMo-3: OLMo-2's blocks and tensor names, with sliding-window attention in some layers (`layer_types`)
    and RoPE parameters per layer type. Neither touches the group: a window masks positions, and every layer
    type rotates the same pairs (`Adapter.rotary_frequencies` places them by the full-attention layers')."""

    name = "olmo3"
    hf_classes = ("Olmo3ForCausalLM",)
    function_keys = ("sliding_window", "layer_types", "rope_parameters")


class Exaone4Adapter(Olmo3Adapter):
    """EXAONE 4: OLMo-2's blocks and tensor names with Qwen3's QK-norm (per head, one weight of length d_head), sliding-
    window layers with RoPE and full-attention layers without it (`sliding_window_pattern`, `layer_types`).

    The QK maps are RoPE's under a per-head QK-norm on every layer: a sign per rotary pair. On the layers without
    RoPE the exact group allows a sign per dimension, of which that is a subgroup."""

    name = "exaone4"
    hf_classes = ("Exaone4ForCausalLM",)
    function_keys = ("sliding_window", "sliding_window_pattern", "layer_types", "rope_parameters")
    qk_norm = "head"

    def nope_layers(self, config) -> list[int]:
        """With a sliding window, the stock attention rotates only its sliding layers; without one, every layer."""
        if getattr(config, "sliding_window", None) is None:
            return []
        return [i for i, kind in enumerate(config.layer_types) if kind != "sliding_attention"]
