"""Tiny stock HF models for the tests, one factory per architecture, with randomised norm parameters
(so that folding is exercised: fresh models have gamma = 1, beta = 0)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as T


def _configs() -> dict:
    return {
        "gpt2": lambda: T.GPT2Config(n_embd=24, n_layer=2, n_head=3, vocab_size=61, n_positions=32,
                                     bos_token_id=0, eos_token_id=0),
        "gpt_neox": lambda: T.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=48, vocab_size=61, max_position_embeddings=32,
                                            rotary_pct=0.5, use_parallel_residual=True, bos_token_id=0, eos_token_id=0),
        "gpt_neox_seq": lambda: T.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                intermediate_size=40, vocab_size=61, max_position_embeddings=32,
                                                rotary_pct=0.25, use_parallel_residual=False, bos_token_id=0, eos_token_id=0),
        "llama": lambda: T.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=40, vocab_size=61, max_position_embeddings=32,
                                       tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=None),
        "llama_untied": lambda: T.LlamaConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                              num_key_value_heads=3, intermediate_size=40, vocab_size=61,
                                              max_position_embeddings=32, tie_word_embeddings=False,
                                              bos_token_id=0, eos_token_id=0, pad_token_id=None),
        "qwen2": lambda: T.Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=40, vocab_size=61, max_position_embeddings=32,
                                       tie_word_embeddings=False, bos_token_id=0, eos_token_id=0),
        # Seed-OSS: q/k/v and output biases under separate flags, a head_dim apart from hidden_size / num_heads, and a
        # residual dropout (active only in training mode)
        "seed_oss": lambda: T.SeedOssConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=12, intermediate_size=40, vocab_size=61, max_position_embeddings=32,
                                            attention_bias=True, attention_out_bias=True, residual_dropout=0.1,
                                            tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # SmolLM3: no RoPE on every second layer (the stock default is every fourth, which two layers would not
        # reach), a sliding window on those layers
        "smollm3": lambda: T.SmolLM3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           intermediate_size=40, vocab_size=61, max_position_embeddings=32,
                                           no_rope_layer_interval=2, use_sliding_window=True, sliding_window=5,
                                           tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # Mistral: GQA, a sliding window shorter than the test sequences (12 tokens), and a head_dim that
        # is not hidden_size / num_attention_heads (q_proj is 48 x 32)
        "mistral": lambda: T.MistralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2, head_dim=12, intermediate_size=40, vocab_size=61,
                                           max_position_embeddings=32, sliding_window=5, tie_word_embeddings=False,
                                           bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # Ministral 3: Mistral's blocks, yarn RoPE, and each query scaled by a factor of its position
        "ministral3": lambda: T.Ministral3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                 num_key_value_heads=2, head_dim=12, intermediate_size=40, vocab_size=61,
                                                 max_position_embeddings=16,
                                                 rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                                  "original_max_position_embeddings": 4,
                                                                  "llama_4_scaling_beta": 0.5, "beta_fast": 32.0,
                                                                  "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
                                                 tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # Granite: Llama's blocks with an embedding multiplier, a residual multiplier, a score multiplier in place of
        # 1/sqrt(head_dim) and a logits divisor, each away from 1; tied
        "granite": lambda: T.GraniteConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           intermediate_size=40, vocab_size=61, max_position_embeddings=32,
                                           embedding_multiplier=2.0, residual_multiplier=0.9, attention_multiplier=0.6,
                                           logits_scaling=1.25, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                                           pad_token_id=None),
        # Qwen3: QK-norm, GQA, tied embeddings, head_dim independent of hidden_size / num_heads; a large eps, so
        # that the residual scale's eps update (shared with the QK-norm) shows in the logits
        "qwen3": lambda: T.Qwen3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=12, intermediate_size=40, vocab_size=61, max_position_embeddings=32,
                                       rms_norm_eps=1e-2, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                                       pad_token_id=None),
        # OLMo-2: post-norms, QK-norm over all heads, GQA; a large eps, so that the norms' eps matters
        "olmo2": lambda: T.Olmo2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=40, vocab_size=61, max_position_embeddings=32, rms_norm_eps=1e-2,
                                       tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # OLMo-3: OLMo-2's blocks, a sliding window of 5 tokens in the first layer, the second full attention
        "olmo3": lambda: T.Olmo3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=40, vocab_size=61, max_position_embeddings=32, rms_norm_eps=1e-2,
                                       sliding_window=5, layer_types=["sliding_attention", "full_attention"],
                                       tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # EXAONE 4: OLMo-2's post-norms with a QK-norm per head; the first layer a sliding window with RoPE, the second
        # full attention without RoPE; a large eps
        "exaone4": lambda: T.Exaone4Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           head_dim=12, intermediate_size=40, vocab_size=61, max_position_embeddings=32,
                                           rms_norm_eps=1e-2, sliding_window=5, sliding_window_pattern=2,
                                           tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # Mixtral: a mixture of 4 experts (top 2) per layer, GQA, untied
        "mixtral": lambda: T.MixtralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2, intermediate_size=24, num_local_experts=4,
                                           num_experts_per_tok=2, vocab_size=61, max_position_embeddings=32,
                                           tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # Phi-3: fused qkv_proj and gate_up_proj, half of each head rotary, GQA, a sliding window of 5 tokens
        "phi3": lambda: T.Phi3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=40, vocab_size=61, max_position_embeddings=32,
                                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.5},
                                     sliding_window=5, bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # OLMoE: 4 experts (top 2, weights not renormalised), QK-norm over the whole projection, GQA, a large eps
        "olmoe": lambda: T.OlmoeConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=24, num_experts=4, num_experts_per_tok=2, vocab_size=61,
                                       max_position_embeddings=32, rms_norm_eps=1e-2, tie_word_embeddings=False,
                                       bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # Qwen3-MoE: 4 experts (top 2, renormalised) of width 24, QK-norm per head, GQA, head_dim 12, tied
        "qwen3_moe": lambda: T.Qwen3MoeConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=2, head_dim=12, intermediate_size=40,
                                              moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                                              norm_topk_prob=True, vocab_size=61, max_position_embeddings=32,
                                              rms_norm_eps=1e-2, tie_word_embeddings=True, bos_token_id=0,
                                              eos_token_id=0, pad_token_id=None),
        # Granite MoE: Granite's four multipliers away from 1 (the logits divided by a half: sharper, so that the
        # negative controls show), 4 experts (top 2: a softmax over the top-2 logits) stored stacked, GQA, tied
        "granitemoe": lambda: T.GraniteMoeConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                 num_key_value_heads=2, intermediate_size=24, num_local_experts=4,
                                                 num_experts_per_tok=2, vocab_size=61, max_position_embeddings=32,
                                                 embedding_multiplier=2.0, residual_multiplier=0.9,
                                                 attention_multiplier=0.6, logits_scaling=0.5,
                                                 tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                                                 pad_token_id=None),
        # Qwen2-MoE: 4 experts (top 2, not renormalised) of width 24 and a shared expert of width 20 behind a sigmoid
        # gate, q/k/v biases, GQA, untied
        "qwen2_moe": lambda: T.Qwen2MoeConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=2, intermediate_size=40, moe_intermediate_size=24,
                                              shared_expert_intermediate_size=20, num_experts=4, num_experts_per_tok=2,
                                              norm_topk_prob=False, vocab_size=61,
                                              max_position_embeddings=32, rms_norm_eps=1e-2, tie_word_embeddings=False,
                                              bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # Qwen3-MoE with a dense layer: mixtures in layers 0 and 1, a dense MLP of another width (40) in layer 2
        "qwen3_moe_dense": lambda: T.Qwen3MoeConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                                    num_key_value_heads=2, head_dim=12, intermediate_size=40,
                                                    moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                                                    mlp_only_layers=[2], norm_topk_prob=True, vocab_size=61,
                                                    max_position_embeddings=32, rms_norm_eps=1e-2,
                                                    tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                                                    pad_token_id=None),
        # Phi-1/1.5/2: one LayerNorm read by attention and MLP in parallel, partial RoPE (a third of each head), q, k, v,
        # dense, fc1, fc2 and head biases, GQA
        "phi": lambda: T.PhiConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=40, vocab_size=61, max_position_embeddings=32, partial_rotary_factor=0.34,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # Gemma (1): Llama's blocks with (1 + w) norm weights, GeGLU, sqrt(d) embedding scale, tied, GQA, head_dim
        # apart from hidden_size / num_heads
        "gemma": lambda: T.GemmaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=12, intermediate_size=40, vocab_size=61, max_position_embeddings=32,
                                       rms_norm_eps=1e-2, bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # Gemma 2: norms before and after each sublayer ((1 + w) weights), GeGLU, sqrt(d) embedding scale, tied,
        # soft-capped scores and logits, query_pre_attn_scalar apart from head_dim, alternating sliding windows of 5
        "gemma2": lambda: T.Gemma2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=8, intermediate_size=40, vocab_size=61, max_position_embeddings=32,
                                         query_pre_attn_scalar=12, attn_logit_softcapping=10.0,
                                         final_logit_softcapping=15.0, sliding_window=5, rms_norm_eps=1e-2,
                                         bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # Gemma 3 (text): Gemma 2's blocks with QK-norm per head, another RoPE base on the sliding layers
        "gemma3": lambda: T.Gemma3TextConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=2, head_dim=12, intermediate_size=40, vocab_size=61,
                                             max_position_embeddings=32, query_pre_attn_scalar=10, sliding_window=5,
                                             layer_types=["sliding_attention", "full_attention"], rms_norm_eps=1e-2,
                                             bos_token_id=0, eos_token_id=0, pad_token_id=None),
        # StarCoder2: two LayerNorms in sequence, biases everywhere, GQA, RoPE on the whole head, a sliding window of
        # 5 tokens, tied
        "starcoder2": lambda: T.Starcoder2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                 num_key_value_heads=2, intermediate_size=40, vocab_size=61,
                                                 max_position_embeddings=32, sliding_window=5, bos_token_id=0,
                                                 eos_token_id=0, pad_token_id=None),
        # StarCoder2 without biases (`use_bias=False`: the folded LayerNorm biases need them back), untied
        "starcoder2_nobias": lambda: T.Starcoder2Config(hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                                        num_key_value_heads=1, intermediate_size=40, vocab_size=61,
                                                        max_position_embeddings=32, use_bias=False,
                                                        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                                                        pad_token_id=None),
        # Command R: one weight-only LayerNorm read by attention and a gated MLP in parallel, interleaved RoPE, GQA, a
        # logit multiplier, tied
        "cohere": lambda: T.CohereConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         intermediate_size=40, vocab_size=61, max_position_embeddings=32, logit_scale=0.5,
                                         bos_token_id=0, eos_token_id=0, pad_token_id=None),
        "olmo": lambda: T.OlmoConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
                                     vocab_size=61, max_position_embeddings=32, bos_token_id=0, eos_token_id=0, pad_token_id=None),
        "olmo_clip": lambda: T.OlmoConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
                                          vocab_size=61, max_position_embeddings=32, clip_qkv=0.3,
                                          bos_token_id=0, eos_token_id=0, pad_token_id=None),
        "vit": lambda: T.ViTConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
                                   image_size=8, patch_size=4, num_channels=1, num_labels=10),
    }


ARCHS = tuple(_configs())
#: one architecture of each block structure: LayerNorm with learned positions (gpt2), parallel blocks under two
#: LayerNorms with partial RoPE (gpt_neox), under one (phi), under one weight-only LayerNorm with interleaved RoPE
#: (cohere), RMSNorm with a gated MLP and GQA (llama), post-norms with a QK-norm per head (gemma3), post-norms alone
#: with a QK-norm over all heads (olmo2), a non-parametric LayerNorm with clip_qkv (olmo_clip), experts with a
#: shared expert (qwen2_moe) and without (mixtral), an encoder on images (vit). A test of a mechanism every
#: adapter reaches the same way (one learner or matcher over any spec) runs on these; a test of what each adapter
#: says (its tensors, hooks, group) runs on every architecture (ARCHS).
STRUCTURES = ("gpt2", "gpt_neox", "phi", "cohere", "llama", "gemma3", "olmo2", "olmo_clip", "qwen2_moe", "mixtral", "vit")
assert set(STRUCTURES) <= set(ARCHS)


def __getattr__(name: str):
    """EXPERTS, the architectures with a mixture of experts (in some layers at least), made on first use: it builds
    every config, which imports transformers' configuration modules (seconds), and a process that imports this
    module without reading it (a torchrun worker) is spared that."""
    if name == "EXPERTS":
        return frozenset(a for a, make in _configs().items() if getattr(make(), "num_experts_per_tok", 0))
    raise AttributeError(name)


def model_class(arch: str):
    """The stock class a test architecture's checkpoint loads as."""
    return T.ViTForImageClassification if arch == "vit" else T.AutoModelForCausalLM


