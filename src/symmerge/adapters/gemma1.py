"""Gemma (1) (`GemmaForCausalLM`): Llama's blocks with `1 + w` norm weights, GeGLU and a scaled embedding.

A block computes `x += attn(n_in(x))`, then `x += mlp(n_post(x))`, as Llama's does; every norm is an RMSNorm with
weight `1 + w` (`w` stored, 0 at initialisation; the product in float32), and the model reads
`sqrt(d_model) · E[token]`, a constant of the class that commutes with every linear map of the stream (`embed.W_E`
is E as stored). The MLP is GeGLU (`gelu_tanh(gate) * up`), which has the GLU scale of any gated MLP.

Canonical tensors are Llama's, read and written by Llama's adapter: each norm's `γ = 1 + w` (`norm_offset`)
folds into its readers (q, k, v; gate, up; the head), and the export writes unit norms as `w = 0`. The group is
Llama's: the full orthogonal map and a scale on the residual stream, heads within their key-value groups, FFN
units, GLU scales, OV maps, and QK maps that scale and turn each rotary pair. Embeddings are tied in the
checkpoints; the export unties the head where the final norm's weight, folded into it, makes it differ from the
embedding.
"""

from __future__ import annotations

from .llama import LlamaAdapter


class Gemma1Adapter(LlamaAdapter):
    name = "gemma1"
    hf_classes = ("GemmaForCausalLM",)
    #: the stock norms multiply by 1 + w: canonical γ = w + 1, exported w = γ - 1 (unit weight: w = 0)
    norm_offset = 1.0

    def embed_scale(self, config, s):
        """sqrt(d_model): the stock model's `normalizer`, which it rounds to the embedding's dtype (so in bfloat16 an
        expansion's first block reads the narrow one's input to that dtype's rounding)."""
        return s.d_model ** 0.5
