"""Mixtures of experts in the Llama layout: Mixtral (`MixtralForCausalLM`), OLMoE (`OlmoeForCausalLM`), Qwen2-MoE
(`Qwen2MoeForCausalLM`), Qwen3-MoE (`Qwen3MoeForCausalLM`) and Granite MoE (`GraniteMoeForCausalLM`), each block's
MLP replaced by a sparse mixture of experts.

transformers holds each layer's experts as two stacked tensors, `mlp.experts.gate_up_proj [E, 2 d_mlp, d_model]`
(the gate's rows, then the up projection's: `gate, up = linear(x, gate_up_proj[e]).chunk(2)`) and
`mlp.experts.down_proj [E, d_model, d_mlp]`, with the router `mlp.gate.weight [E, d_model]` (a reader of the
post-attention norm, its softmax computed in float32 whatever the weights' dtype). Stock `save_pretrained` writes
the experts one at a time, under each family's original names (`Adapter.expert_parts`: Mixtral's `w1` gate, `w3`
up, `w2` down under `block_sparse_moe`; OLMoE's and Qwen3-MoE's `gate_proj`, `up_proj`, `down_proj`), which is
what is read (`stored.py`) and written (`Adapter.saved`); the stacked names are read too.

Qwen2-MoE adds a shared expert to every mixture: `mlp.shared_expert.{gate,up,down}_proj` (a gated MLP every token
takes) and `mlp.shared_expert_gate` (`[1, d_model]`, the sigmoid of which scales its output), read as the canonical
`W_shared_*` tensors of `spec_experts.py`, the post-attention norm folded into its readers as into the router's.

`MixtureOfExperts` replaces a Llama-layout adapter's MLP part and nothing else, so the attention is the family's
own: Llama's (Mixtral; Qwen2-MoE, with Qwen2's q/k/v biases), QK-norm over the whole projection as OLMo-2's but with
pre-norms (OLMoE), QK-norm per head as Qwen3's (Qwen3-MoE); the QK-norm restricts the QK maps exactly as in the
dense family. The expert group
(`spec_experts.py`): Llama's, with the FFN permutation and GLU scale batched over the experts, and an expert
permutation per layer that moves each expert with its router row. Whether the top-k weights are renormalised
(`norm_topk_prob`: Qwen3-MoE yes, OLMoE no, Qwen2-MoE as configured) does not matter to it: both follow a relabelling. Activation matching
hooks the mixture's input and runs every expert on it (`match/activation_experts.py`).
"""

from __future__ import annotations

import dataclasses

import torch

from ..algebra.shape import ModelShape
from .base import HookPoints
from .granite import GraniteAdapter
from .llama import DECODER_HOOKS, LlamaAdapter
from .qwen3 import Qwen3Adapter


def moe_to_canonical(i: int, router, gate, up, down, gamma) -> dict[str, torch.Tensor]:
    """Canonical expert tensors of block i from stock router `[E, d]`, gate and up `[E, d_mlp, d]`, down
    `[E, d, d_mlp]`, the norm they read (weight `gamma`) folded into the readers."""
    p = f"blocks.{i}.moe"
    return {f"{p}.W_router": router * gamma, f"{p}.W_gate": gate * gamma, f"{p}.W_in": up * gamma, f"{p}.W_out": down}


#: a shared expert's stock tensors (under `model.layers.i.mlp.`) by canonical name (under `blocks.i.moe.`)
SHARED = {"W_shared_router": "shared_expert_gate", "W_shared_gate": "shared_expert.gate_proj",
          "W_shared_in": "shared_expert.up_proj", "W_shared_out": "shared_expert.down_proj"}