def make_config(arch: str):
    config = _configs()[arch]()
    config.architectures = [{"gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM", "llama": "LlamaForCausalLM",
                             "mistral": "MistralForCausalLM", "ministral3": "Ministral3ForCausalLM", "granite": "GraniteForCausalLM",
                             "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                             "seed_oss": "SeedOssForCausalLM", "smollm3": "SmolLM3ForCausalLM",
                             "mixtral": "MixtralForCausalLM",
                             "olmo": "OlmoForCausalLM", "olmo2": "Olmo2ForCausalLM", "olmo3": "Olmo3ForCausalLM",
                             "exaone4": "Exaone4ForCausalLM",
                             "phi": "PhiForCausalLM", "phi3": "Phi3ForCausalLM",
                             "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                             "olmoe": "OlmoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                             "qwen3_moe": "Qwen3MoeForCausalLM", "starcoder2": "Starcoder2ForCausalLM",
                             "granitemoe": "GraniteMoeForCausalLM", "cohere": "CohereForCausalLM",
                             "vit": "ViTForImageClassification"}[config.model_type]]
    return config


def make_model(arch: str, seed: int = 0, dtype=torch.float64):
    """A random stock HF model of the given test architecture, with non-trivial norm parameters."""
    torch.manual_seed(seed)
    config = make_config(arch)
    cls = model_class(arch)
    model = cls(config) if arch == "vit" else cls.from_config(config)
    return runnable(randomised(model, seed).to(dtype).eval())


