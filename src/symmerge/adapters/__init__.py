"""Architecture adapters: stock HF state dicts <-> canonical tensors. See `base.py` for how to add one."""

from __future__ import annotations

from ..errors import SymmergeError
from .base import Adapter
from .experts import MixtralAdapter, OlmoeAdapter, Qwen2MoeAdapter, Qwen3MoeAdapter
from .gemma import GemmaAdapter
from .gemma1 import Gemma1Adapter
from .gpt2 import GPT2Adapter
from .gpt_neox import GPTNeoXAdapter
from .granite import GraniteAdapter
from .llama import LlamaAdapter
from .olmo import OlmoAdapter
from .olmo2 import Exaone4Adapter, Olmo2Adapter, Olmo3Adapter
from .phi import PhiAdapter
from .phi3 import Phi3Adapter
from .qwen3 import Qwen3Adapter
from .vit import ViTAdapter

ADAPTERS: dict[str, Adapter] = {}
for _a in (Exaone4Adapter(), GemmaAdapter(), Gemma1Adapter(), GPT2Adapter(), GPTNeoXAdapter(), GraniteAdapter(), LlamaAdapter(),
           MixtralAdapter(), OlmoAdapter(), Olmo2Adapter(), Olmo3Adapter(), OlmoeAdapter(), PhiAdapter(), Phi3Adapter(),
           Qwen2MoeAdapter(), Qwen3Adapter(), Qwen3MoeAdapter(), ViTAdapter()):
    for _c in _a.hf_classes:
        ADAPTERS[_c] = _a

#: architectures whose blocks break part of the group; symmerge refuses them and says why
BROKEN = {
    "BertForMaskedLM": "BERT is post-norm: LayerNorm sits on the residual stream itself, so no residual rotation or scale survives",
    "BertModel": "BERT is post-norm: LayerNorm sits on the residual stream itself, so no residual rotation or scale survives",
}


def supported() -> list[str]:
    return sorted(ADAPTERS)


def _classes_of(model_type: str) -> list[str]:
    """The model classes stock `transformers` pairs with `model_type` (its auto mappings are the one
    home of that fact): the causal-LM head first, then image classification, then masked LM."""
    from transformers.models.auto import modeling_auto as auto

    mappings = (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
                auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    return [m[model_type] for m in mappings if model_type in m]


def adapter_for(config) -> Adapter:
    """The adapter of `config`'s first architecture; a config that names none (some hand-written or old
    checkpoints) is read by its `model_type` through transformers' auto mappings."""
    archs = list(getattr(config, "architectures", None) or [])
    if not archs:
        known = [c for c in _classes_of(config.model_type) if c in ADAPTERS or c in BROKEN]
        archs = known or [config.model_type]
    arch = archs[0]
    if arch in BROKEN:
        raise SymmergeError(f"{arch} is not supported: {BROKEN[arch]}. Supported: {', '.join(supported())}")
    if arch not in ADAPTERS:
        raise SymmergeError(f"architecture {arch} is not supported; supported: {', '.join(supported())}")
    return ADAPTERS[arch]
