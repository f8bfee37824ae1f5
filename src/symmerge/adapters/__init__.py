"""Architecture adapters: stock HF state dicts <-> canonical tensors. See `base.py` for how to add one."""

from __future__ import annotations

from ..errors import SymmergeError
from .base import Adapter, class_names
from .cohere import CohereAdapter
from .experts import GraniteMoeAdapter, MixtralAdapter, OlmoeAdapter, Qwen2MoeAdapter, Qwen3MoeAdapter
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
from .starcoder2 import Starcoder2Adapter
from .vit import ViTAdapter

ADAPTERS: dict[str, Adapter] = {}
for _a in (CohereAdapter(), Exaone4Adapter(), GemmaAdapter(), Gemma1Adapter(), GPT2Adapter(), GPTNeoXAdapter(), GraniteAdapter(),
           GraniteMoeAdapter(), LlamaAdapter(), MixtralAdapter(), OlmoAdapter(), Olmo2Adapter(), Olmo3Adapter(),
           OlmoeAdapter(), PhiAdapter(), Phi3Adapter(), Qwen2MoeAdapter(), Qwen3Adapter(), Qwen3MoeAdapter(),
           Starcoder2Adapter(), ViTAdapter()):
    for _c in _a.hf_classes:
        ADAPTERS[_c] = _a

#: architectures whose blocks break part of the group; symmerge refuses them and says why
BROKEN = {
    "BertForMaskedLM": "BERT is post-norm: LayerNorm sits on the residual stream itself, so no residual rotation or scale survives",
    "BertModel": "BERT is post-norm: LayerNorm sits on the residual stream itself, so no residual rotation or scale survives",
}


def supported() -> list[str]:
    return sorted(ADAPTERS)


def adapter_for(config) -> Adapter:
    """The adapter of `config`'s first architecture; a config that names none (some hand-written or old
    checkpoints) is read by its `model_type` through transformers' auto mappings."""
    named = class_names(config)
    if not getattr(config, "architectures", None):  # by model_type: the first of its classes symmerge knows
        named = [c for c in named if c in ADAPTERS or c in BROKEN]
    arch = (named or [config.model_type])[0]
    if arch in BROKEN:
        raise SymmergeError(f"{arch} is not supported: {BROKEN[arch]}. Supported: {', '.join(supported())}")
    if arch not in ADAPTERS:
        raise SymmergeError(f"architecture {arch} is not supported; supported: {', '.join(supported())}")
    return ADAPTERS[arch]