def stepped_shape(s: ModelShape, c) -> ModelShape:
    """`s` with the dense layers of a Qwen-style mixture: layer i is sparse unless it is in `mlp_only_layers` or
    `(i + 1) % decoder_sparse_step` is not 0 (or there are no experts), as the stock decoder layer decides; the dense
    layers hold a gated MLP of width `intermediate_size`, and with no mixture anywhere the model is dense."""
    dense = tuple(i for i in range(c.num_hidden_layers) if i in (c.mlp_only_layers or []) or not c.num_experts
                  or (i + 1) % c.decoder_sparse_step)
    if len(dense) == c.num_hidden_layers:  # no mixture anywhere: dense MLPs
        return dataclasses.replace(s, n_experts=0, experts_per_token=0, d_mlp=c.intermediate_size, d_shared=0)
    return dataclasses.replace(s, dense_layers=dense, d_mlp_dense=c.intermediate_size if dense else 0)


class MixtureOfExperts:
    """A Llama-layout adapter's MLP part replaced by a sparse mixture of experts (mix in before the adapter)."""

    hooks: HookPoints = dataclasses.replace(DECODER_HOOKS, moe_input="model.layers.{i}.mlp")
    expert_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
    #: the config keys of the number of experts and of each expert's width
    n_experts_key, d_mlp_key = "num_experts", "intermediate_size"
    #: the mixture's module under `model.layers.{i}` and its router's module under the mixture (the class's own names)
    moe, router = "mlp", "gate"
    #: whether the stock mixture holds a shared expert (`SHARED`) in every sparse layer, whatever its width: at width
    #: 0 (`shared_expert_intermediate_size=0`) its projections are empty and it adds nothing, but a stock checkpoint
    #: still stores them
    shared_expert = False

    def shape(self, c) -> ModelShape:
        return dataclasses.replace(super().shape(c), n_experts=getattr(c, self.n_experts_key),
                                   experts_per_token=c.num_experts_per_tok, d_mlp=getattr(c, self.d_mlp_key))

    def mlp_to_canonical(self, get, s, i):
        if not s.experts_in(i):  # a dense layer of a mixture (Qwen3-MoE's mlp_only_layers): the family's MLP
            return super().mlp_to_canonical(get, s, i)
        hf, m = f"model.layers.{i}", f"model.layers.{i}.{self.moe}"
        gamma = self._gamma(get, f"{hf}.post_attention_layernorm")
        gate_up = get(f"{m}.experts.gate_up_proj")  # [E, 2 d_mlp, d]: gate rows, then up rows
        out = moe_to_canonical(i, get(f"{m}.{self.router}.weight"), gate_up[:, : s.d_mlp], gate_up[:, s.d_mlp:],
                               get(f"{m}.experts.down_proj"), gamma)
        if s.d_shared:  # the readers (all but the down projection) take the norm's weight
            out.update({f"blocks.{i}.moe.{c}": get(f"{hf}.mlp.{n}.weight") * (1 if c == "W_shared_out" else gamma)
                        for c, n in SHARED.items()})
        return out

    def mlp_from_canonical(self, params, s, i):
        if not s.experts_in(i):
            return super().mlp_from_canonical(params, s, i)
        hf, p = f"model.layers.{i}", f"blocks.{i}.moe"
        shared = {f"{hf}.mlp.{n}.weight": params[f"{p}.{c}"] for c, n in SHARED.items()} if s.d_shared else {}
        if self.shared_expert and not s.d_shared:  # the empty shared expert: zero-width projections, a zero gate
            like = params[f"{p}.W_router"]
            shared = {f"{hf}.mlp.{n}.weight": like.new_zeros((1, s.d_model) if c == "W_shared_router" else
                                                             (s.d_model, 0) if c == "W_shared_out" else (0, s.d_model))
                      for c, n in SHARED.items()}
        m = f"{hf}.{self.moe}"
        return shared | {f"{m}.{self.router}.weight": params[f"{p}.W_router"],
                         f"{m}.experts.gate_up_proj": torch.cat([params[f"{p}.W_gate"], params[f"{p}.W_in"]], dim=1),
                         f"{m}.experts.down_proj": params[f"{p}.W_out"]}


