"""OLMo-1 (`OlmoForCausalLM`): LayerNorm without parameters, SwiGLU, RoPE, optional `clip_qkv`.

The norm has no weight or bias, so nothing is folded; it centres, so writers are made mean-free and
the residual rotation fixes the all-ones vector. Its eps is hard-coded (1e-5, computed in float32),
so the residual scale is not an exact symmetry and is left out of the group. With `clip_qkv`, q, k and
v are clamped elementwise: only signed permutations of the head dimensions commute with the clamp
(on rotary pairs: quarter turns), so the QK and OV maps shrink to those.
"""

from __future__ import annotations

from ..algebra.shape import ModelShape
from .base import Adapter, head_weight, make_mean_free
from .llama import DECODER_HOOKS, _decoder_shape, decoder_block_from_canonical, decoder_block_to_canonical, decoder_ends_from_canonical


class OlmoAdapter(Adapter):
    name = "olmo"
    hf_classes = ("OlmoForCausalLM",)
    hooks = DECODER_HOOKS

    def shape(self, c) -> ModelShape:
        return _decoder_shape(self, c, "OlmoForCausalLM", "layernorm", eps_in_config=False)

    def embed_to_canonical(self, get, s):
        return make_mean_free({"embed.W_E": get("model.embed_tokens.weight")}, s)

    def block_to_canonical(self, get, s, i):
        return make_mean_free(decoder_block_to_canonical(get, s, i, (1.0, None), (1.0, None)), s)

    def final_to_canonical(self, get, s):
        return {"head.W_U": head_weight(get, "model.embed_tokens.weight")}

    def ends_from_canonical(self, params, s):
        return decoder_ends_from_canonical(params, s, norm_weights=False)

    def block_from_canonical(self, params, s, i):
        return decoder_block_from_canonical(params, s, i, norm_weights=False)
