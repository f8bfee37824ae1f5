"""Mixtral (`MixtralForCausalLM`): the Llama layout (RMSNorm, RoPE, GQA) with a sparse mixture of experts
in place of the MLP.

Each layer's MLP is `mlp.gate` (the router, `[E, d_model]`, a reader of the post-attention norm) and
`mlp.experts` with two fused tensors: `gate_up_proj [E, 2 d_mlp, d_model]` (the gate's rows, then the
up projection's: `gate, up = linear(x, gate_up_proj[e]).chunk(2)`) and `down_proj [E, d_model, d_mlp]`.
Stock `save_pretrained` writes them one expert at a time under Mixtral's original names
(`block_sparse_moe.experts.{j}.w1` gate, `w3` up, `w2` down, `block_sparse_moe.gate`), which is what is
read (`stored.py`) and written (`Adapter.saved`); the fused names are read too.

The post-attention norm's weight folds into the router and into every expert's gate and up; the router
computes its softmax in float32 whatever the weights' dtype. The group (`spec_experts.py`): Llama's,
with the FFN permutation and GLU scale batched over the experts, and an expert permutation per layer that
moves each expert with its router row. Activation matching is refused (no hidden vector per expert to hook).
"""

from __future__ import annotations

import dataclasses

import torch

from ..shape import ModelShape
from .base import HookPoints
from .llama import (
    DECODER_HOOKS,
    LlamaAdapter,
    _decoder_shape,
    decoder_attention_from_canonical,
    decoder_attention_to_canonical,
    decoder_ends_from_canonical,
)


def moe_to_canonical(i: int, router, gate, up, down, gamma) -> dict[str, torch.Tensor]:
    """Canonical expert tensors of block i from stock router `[E, d]`, gate and up `[E, d_mlp, d]`, down
    `[E, d, d_mlp]`, the norm they read (weight `gamma`) folded into the readers."""
    p = f"blocks.{i}.moe"
    return {f"{p}.W_router": router * gamma, f"{p}.W_gate": gate * gamma, f"{p}.W_in": up * gamma, f"{p}.W_out": down}


class MixtralAdapter(LlamaAdapter):
    name = "mixtral"
    hf_classes = ("MixtralForCausalLM",)
    hooks: HookPoints = dataclasses.replace(DECODER_HOOKS, ffn_hidden="model.layers.{i}.mlp.experts")
    renames = ((r"\.block_sparse_moe\.", ".mlp."),)  # stock save_pretrained writes the original names
    save_renames = ((r"\.mlp\.", ".block_sparse_moe."),)
    expert_parts = {"gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)}
    function_keys = ("sliding_window", "router_jitter_noise")

    def shape(self, c) -> ModelShape:
        s = _decoder_shape(self, c, "MixtralForCausalLM", "rmsnorm", True)
        return dataclasses.replace(s, n_experts=c.num_local_experts, experts_per_token=c.num_experts_per_tok)

    def block_to_canonical(self, get, s, i):
        hf = f"model.layers.{i}"
        out = decoder_attention_to_canonical(get, s, i, (get(f"{hf}.input_layernorm.weight"), None))
        gate_up = get(f"{hf}.mlp.experts.gate_up_proj")  # [E, 2 d_mlp, d]: gate rows, then up rows
        out.update(moe_to_canonical(i, get(f"{hf}.mlp.gate.weight"), gate_up[:, : s.d_mlp], gate_up[:, s.d_mlp:],
                                    get(f"{hf}.mlp.experts.down_proj"), get(f"{hf}.post_attention_layernorm.weight")))
        return out

    def ends_from_canonical(self, params, s):
        return decoder_ends_from_canonical(params, s, norm_weights=True)

    def block_from_canonical(self, params, s, i):
        hf, p = f"model.layers.{i}", f"blocks.{i}.moe"
        sd = decoder_attention_from_canonical(params, i, True, s.d_model)
        sd[f"{hf}.mlp.gate.weight"] = params[f"{p}.W_router"]
        sd[f"{hf}.mlp.experts.gate_up_proj"] = torch.cat([params[f"{p}.W_gate"], params[f"{p}.W_in"]], dim=1)
        sd[f"{hf}.mlp.experts.down_proj"] = params[f"{p}.W_out"]
        return sd