class MixtralAdapter(MixtureOfExperts, LlamaAdapter):
    name = "mixtral"
    hf_classes = ("MixtralForCausalLM",)
    renames = ((r"\.block_sparse_moe\.", ".mlp."),)  # stock save_pretrained writes the original names
    save_renames = ((r"\.mlp\.", ".block_sparse_moe."),)
    expert_parts = {"gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)}
    n_experts_key = "num_local_experts"
    function_keys = ("sliding_window", "router_jitter_noise")


class GraniteMoeAdapter(MixtureOfExperts, GraniteAdapter):
    """Granite's multipliers (`granite.py`) with a mixture of experts under `block_sparse_moe`: its router takes the
    top k of the logits and a softmax over them (a relabelling moves both alike), and stock checkpoints store every
    layer's experts stacked, under `input_linear` (gate rows, then up rows), `output_linear` and `router.layer`."""

    name = "granitemoe"
    hf_classes = ("GraniteMoeForCausalLM",)
    hooks = dataclasses.replace(DECODER_HOOKS, moe_input="model.layers.{i}.block_sparse_moe")
    moe, router = "block_sparse_moe", "router"
    n_experts_key = "num_local_experts"
    expert_parts = {}  # stored stacked, as the class holds them
    renames = ((r"\.block_sparse_moe\.input_linear\.weight$", ".block_sparse_moe.experts.gate_up_proj"),
               (r"\.block_sparse_moe\.output_linear\.weight$", ".block_sparse_moe.experts.down_proj"),
               (r"\.block_sparse_moe\.router\.layer\.weight$", ".block_sparse_moe.router.weight"))
    save_renames = ((r"\.block_sparse_moe\.experts\.gate_up_proj$", ".block_sparse_moe.input_linear.weight"),
                    (r"\.block_sparse_moe\.experts\.down_proj$", ".block_sparse_moe.output_linear.weight"),
                    (r"\.block_sparse_moe\.router\.weight$", ".block_sparse_moe.router.layer.weight"))


class OlmoeAdapter(MixtureOfExperts, LlamaAdapter):
    """OLMoE: pre-norms, and QK-norm over the whole projection (a weight per entry, as OLMo-2's), then `clip_qkv`."""

    name = "olmoe"
    hf_classes = ("OlmoeForCausalLM",)
    function_keys = ("norm_topk_prob",)
    qk_norm = "projection"


class Qwen3MoeAdapter(MixtureOfExperts, Qwen3Adapter):
    """Qwen3-MoE: Qwen3's QK-norm per head; experts of width `moe_intermediate_size` in the sparse layers, a dense
    gated MLP of width `intermediate_size` in the others (`stepped_shape`)."""

    name = "qwen3_moe"
    hf_classes = ("Qwen3MoeForCausalLM",)
    d_mlp_key = "moe_intermediate_size"
    function_keys = (*LlamaAdapter.function_keys, "norm_topk_prob")

    def shape(self, c) -> ModelShape:
        return stepped_shape(super().shape(c), c)


class Qwen2MoeAdapter(MixtureOfExperts, LlamaAdapter):
    """Qwen2-MoE: Qwen2's attention (q/k/v biases, `qkv_bias`); in the sparse layers experts of width
    `moe_intermediate_size` and a shared expert of width `shared_expert_intermediate_size`, a dense gated MLP of
    width `intermediate_size` in the others (`stepped_shape`)."""

    name = "qwen2_moe"
    hf_classes = ("Qwen2MoeForCausalLM",)
    shared_expert = True
    d_mlp_key = "moe_intermediate_size"
    function_keys = (*LlamaAdapter.function_keys, "norm_topk_prob")

    def shape(self, c) -> ModelShape:
        s = dataclasses.replace(super().shape(c), d_shared=c.shared_expert_intermediate_size)
        return stepped_shape(s, c)
