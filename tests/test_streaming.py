"""Block-at-a-time export equals the in-memory export; sharded and half-precision checkpoints read and write."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from safetensors.torch import load_file

from factories import example_inputs, logits, make_model
from symmerge.apply import apply
from symmerge.model import LazyModel, load_model, save_model
from symmerge.spec import random_element
from symmerge.stream import write_streaming


def _all_tensors(folder):
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "vit"])
def test_streaming_equals_in_memory_and_shards(arch, model_dirs, tmp_path):
    lazy = LazyModel(model_dirs[arch])
    g = random_element(lazy.spec, torch.Generator().manual_seed(0))
    write_streaming(lazy, lambda part: apply(lazy.spec, g, part), tmp_path / "s", max_shard_bytes=20_000, progress=False)
    model = load_model(model_dirs[arch])
    save_model(model, apply(model.spec, g, model.params), tmp_path / "m")
    assert (tmp_path / "s" / "model.safetensors.index.json").is_file(), "expected several shards"
    streamed, in_memory = _all_tensors(tmp_path / "s"), _all_tensors(tmp_path / "m")
    assert set(streamed) == set(in_memory)
    for k in streamed:
        assert torch.equal(streamed[k], in_memory[k]), k
    a = json.loads((tmp_path / "s" / "config.json").read_text())
    b = json.loads((tmp_path / "m" / "config.json").read_text())
    assert a == b


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sharded_half_precision_checkpoint(dtype, tmp_path):
    src = make_model("llama", dtype=torch.float32).to(dtype)
    src.save_pretrained(tmp_path / "src", max_shard_size="20KB")
    assert (tmp_path / "src" / "model.safetensors.index.json").is_file()
    lazy = LazyModel(tmp_path / "src")
    assert lazy.dtype == dtype
    g = random_element(lazy.spec, torch.Generator().manual_seed(1))
    write_streaming(lazy, lambda part: apply(lazy.spec, g, part), tmp_path / "out", progress=False)
    out = T.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert next(out.parameters()).dtype == dtype
    ref = logits(src.float(), example_inputs("llama"))
    new = logits(out.float(), example_inputs("llama"))
    # half precision storage: rounding of the rotated weights dominates
    assert float((new - ref).abs().max()) < 0.05 * float(ref.abs().max())
    # negative control: an unrotated embedding breaks it
    sd = out.state_dict()
    sd["model.embed_tokens.weight"] = src.state_dict()["model.embed_tokens.weight"]
    out.load_state_dict(sd)
    assert float((logits(out.float(), example_inputs("llama")) - ref).abs().max()) > 0.1 * float(ref.abs().max())
