"""Llama family (`LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`, `SeedOssForCausalLM`...): RMSNorm,
SwiGLU, RoPE, GQA.

RMSNorm does not centre, so the full O(d) acts on the residual stream and writers are left as they
are; its weight folds into q, k, v (input norm), gate and up (post-attention norm) and the LM head
(final norm). GQA: query head h uses KV head h // q_per_kv (HF's `repeat_kv`), so a KV head and its
query heads move together and share their QK and OV maps. RoPE is `rotate_half` over the whole head.
Biases: Llama's `attention_bias`/`mlp_bias` config flags, Qwen2's fixed q/k/v biases, Seed-OSS's separate
`attention_bias` (q, k, v) and `attention_out_bias` (o); whatever the
checkpoint holds is read, and the export writes exactly the tensors the HF class expects.
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
    class_names,
    final_norm_to_canonical,
    head_weight,
    require,
    rotary_dims,
)

#: activation hook points of the Llama-layout decoders (Llama, Mistral, Qwen2, OLMo)
DECODER_HOOKS = HookPoints(norms=("model.layers.{i}.input_layernorm", "model.layers.{i}.post_attention_layernorm"),
                           attn_norm="model.layers.{i}.input_layernorm", final_norm="model.norm",
                           ffn_hidden="model.layers.{i}.mlp.down_proj", block="model.layers.{i}",
                           attention="model.layers.{i}.self_attn")


def _decoder_shape(adapter: Adapter, c, hf_class: str, norm: str, eps_in_config: bool, qk_norm: str = "") -> ModelShape:
    d, h = c.hidden_size, c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or h
    dh = getattr(c, "head_dim", None) or d // h
    require(h % kv == 0, f"num_attention_heads={h} is not a multiple of num_key_value_heads={kv}")
    return ModelShape(
        arch=adapter.name, hf_class=hf_class, d_model=d, n_layers=c.num_hidden_layers, n_heads=h, n_kv_heads=kv,
        d_head=dh, d_mlp=c.intermediate_size, vocab=c.vocab_size, norm=norm, gated=True, parallel=False,
        rotary_dims=rotary_dims(c, hf_class), rotary_layout="half", tied=bool(getattr(c, "tie_word_embeddings", False)),
        eps=float(getattr(c, "rms_norm_eps", 1e-5)), eps_in_config=eps_in_config,
        activation=getattr(c, "hidden_act", None) or c.hidden_activation,
        clip_qkv=getattr(c, "clip_qkv", None), qk_norm=qk_norm,
    )


def decoder_attention_to_canonical(get, s: ModelShape, i: int, ln1) -> dict[str, torch.Tensor]:
    """Llama-layout attention (`model.layers.i.self_attn.{q,k,v,o}_proj`); ln1: (gamma, beta) of the norm it reads."""
    p, hf = f"blocks.{i}", f"model.layers.{i}"
    a = lambda n: get(f"{hf}.self_attn.{n}_proj.weight")  # noqa: E731
    ab = lambda n: get(f"{hf}.self_attn.{n}_proj.bias", None)  # noqa: E731
    q, bq = fold_norm(a("q"), ab("q"), *ln1)
    k, bk = fold_norm(a("k"), ab("k"), *ln1)
    v, bv = fold_norm(a("v"), ab("v"), *ln1)
    return attention_to_canonical(p, s, q, k, v, a("o"), bq, bk, bv, ab("o"))


def decoder_block_to_canonical(get, s: ModelShape, i: int, ln1, ln2) -> dict[str, torch.Tensor]:
    """Llama-layout block (`model.layers.i.self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`).

    ln1, ln2: (gamma, beta) of the norms read by attention and MLP (beta None for RMSNorm)."""
    return {**decoder_attention_to_canonical(get, s, i, ln1), **decoder_mlp_to_canonical(get, s, i, ln2)}


def decoder_mlp_to_canonical(get, s: ModelShape, i: int, ln2) -> dict[str, torch.Tensor]:
    """Llama-layout gated MLP (`model.layers.i.mlp.{gate,up,down}_proj`); ln2: (gamma, beta) of the norm it reads."""
    p, hf = f"blocks.{i}", f"model.layers.{i}"
    m = lambda n: get(f"{hf}.mlp.{n}_proj.weight")  # noqa: E731
    mb = lambda n: get(f"{hf}.mlp.{n}_proj.bias", None)  # noqa: E731
    w_gate, b_gate = fold_norm(m("gate"), mb("gate"), *ln2)
    w_in, b_in = fold_norm(m("up"), mb("up"), *ln2)
    b_out = mb("down")
    return {f"{p}.mlp.W_in": w_in, f"{p}.mlp.b_in": b_in, f"{p}.mlp.W_gate": w_gate, f"{p}.mlp.b_gate": b_gate,
            f"{p}.mlp.W_out": m("down"),
            f"{p}.mlp.b_out": torch.zeros(s.d_model, dtype=torch.float64) if b_out is None else b_out}


def qk_norm_to_canonical(get, s: ModelShape, i: int, offset: float = 0.0) -> dict[str, torch.Tensor]:
    """Block i's QK-norm weights (`self_attn.{q,k}_norm.weight`, plus `offset`: Gemma stores w for 1 + w) as
    `attn.g_Q`, `attn.g_K`: `[d_head]` each for a norm per head (`s.qk_norm == "head"`), `[n_kv, q_per_kv, d_head]`
    and `[n_kv, d_head]` for one over the whole projection ("projection"); nothing without QK-norm."""
    if not s.qk_norm:
        return {}
    hf, p = f"model.layers.{i}.self_attn", f"blocks.{i}.attn"
    q, k = offset + get(f"{hf}.q_norm.weight"), offset + get(f"{hf}.k_norm.weight")
    if s.qk_norm == "projection":
        q, k = q.reshape(s.n_kv_heads, s.q_per_kv, s.d_head), k.reshape(s.n_kv_heads, s.d_head)
    return {f"{p}.g_Q": q, f"{p}.g_K": k}


def qk_norm_from_canonical(params, s: ModelShape, i: int, offset: float = 0.0) -> dict[str, torch.Tensor]:
    """The stock QK-norm weights of block i (`qk_norm_to_canonical`'s inverse); nothing without QK-norm."""
    if not s.qk_norm:
        return {}
    hf, p = f"model.layers.{i}.self_attn", f"blocks.{i}.attn"
    return {f"{hf}.{n}_norm.weight": params[f"{p}.g_{n.upper()}"].reshape(-1) - offset for n in "qk"}


def decoder_ends_from_canonical(params, s: ModelShape, norm_weights: bool, unit: float = 1.0) -> dict[str, torch.Tensor]:
    """The embedding, the head and, with `norm_weights`, the final norm at unit weight (stored as `unit`: 1, or
    0 for a class that stores w for 1 + w)."""
    sd = {"model.embed_tokens.weight": params["embed.W_E"], "lm_head.weight": params["head.W_U"]}
    if norm_weights:
        sd["model.norm.weight"] = torch.full((s.d_model,), unit, dtype=torch.float64)
    return sd


def decoder_attention_from_canonical(params, i: int, norm_weights: bool, d_model: int, unit: float = 1.0) -> dict[str, torch.Tensor]:
    """All tensors a Llama-layout attention could hold, and the block's two norms at unit weight (stored as `unit`,
    as `decoder_ends_from_canonical`) with `norm_weights`."""
    hf = f"model.layers.{i}"
    q, k, v, o, bq, bk, bv, bo = attention_from_canonical(f"blocks.{i}", params)
    sd = {}
    for n, w, b in (("q", q, bq), ("k", k, bk), ("v", v, bv), ("o", o, bo)):
        sd[f"{hf}.self_attn.{n}_proj.weight"], sd[f"{hf}.self_attn.{n}_proj.bias"] = w, b
    if norm_weights:
        ones = torch.full((d_model,), unit, dtype=torch.float64)
        sd[f"{hf}.input_layernorm.weight"] = ones
        sd[f"{hf}.post_attention_layernorm.weight"] = ones
    return sd


def decoder_block_from_canonical(params, s: ModelShape, i: int, norm_weights: bool) -> dict[str, torch.Tensor]:
    """All tensors a Llama-layout block could hold; `keep_expected` keeps those the class has."""
    return {**decoder_attention_from_canonical(params, i, norm_weights, s.d_model), **decoder_mlp_from_canonical(params, i)}


def decoder_mlp_from_canonical(params, i: int) -> dict[str, torch.Tensor]:
    """All tensors a Llama-layout gated MLP could hold (biases included)."""
    p, hf = f"blocks.{i}", f"model.layers.{i}"
    sd = {}
    for n, c in (("gate", "gate"), ("up", "in"), ("down", "out")):
        sd[f"{hf}.mlp.{n}_proj.weight"], sd[f"{hf}.mlp.{n}_proj.bias"] = params[f"{p}.mlp.W_{c}"], params[f"{p}.mlp.b_{c}"]
    return sd


class LlamaAdapter(Adapter):
    name = "llama"
    #: Ministral 3 scales each query by a factor of its position (`llama_4_scaling_beta` in its RoPE parameters):
    #: a scalar, which every QK map commutes with
    #: Seed-OSS: Llama's blocks with q/k/v biases apart from the output projection's and a residual dropout (a
    #: training-time noise: every symmerge forward runs the model in eval mode)
    #: SmolLM3: Llama's blocks with RoPE left out on some layers (`no_rope_layers`, every fourth by default), where
    #: the exact QK group is every invertible map of the head; RoPE's subgroup, used on every layer, is a subgroup there
    hf_classes = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Ministral3ForCausalLM", "SeedOssForCausalLM",
                  "SmolLM3ForCausalLM")
    hooks = DECODER_HOOKS
    function_keys = ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "rope_parameters",
                     "no_rope_layers")
    #: the stock attention's norm of queries and keys (`ModelShape.qk_norm`): "" none, "head" one weight of length
    #: d_head per head (Qwen3, EXAONE 4), "projection" one weight per entry of the whole projection (OLMo-2, OLMoE)
    qk_norm = ""

    def shape(self, c) -> ModelShape:
        arch = next((a for a in class_names(c) if a in self.hf_classes), self.hf_classes[0])
        return _decoder_shape(self, c, arch, "rmsnorm", True, self.qk_norm)

    def nope_layers(self, config) -> list[int]:
        """SmolLM3's `no_rope_layers` (1: RoPE, 0: none); other classes rotate every layer."""
        return [i for i, rope in enumerate(getattr(config, "no_rope_layers", None) or []) if not rope]

    def embed_to_canonical(self, get, s):
        return {"embed.W_E": get("model.embed_tokens.weight")}

    def block_to_canonical(self, get, s, i):
        return {**self.attention_to_canonical(get, s, i), **self.mlp_to_canonical(get, s, i)}

    def _gamma(self, get, name: str) -> torch.Tensor:
        """The weight γ the stock norm `name` multiplies by: its stored weight plus `norm_offset`."""
        return self.norm_offset + get(f"{name}.weight")

    def attention_to_canonical(self, get, s, i):
        """Block i's attention, its input norm folded in, and its QK-norm weights where the shape has them."""
        return {**decoder_attention_to_canonical(get, s, i, (self._gamma(get, f"model.layers.{i}.input_layernorm"), None)),
                **qk_norm_to_canonical(get, s, i)}

    def mlp_to_canonical(self, get, s, i):
        """Block i's MLP, the post-attention norm folded in (a mixture of experts replaces it: `experts.py`)."""
        return decoder_mlp_to_canonical(get, s, i, (self._gamma(get, f"model.layers.{i}.post_attention_layernorm"), None))

    def final_to_canonical(self, get, s):
        w_u = head_weight(get, "model.embed_tokens.weight")
        return final_norm_to_canonical(w_u, None, self._gamma(get, "model.norm"), None, s.eps)

    def ends_from_canonical(self, params, s):
        return decoder_ends_from_canonical(params, s, norm_weights=True, unit=1.0 - self.norm_offset)

    def block_from_canonical(self, params, s, i):
        return {**self.attention_from_canonical(params, s, i), **self.mlp_from_canonical(params, s, i)}

    def attention_from_canonical(self, params, s, i):
        """Block i's attention tensors, its two norms (unit weight) and its QK-norm weights."""
        return {**decoder_attention_from_canonical(params, i, True, s.d_model, unit=1.0 - self.norm_offset),
                **qk_norm_from_canonical(params, s, i)}

    def mlp_from_canonical(self, params, s, i):
        return decoder_mlp_from_canonical(params, i)

    def export_config(self, config, s, params):
        config = super().export_config(config, s, params)
        config.rms_norm_eps = float(params["norm.eps"])
        return config
