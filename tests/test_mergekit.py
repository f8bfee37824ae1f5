"""mergekit itself (optional extra `ecosystem`): its `linear` merge of the stock A and symmerge's aligned
B, run from the mergekit.yml written beside B, is `symmerge interpolate A B --lam 0.5` to float32
rounding; B in canonical form (the old output) is not."""

from __future__ import annotations

import pytest
import torch
import transformers as T
import yaml

from factories import example_inputs, logits, make_model
from symmerge.cli import main
from symmerge.store.gauge import MERGEKIT_FILE, mergekit_config
from symmerge.store.model import load_model, save_model

pytest.importorskip("mergekit", reason="mergekit is not installed (pip install -e '.[ecosystem]')")


def mergekit_linear(config_text: str, out):
    """Run mergekit's `linear` method from a YAML config, offline on the CPU; the merged model."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    cfg = MergeConfiguration.model_validate(yaml.safe_load(config_text))
    run_merge(cfg, str(out), options=MergeOptions(device="cpu", copy_tokenizer=False, lazy_unpickle=False))
    return T.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()


@pytest.fixture
def neox_buffers_optional(monkeypatch):
    """mergekit 0.1.5's GPT-NeoX definition requires the buffers `attention.bias`, `attention.masked_bias`
    and `rotary_emb.inv_freq`, which checkpoints saved by transformers 5 do not hold (any NeoX checkpoint,
    not only symmerge's): the same definition with those three marked optional."""
    import importlib.resources
    import json

    import mergekit._data.architectures as defs
    from mergekit.architecture.json_definitions import NAME_TO_ARCH, _load_architecture_json

    data = json.loads(importlib.resources.files(defs).joinpath("gpt-neox.json").read_text())
    for w in data["layer_templates"]["weights"]:
        if w["name"].endswith(("attention.bias", "attention.masked_bias", "rotary_emb.inv_freq")):
            w["optional"] = True
    monkeypatch.setitem(NAME_TO_ARCH, "GPTNeoXForCausalLM", [_load_architecture_json(json.dumps(data))])


# mergekit has a definition of the first six classes and infers the layout of the rest (its StarCoder2 definition
# requires the biases, its Cohere definition Command R+'s QK-norm: mergekit refuses checkpoints without them)
@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox", "phi", "granite", "starcoder2", "ministral3", "olmo3",
                                  "qwen2_moe", "seed_oss", "exaone4", "olmoe"])
def test_mergekit_linear_is_interpolate(tmp_path, arch, neox_buffers_optional):
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    make_model(arch, seed=0, dtype=torch.float32).save_pretrained(a)
    make_model(arch, seed=1, dtype=torch.float32).save_pretrained(b)
    assert main(["align", str(a), str(b), "-o", str(out)]) == 0
    assert main(["interpolate", str(a), str(out), "--lam", "0.5", "-o", str(tmp_path / "mid")]) == 0
    x = example_inputs(arch)
    want = logits(T.AutoModelForCausalLM.from_pretrained(tmp_path / "mid", dtype=torch.float32), x)
    got = logits(mergekit_linear((out / MERGEKIT_FILE).read_text(), tmp_path / "merged"), x)
    scale = max(1.0, float(want.abs().max()))
    # float32 storage and arithmetic on both sides, a few layers deep: 1e-5 of the logits' scale
    assert float((got - want).abs().max()) <= 1e-5 * scale
    # negative control: B re-exported in canonical form, merged the same way
    m = load_model(out)
    save_model(m, m.params, tmp_path / "canonical")
    text = mergekit_config([a.resolve(), (tmp_path / "canonical").resolve()], (tmp_path / "canonical").resolve(), "float32")
    bad = logits(mergekit_linear(text, tmp_path / "merged_canonical"), x)
    assert float((bad - want).abs().max()) > 1e-2 * scale


@pytest.mark.parametrize("tied", [True, False])
def test_the_tie_note_says_when_mergekits_inferred_layout_misses_the_midpoint(tmp_path, tied):
    """SmolLM3, whose layout mergekit infers: with A tied and the aligned output untied, mergekit.yml says that
    mergekit takes the output's head alone, and its merge is not the midpoint; with A untied (the control) the
    note is absent and the merge is the midpoint. Norm weights away from 1 (`randomised`), so that the output
    cannot stay tied."""
    from factories import make_config, randomised
    from symmerge.store.gauge import TIE_NOTE

    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    for seed, path in ((0, a), (1, b)):
        torch.manual_seed(seed)
        config = make_config("smollm3")
        config.tie_word_embeddings = tied
        randomised(T.AutoModelForCausalLM.from_config(config), seed).float().eval().save_pretrained(path)
    assert main(["align", str(a), str(b), "-o", str(out)]) == 0
    assert main(["interpolate", str(a), str(out), "--lam", "0.5", "-o", str(tmp_path / "mid")]) == 0
    text = (out / MERGEKIT_FILE).read_text()
    assert (TIE_NOTE[0] in text) == tied
    assert T.AutoConfig.from_pretrained(out).tie_word_embeddings is False
    x = example_inputs("smollm3")
    want = logits(T.AutoModelForCausalLM.from_pretrained(tmp_path / "mid", dtype=torch.float32), x)
    got = logits(mergekit_linear(text, tmp_path / "merged"), x)
    scale = max(1.0, float(want.abs().max()))
    assert (float((got - want).abs().max()) > 1e-2 * scale) == tied
