"""Granite (`GraniteForCausalLM`, IBM's Granite 3): Llama's blocks and tensor names, with four constants of the config.

The stock forward multiplies each token's embedding by `embedding_multiplier`, each sublayer's output by
`residual_multiplier` before adding it to the stream, the scores `q . k` by `attention_multiplier` (in place of
`1/sqrt(d_head)`), and divides the logits by `logits_scaling`. Each is a scalar on a whole tensor, so every map
of Llama's group commutes with it: the group is Llama's. All four are function keys (two checkpoints aligned or
merged must share them), and `expand` reads the embedding and score constants from the config
(`embed_scale`, `score_scale`), where Llama's depend on the widths.
"""

from __future__ import annotations

from .llama import LlamaAdapter


class GraniteAdapter(LlamaAdapter):
    name = "granite"
    hf_classes = ("GraniteForCausalLM",)
    function_keys = LlamaAdapter.function_keys + ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                                                  "logits_scaling")

    def score_scale(self, config, s):
        return float(config.attention_multiplier)

    def embed_scale(self, config, s):
        return float(config.embedding_multiplier)
