"""Architecture adapters: stock HF state dicts <-> canonical tensors. See `base.py` for how to add one."""

from __future__ import annotations

from .. import SymmergeError
from .base import Adapter
from .gpt2 import GPT2Adapter
from .gpt_neox import GPTNeoXAdapter
from .llama import LlamaAdapter
from .olmo import OlmoAdapter
from .vit import ViTAdapter

ADAPTERS: dict[str, Adapter] = {}
for _a in (GPT2Adapter(), GPTNeoXAdapter(), LlamaAdapter(), OlmoAdapter(), ViTAdapter()):
    for _c in _a.hf_classes:
        ADAPTERS[_c] = _a

#: architectures whose blocks break part of the group; symmerge refuses them and says why
BROKEN = {
    "Olmo2ForCausalLM": "OLMo-2 normalises after attention and MLP (post-norm) and applies QK-norm over all heads: "
    "the residual rotation and the head-internal maps are not symmetries of it",
    "Olmo3ForCausalLM": "OLMo-3 uses post-norms and QK-norm: the residual rotation and QK maps are not symmetries",
    "BertForMaskedLM": "BERT is post-norm: LayerNorm sits on the residual stream itself, so no residual rotation or scale survives",
    "BertModel": "BERT is post-norm: LayerNorm sits on the residual stream itself, so no residual rotation or scale survives",
    "Qwen3ForCausalLM": "Qwen3 applies RMSNorm to each head's q and k (QK-norm): QK maps must be orthogonal and commute with RoPE",
    "GemmaForCausalLM": "Gemma scales embeddings by sqrt(d_model) and ties them to the head; not supported yet",
}


def supported() -> list[str]:
    return sorted(ADAPTERS)


def adapter_for(config) -> Adapter:
    archs = list(getattr(config, "architectures", None) or [])
    if not archs:
        by_type = {a.name: c for c, a in ADAPTERS.items()}
        guess = {"gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM", "llama": "LlamaForCausalLM",
                 "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM", "olmo": "OlmoForCausalLM",
                 "vit": "ViTForImageClassification"}.get(config.model_type)
        archs = [guess] if guess in ADAPTERS else [by_type.get(config.model_type, config.model_type)]
    arch = archs[0]
    if arch in BROKEN:
        raise SymmergeError(f"{arch} is not supported: {BROKEN[arch]}. Supported: {', '.join(supported())}")
    if arch not in ADAPTERS:
        raise SymmergeError(f"architecture {arch} is not supported; supported: {', '.join(supported())}")
    return ADAPTERS[arch]
