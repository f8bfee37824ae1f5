"""Model and optimiser presets for `symmerge train`, one table per architecture.

`small` is the papers' size: 6 layers, width 256, 4 heads, context 256 (Tiny Shakespeare); the same
shape for GPT-NeoX, Llama and Qwen3 (grouped-query attention with 2 KV heads, SwiGLU width 688 ~ 8/3 d;
Qwen3 adds QK-norm), OLMo and OLMo-2 (post-norms and QK-norm), Gemma 3 (Llama's widths with GeGLU, norms before and
after each sublayer, QK-norm, a tied head, and every third layer global, the others attending over half the context)
and Phi-3 (Llama's widths, MHA unless `--kv-heads`, fused projections). Qwen3-MoE (`qwen3_moe`) is Qwen3 with a mixture of
experts in every layer, top 2 renormalised, no load-balancing loss (the loss is the language model's alone): 8
experts of width 256 at `small`, 4 of width 128 at `demo` (an active FFN width of 256 or 512); Qwen2-MoE (`qwen2_moe`)
is the same mixture with Qwen2's attention and a shared expert of twice an expert's width. ViT `small` is 6
layers, width 256, 4 heads, patch 4 for 28x28 images and patch 2 for 8x8.
`tiny` presets train in a second and exist for tests; `demo` (width 128, 3 layers, 4 heads, context 64;
the gated MLPs width 344 ~ 8/3 d, Llama, Qwen3 and Gemma 3 with 2 KV heads) trains in minutes on one CPU
thread. Dropout is 0 everywhere (so training is a function of the seed alone, and a resumed run can equal an uninterrupted one).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from ..errors import SymmergeError

ARCHS = ("gpt2", "neox", "llama", "qwen3", "qwen3_moe", "qwen2_moe", "olmo", "olmo2", "gemma3", "phi3", "vit")
HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "neox": "GPTNeoXForCausalLM", "llama": "LlamaForCausalLM",
              "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
              "qwen2_moe": "Qwen2MoeForCausalLM", "olmo": "OlmoForCausalLM",
              "olmo2": "Olmo2ForCausalLM", "gemma3": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM",
              "vit": "ViTForImageClassification"}


@dataclass(frozen=True)
class Preset:
    """Shape (d_model, layers, heads, kv_heads, d_mlp, context or patch sizes) and optimisation."""

    d_model: int
    layers: int
    heads: int
    d_mlp: int
    context: int = 0  # language models: window length in tokens
    kv_heads: int | None = None  # the `GQA` architectures only; None = heads
    experts: int = 0  # the mixtures only: experts per layer, each a gated MLP of width d_mlp
    experts_per_token: int = 0  # the mixtures only: the router's top k
    rotary_pct: float = 0.25  # neox only: the fraction of each head RoPE rotates (Pythia's 25%)
    parallel_residual: bool = True  # neox only: attention and MLP both read the block's input (Pythia)
    patch: dict = field(default_factory=dict)  # vit: image side -> patch side
    batch_size: int = 16
    steps: int = 1000
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0
    save_every: int = 200

    def to_json(self) -> dict:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in asdict(self).items()}


_TINY_LM = dict(d_model=32, layers=2, heads=4, d_mlp=64, context=32, batch_size=4, steps=20, lr=3e-3, warmup=5,
                save_every=10)
_SMALL_LM = dict(d_model=256, layers=6, heads=4, d_mlp=1024, context=256, batch_size=16, steps=2000, lr=1e-3,
                 warmup=100)

#: `symmerge demo`: trains in well under a minute on 2 cores, yet far enough to show a barrier
_DEMO_LM = dict(d_model=128, layers=3, heads=4, d_mlp=512, context=64, batch_size=16, steps=600, lr=3e-3, warmup=30,
                save_every=200)


#: gated MLPs of width ~ 8/3 d (rounded to a multiple of 8) with GQA (2 KV heads) and without, and mixtures of
#: experts: one table each, shared by the architectures of that shape
_GATED_GQA = {"tiny": Preset(**(_TINY_LM | dict(d_mlp=48, kv_heads=2))),
              "demo": Preset(**(_DEMO_LM | dict(d_mlp=344, kv_heads=2))),
              "small": Preset(**(_SMALL_LM | dict(d_mlp=688, kv_heads=2)))}
_GATED_MHA = {"tiny": Preset(**(_TINY_LM | dict(d_mlp=48))), "demo": Preset(**(_DEMO_LM | dict(d_mlp=344))),
              "small": Preset(**(_SMALL_LM | dict(d_mlp=688)))}
_MOE = {"tiny": Preset(**(_TINY_LM | dict(d_mlp=24, kv_heads=2, experts=4, experts_per_token=2))),
        "demo": Preset(**(_DEMO_LM | dict(d_mlp=128, kv_heads=2, experts=4, experts_per_token=2))),
        "small": Preset(**(_SMALL_LM | dict(d_mlp=256, kv_heads=2, experts=8, experts_per_token=2)))}

PRESETS: dict[str, dict[str, Preset]] = {
    "gpt2": {"tiny": Preset(**_TINY_LM), "demo": Preset(**_DEMO_LM), "small": Preset(**_SMALL_LM)},
    "neox": {"tiny": Preset(**_TINY_LM), "demo": Preset(**_DEMO_LM), "small": Preset(**_SMALL_LM)},
    "llama": _GATED_GQA, "qwen3": _GATED_GQA, "gemma3": _GATED_GQA,
    "olmo": _GATED_MHA, "olmo2": _GATED_MHA, "phi3": _GATED_MHA,
    "qwen3_moe": _MOE, "qwen2_moe": _MOE,
    "vit": {
        "demo": Preset(d_model=128, layers=2, heads=4, d_mlp=256, patch={28: 7, 8: 4}, batch_size=64, steps=400,
                       lr=2e-3, warmup=20, save_every=200),
        "tiny": Preset(d_model=32, layers=2, heads=4, d_mlp=64, patch={28: 7, 8: 4}, batch_size=16, steps=20,
                       lr=3e-3, warmup=5, save_every=10),
        "small": Preset(d_model=256, layers=6, heads=4, d_mlp=1024, patch={28: 4, 8: 2}, batch_size=64, steps=2000,
                        lr=1e-3, warmup=100),
    },
}


def get_preset(arch: str, name: str) -> Preset:
    if arch not in PRESETS:
        raise SymmergeError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    if name not in PRESETS[arch]:
        raise SymmergeError(f"unknown preset {name!r} for {arch}; choose one of {', '.join(PRESETS[arch])}")
    return PRESETS[arch][name]


#: the architectures with grouped-query attention (`--kv-heads`)
GQA = ("llama", "qwen3", "qwen3_moe", "qwen2_moe", "gemma3", "phi3")
#: the preset fields `symmerge train` may override (`--d-model`, `--layers`, `--heads`, `--kv-heads`, `--d-mlp`)
SHAPE_FIELDS = ("d_model", "layers", "heads", "kv_heads", "d_mlp")
#: GPT-NeoX's architecture switches `symmerge train` may override (`--rotary-pct`, `--parallel-residual`)
NEOX_FIELDS = ("rotary_pct", "parallel_residual")


def reshaped(arch: str, p: Preset, shape: dict | None) -> Preset:
    """`p` with some of its shape replaced (width sweeps); checks that the result is a valid model."""
    shape = shape or {}
    unknown = set(shape) - set(SHAPE_FIELDS) - set(NEOX_FIELDS)
    if unknown:
        raise SymmergeError(f"cannot override {sorted(unknown)}; the shape fields are "
                            f"{', '.join(SHAPE_FIELDS + NEOX_FIELDS)}")
    bad = {k: v for k, v in shape.items() if k in SHAPE_FIELDS and (not isinstance(v, int) or v < 1)}
    if bad:
        raise SymmergeError(f"shape overrides must be positive integers, got {bad}")
    if "kv_heads" in shape and arch not in GQA:
        raise SymmergeError(f"--kv-heads applies to {', '.join(GQA)} (grouped-query attention), not {arch}")
    neox = [k for k in NEOX_FIELDS if k in shape]
    if neox and arch != "neox":
        raise SymmergeError(f"--{neox[0].replace('_', '-')} applies to neox, not {arch}")
    q = replace(p, **shape)
    if q.d_model % q.heads:
        raise SymmergeError(f"width {q.d_model} is not divisible by {q.heads} heads; change --d-model or --heads")
    head = q.d_model // q.heads
    rotary = head * q.rotary_pct  # GPT-NeoX rotates int(head * rotary_pct) dimensions of each head
    if arch == "neox" and not (0 < q.rotary_pct <= 1 and rotary == int(rotary) and int(rotary) % 2 == 0):
        raise SymmergeError(f"GPT-NeoX's rotary fraction {q.rotary_pct} of a head width {head} is not an even, "
                            "positive number of dimensions; change --rotary-pct, --d-model or --heads")
    if arch not in ("gpt2", "neox", "vit") and head % 2:  # RoPE on the whole head (NeoX's fraction: checked above)
        raise SymmergeError(f"RoPE needs an even head width, got {head}")
    if q.kv_heads is not None and (q.kv_heads > q.heads or q.heads % q.kv_heads):
        raise SymmergeError(f"{q.heads} heads cannot be shared among {q.kv_heads} KV heads; --heads must be a "
                            "multiple of --kv-heads")
    return q


def lm_config(arch: str, p: Preset, vocab_size: int, bos: int, eos: int):
    """The HF config of a language model of this preset (dropout 0, untied heads except GPT-2)."""
    import transformers as T

    common = dict(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos)
    if arch == "gpt2":
        return T.GPT2Config(n_embd=p.d_model, n_layer=p.layers, n_head=p.heads, n_inner=p.d_mlp, n_positions=p.context,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    if arch == "neox":
        return T.GPTNeoXConfig(hidden_size=p.d_model, num_hidden_layers=p.layers, num_attention_heads=p.heads,
                               intermediate_size=p.d_mlp, max_position_embeddings=p.context, rotary_pct=p.rotary_pct,
                               use_parallel_residual=p.parallel_residual, hidden_dropout=0.0, attention_dropout=0.0,
                               tie_word_embeddings=False, **common)
    if arch == "llama":
        return T.LlamaConfig(hidden_size=p.d_model, num_hidden_layers=p.layers, num_attention_heads=p.heads,
                             num_key_value_heads=p.kv_heads or p.heads, intermediate_size=p.d_mlp,
                             max_position_embeddings=p.context, tie_word_embeddings=False, pad_token_id=None, **common)
    if arch == "qwen3":  # head_dim is a config value of its own in Qwen3: d_model / heads, as the other presets
        return T.Qwen3Config(hidden_size=p.d_model, num_hidden_layers=p.layers, num_attention_heads=p.heads,
                             num_key_value_heads=p.kv_heads or p.heads, head_dim=p.d_model // p.heads,
                             intermediate_size=p.d_mlp, max_position_embeddings=p.context, tie_word_embeddings=False,
                             pad_token_id=None, **common)
    if arch == "qwen3_moe":  # every layer a mixture (decoder_sparse_step 1); no load-balancing loss in the loss
        return T.Qwen3MoeConfig(hidden_size=p.d_model, num_hidden_layers=p.layers, num_attention_heads=p.heads,
                                num_key_value_heads=p.kv_heads or p.heads, head_dim=p.d_model // p.heads,
                                intermediate_size=p.d_mlp, moe_intermediate_size=p.d_mlp, num_experts=p.experts,
                                num_experts_per_tok=p.experts_per_token, norm_topk_prob=True, decoder_sparse_step=1,
                                mlp_only_layers=[], output_router_logits=False, max_position_embeddings=p.context,
                                tie_word_embeddings=False, pad_token_id=None, **common)
    if arch == "qwen2_moe":  # Qwen3-MoE's mixture with Qwen2's attention (q, k, v biases) and a shared expert of twice an
        # expert's width that every token takes, gated by a sigmoid of one more reader of the stream
        return T.Qwen2MoeConfig(hidden_size=p.d_model, num_hidden_layers=p.layers, num_attention_heads=p.heads,
                                num_key_value_heads=p.kv_heads or p.heads, intermediate_size=p.d_mlp,
                                moe_intermediate_size=p.d_mlp, shared_expert_intermediate_size=2 * p.d_mlp,
                                num_experts=p.experts, num_experts_per_tok=p.experts_per_token, norm_topk_prob=True,
                                decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False,
                                use_sliding_window=False, max_position_embeddings=p.context, tie_word_embeddings=False,
                                pad_token_id=None, **common)
    if arch == "olmo":
        return T.OlmoConfig(hidden_size=p.d_model, num_hidden_layers=p.layers, num_attention_heads=p.heads,
                            intermediate_size=p.d_mlp, max_position_embeddings=p.context, tie_word_embeddings=False,
                            pad_token_id=None, **common)
    if arch == "olmo2":
        return T.Olmo2Config(hidden_size=p.d_model, num_hidden_layers=p.layers, num_attention_heads=p.heads,
                             intermediate_size=p.d_mlp, max_position_embeddings=p.context, tie_word_embeddings=False,
                             pad_token_id=None, **common)
    if arch == "gemma3":  # every third layer global, the others local over half the context (the stock 5:1 pattern,
        # shortened so that the demo's three layers have both kinds); the stock query scale 1/sqrt(head_dim); tied head
        head = p.d_model // p.heads
        return T.Gemma3TextConfig(hidden_size=p.d_model, num_hidden_layers=p.layers, num_attention_heads=p.heads,
                                  num_key_value_heads=p.kv_heads or p.heads, head_dim=head, intermediate_size=p.d_mlp,
                                  max_position_embeddings=p.context, query_pre_attn_scalar=head,
                                  sliding_window=max(p.context // 2, 1),
                                  layer_types=["full_attention" if (i + 1) % 3 == 0 else "sliding_attention"
                                               for i in range(p.layers)],
                                  tie_word_embeddings=True, pad_token_id=None, **common)
    if arch == "phi3":  # RoPE on the whole head (Phi-3-mini); fused qkv and gate_up projections
        return T.Phi3Config(hidden_size=p.d_model, num_hidden_layers=p.layers, num_attention_heads=p.heads,
                            num_key_value_heads=p.kv_heads or p.heads, intermediate_size=p.d_mlp,
                            max_position_embeddings=p.context, original_max_position_embeddings=p.context,
                            resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, tie_word_embeddings=False,
                            pad_token_id=None, **common)
    raise SymmergeError(f"{arch} is not a language-model architecture; choose one of {', '.join(a for a in ARCHS if a != 'vit')}")


def vit_config(p: Preset, image_size: int, num_labels: int, num_channels: int = 1):
    import transformers as T

    if image_size not in p.patch:
        raise SymmergeError(f"the vit presets know image sizes {sorted(p.patch)}, not {image_size}; "
                            "use MNIST/Fashion-MNIST (28x28) or digits (8x8)")
    return T.ViTConfig(hidden_size=p.d_model, num_hidden_layers=p.layers, num_attention_heads=p.heads,
                       intermediate_size=p.d_mlp, image_size=image_size, patch_size=p.patch[image_size],
                       num_channels=num_channels, num_labels=num_labels, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