def randomised(model, seed: int = 0):
    """`model` (a fresh stock HF model) with norm weights and biases drawn away from 1 and 0 and larger weights,
    so that folding is exercised and errors show; changed in place and returned."""
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name or "layernorm" in name:
                if name.endswith("weight"):
                    p.copy_(1 + 0.5 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.mul_(3.0)  # larger weights: attention patterns far from uniform, so errors show
    return model


def save_model(model, path: Path) -> Path:
    model.save_pretrained(path)
    return path


def example_inputs(arch: str, seed: int = 0, batch: int = 2) -> dict:
    gen = torch.Generator().manual_seed(seed + 7)
    if arch == "vit":
        return {"pixel_values": torch.randn(batch, 1, 8, 8, generator=gen, dtype=torch.float64)}
    return {"input_ids": torch.randint(0, 61, (batch, 12), generator=gen)}


def runnable(model):
    """`model`, set to run its experts (a mixture of experts) by the eager loop where its dtype is one the default
    kernel (grouped_mm: float32/16 only) cannot multiply, as `symmerge.store.model.runs_in` does."""
    if model._can_set_experts_implementation() and next(model.parameters()).dtype == torch.float64:
        model.set_experts_implementation("eager")
    return model


def logits(model, inputs: dict) -> torch.Tensor:
    x = {k: (v.to(next(model.parameters()).dtype) if v.is_floating_point() else v) for k, v in inputs.items()}
    runnable(model)
    with torch.no_grad():
        return model(**x).logits


def stock_logits(model, params: dict, inputs: dict) -> torch.Tensor:
    """The stock HF forward of the canonical `params` of `model` (exported in its config) on `inputs`."""
    from symmerge.store.model import build_hf_model, export_state_dict

    config, sd = export_state_dict(model, params)
    return logits(build_hf_model(config, sd, model.shape.hf_class), inputs)


def loaded_with_logits(arch: str, folder: Path):
    """(the tiny float64 `arch` model saved in `folder` and loaded in canonical form, its stock logits on
    `example_inputs(arch)`)."""
    from symmerge.store.model import load_model

    model = load_model(save_model(make_model(arch), folder))
    return model, stock_logits(model, model.params, example_inputs(arch))


def lm_batches(n: int, seed: int, size: int = 4, length: int = 12) -> list[dict]:
    """Synthetic language-model batches (random token ids), in the shape `symmerge.data.batches.load_batches` returns."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 61, (size, length), generator=gen)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


def rel_distance(x: dict, y: dict) -> float:
    """||x - y|| / ||y|| over the tensors of `y`."""
    num = sum(float(((x[k] - y[k]) ** 2).sum()) for k in y)
    return (num / sum(float((y[k] ** 2).sum()) for k in y)) ** 0.5


def nudged_copy(run: Path, out: Path, tensors: str = ".train_state/params.safetensors", prefix: str = "") -> Path:
    """A copy of an interrupted run's folder (default: `symmerge train`'s OUT/.train_state) with one saved
    tensor of the file `tensors` (the first name that starts with `prefix`) moved by 0.01: the negative
    control of a resume, which must continue from what it saved (a rerun from the start would not see the
    change)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(run, out)
    state = out / tensors
    params = load_file(str(state))
    first = sorted(k for k in params if k.startswith(prefix))[0]
    save_file({**params, first: params[first] + 0.01}, str(state))
    return out
