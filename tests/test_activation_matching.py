"""Activation matching: planted elements recovered from activations; outputs keep B's function.

Most tests use synthetic batches of random token ids (random images for ViT), injected in place of
`symmerge.data.batches.load_batches` for the CLI; one goes through the real data API on Tiny Shakespeare.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T

from checks import assert_different_function, assert_same_function, with_tensor_of
from conftest import shared_data
from factories import example_inputs, make_model, rel_distance, save_model
from symmerge import SymmergeError, cli
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.data.tokenizers import char_tokenizer
from symmerge.match.activation import activation_match
from symmerge.store.model import load_model
from test_weight_matching import SUPPORTED


def batches(arch: str, n: int = 4, seed: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    if arch == "vit":
        return [{"pixel_values": torch.randn(4, 1, 8, 8, generator=gen, dtype=torch.float64),
                 "labels": torch.zeros(4, dtype=torch.long)} for _ in range(n)]
    out = []
    for _ in range(n):
        ids = torch.randint(0, 61, (4, 16), generator=gen)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


@pytest.mark.parametrize("arch", SUPPORTED)
def test_planted_recovery_from_activations(arch, tmp_path):
    A = load_model(save_model(make_model(arch, 0), tmp_path / "a"))
    B = load_model(tmp_path / "a")
    g = random_element(A.spec, torch.Generator().manual_seed(2))
    B.params = apply(A.spec, g, A.params)
    assert rel_distance(B.params, A.params) > 0.1
    res = activation_match(A, B, batches(arch))
    assert rel_distance(apply(A.spec, res.g, B.params), A.params) <= 1e-5
    shuffled = dict(res.g)  # negative control: one FFN unit pair swapped
    shuffled["blocks.0.ffn"] = res.g["blocks.0.ffn"].clone()
    shuffled["blocks.0.ffn"][[0, 1]] = shuffled["blocks.0.ffn"][[1, 0]]
    assert rel_distance(apply(A.spec, shuffled, B.params), A.params) > 1e-3


@pytest.fixture
def fake_data(monkeypatch):
    """`symmerge.data.batches.load_batches` returning synthetic token batches. The real module's attribute is
    patched (a stand-in module in sys.modules would stay bound in every module first imported during
    the test, e.g. `symmerge.workflows.demo` through the CLI's parser, and leak into later tests)."""
    import symmerge.data.batches

    calls = []

    def load_batches(model_dir, data, split, batch_size, seq_len, max_batches):
        calls.append((str(model_dir), data, split, batch_size, seq_len, max_batches))
        return batches("llama" if "vit" not in str(data) else "vit", n=max_batches)

    monkeypatch.setattr(symmerge.data.batches, "load_batches", load_batches)
    return calls


@pytest.mark.parametrize("arch", [a for a in ("gpt2", "llama", "qwen3", "olmo2", "mixtral", "olmoe", "qwen2_moe",
                                               "qwen3_moe")
                                  if a in SUPPORTED])
def test_cli_activation_align(tmp_path, fake_data, arch):
    a = save_model(make_model(arch, 0), tmp_path / "a")
    assert cli.main(["transform", str(a), "-o", str(tmp_path / "b"), "--seed", "6"]) == 0
    assert cli.main(["align", str(a), str(tmp_path / "b"), "-o", str(tmp_path / "c"), "--method", "activation",
                     "--data", "synthetic", "--max-batches", "3", "--json", str(tmp_path / "r.json"),
                     "--groups", "all"]) == 0
    assert fake_data and fake_data[0][1:] == ("synthetic", "train", 8, None, 3)
    A, C = load_model(a), load_model(tmp_path / "c")
    assert rel_distance(C.params, A.params) <= 1e-5
    x = example_inputs(arch)
    hf_b = T.AutoModelForCausalLM.from_pretrained(tmp_path / "b").eval()
    hf_c = T.AutoModelForCausalLM.from_pretrained(tmp_path / "c").eval()
    assert_same_function(hf_c, hf_b, x, what=f"{arch} aligned")
    assert_different_function(with_tensor_of(hf_c, hf_b), hf_b, x, what="one reader left as B has it")
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["method"] == "activation" and rep["fit"]["residual_r2"] > 1 - 1e-9


def test_activation_unrelated_models_keep_b_function(tmp_path):
    A = load_model(save_model(make_model("llama", 0), tmp_path / "a"))
    b = save_model(make_model("llama", 1), tmp_path / "b")
    B = load_model(b)
    res = activation_match(A, B, batches("llama"))
    assert res.extra["fit"]["residual_r2"] < 0.99  # negative control: they are not one model
    C = apply(B.spec, res.g, B.params)
    from symmerge.store.model import build_hf_model, export_state_dict

    config, sd = export_state_dict(B, C)
    x = example_inputs("llama")
    hf_b = T.AutoModelForCausalLM.from_pretrained(b).eval()
    out = build_hf_model(config, sd, B.shape.hf_class)
    assert_same_function(out, hf_b, x, what="llama aligned")  # float32 precision: RMSNorm runs in float32
    assert_different_function(with_tensor_of(out, hf_b), hf_b, x, what="one reader left as B has it")


def test_activation_without_data_fails_cleanly(tmp_path, capsys):
    a = save_model(make_model("gpt2", 0), tmp_path / "a")
    assert cli.main(["align", str(a), str(a), "-o", str(tmp_path / "c"), "--method", "activation"]) == 2
    assert "--data" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_cli_activation_align_on_real_text(tmp_path):
    """Through the real data API: Tiny Shakespeare, the model folder's own (char) tokenizer."""
    text = shared_data("tinyshakespeare.txt").read_text()[:20000]
    (tmp_path / "text.txt").write_text(text)
    tok = char_tokenizer(text)
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=24, n_layer=2, n_head=3, n_positions=32, vocab_size=len(tok)))
    model.to(torch.float64).save_pretrained(tmp_path / "a")
    tok.save_pretrained(tmp_path / "a")
    assert cli.main(["transform", str(tmp_path / "a"), "-o", str(tmp_path / "b"), "--seed", "8"]) == 0
    assert cli.main(["align", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "c"), "--method",
                     "activation", "--data", str(tmp_path / "text.txt"), "--batch-size", "4", "--max-batches", "2",
                     "--groups", "all"]) == 0
    A, C = load_model(tmp_path / "a"), load_model(tmp_path / "c")
    assert rel_distance(C.params, A.params) <= 1e-5
    x = {"input_ids": torch.tensor([tok.encode(text[:32])])}
    hf_b = T.AutoModelForCausalLM.from_pretrained(tmp_path / "b").eval()
    hf_c = T.AutoModelForCausalLM.from_pretrained(tmp_path / "c").eval()
    assert_same_function(hf_c, hf_b, x, what="gpt2 aligned")
    assert_different_function(with_tensor_of(hf_c, hf_b), hf_b, x, what="one reader left as B has it")


def test_activation_refuses_an_adapter_without_hook_points(tmp_path, monkeypatch):
    """The hooked modules come from the adapter alone: an adapter that names none is refused, not guessed."""
    A = load_model(save_model(make_model("gpt2", 0), tmp_path / "a"))
    monkeypatch.setattr(A.adapter, "hooks", None)
    with pytest.raises(SymmergeError, match="no hook points for gpt2"):
        activation_match(A, A, batches("gpt2"))
