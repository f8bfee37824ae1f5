"""Training from scratch: determinism per seed, exact resume, stock-loadable outputs, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as T
from safetensors.torch import load_file

from conftest import shared_data
from factories import nudged_copy
from symmerge import SymmergeError
from symmerge.adapters import adapter_for
from symmerge.cli import main
from symmerge.data.batches import load_batches
from symmerge.evaluation.forward import evaluate
from symmerge.training.presets import HF_CLASSES, PRESETS, get_preset, lm_config, vit_config
from symmerge.training.trainer import TrainArgs, batch_indices, lr_at, train


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("text") / "shakespeare20k.txt"
    p.write_text(shared_data("tinyshakespeare.txt").read_text()[:20000])
    return p


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def record(folder: Path) -> dict:
    return json.loads((folder / "symmerge.json").read_text())["train"]


def test_seed_determinism_resume_and_seed_difference(tmp_path, text_file):
    kw = dict(arch="gpt2", preset="tiny", data=str(text_file), progress=False, steps=12, save_every=4)
    a = train(TrainArgs(seed=0, out=str(tmp_path / "a"), **kw))
    again = train(TrainArgs(seed=0, out=str(tmp_path / "again"), **kw))
    wa = weights(a)
    assert all(torch.equal(wa[k], v) for k, v in weights(again).items())  # same seed: bitwise equal

    part = train(TrainArgs(seed=0, out=str(tmp_path / "b"), stop_after=6, **kw))  # "interrupted" at step 6
    assert not (part / "model.safetensors").exists()
    assert json.loads((part / ".train_state" / "state.json").read_text())["step"] == 6
    state_files = [f for f in (part / ".train_state").rglob("*") if f.is_file()]
    assert state_files and {f.suffix for f in state_files} <= {".safetensors", ".json"}  # no pickles
    nudged = nudged_copy(part, tmp_path / "nudged")
    b = train(TrainArgs(seed=0, out=str(tmp_path / "b"), resume=True, **kw))
    assert set(weights(b)) == set(wa) and all(torch.equal(wa[k], v) for k, v in weights(b).items())
    # negative control: the saved state moved, the resumed run ends elsewhere (it continues from its state)
    train(TrainArgs(seed=0, out=str(nudged), resume=True, **kw))
    assert any(not torch.equal(wa[k], v) for k, v in weights(nudged).items())
    assert record(b)["test"] == record(a)["test"]  # evaluation of the resumed model equals too

    c = train(TrainArgs(seed=1, out=str(tmp_path / "c"), **kw))
    assert all(not torch.equal(wa[k], v) for k, v in weights(c).items() if v.numel() > 1 and "ln_" not in k)


def test_data_order_and_schedule():
    """Each epoch visits every item once; different seeds order them differently; LR warms up, then decays."""
    epoch0 = torch.cat([batch_indices(10, 3, 0, s) for s in range(3)])
    assert len(set(epoch0.tolist())) == 9  # 3 batches of 3 from a permutation of 10 (last item dropped)
    assert not torch.equal(epoch0, torch.cat([batch_indices(10, 3, 1, s) for s in range(3)]))
    assert not torch.equal(epoch0, torch.cat([batch_indices(10, 3, 0, s) for s in range(3, 6)]))  # next epoch reshuffles
    p = get_preset("gpt2", "small")
    lrs = [lr_at(s, 1000, p, 1.0, 100) for s in range(1000)]
    assert lrs[0] == pytest.approx(0.01) and lrs[99] == pytest.approx(1.0)
    assert all(x >= y for x, y in zip(lrs[99:], lrs[100:])) and lrs[-1] == pytest.approx(0.1, abs=1e-4)


@pytest.mark.parametrize("arch,data,cls", [
    ("neox", "text", T.GPTNeoXForCausalLM), ("llama", "text", T.LlamaForCausalLM), ("qwen3", "text", T.Qwen3ForCausalLM),
    ("olmo2", "text", T.Olmo2ForCausalLM), ("qwen3_moe", "text", T.Qwen3MoeForCausalLM),
    ("qwen2_moe", "text", T.Qwen2MoeForCausalLM),
    ("olmo", "text", T.OlmoForCausalLM), ("gemma3", "text", T.Gemma3ForCausalLM), ("phi3", "text", T.Phi3ForCausalLM),
    ("vit", "digits", T.ViTForImageClassification),
])
def test_each_arch_trains_to_a_stock_checkpoint(tmp_path, text_file, arch, data, cls):
    data = str(text_file) if data == "text" else data
    out = train(TrainArgs(arch=arch, preset="tiny", data=data, seed=0, out=str(tmp_path / arch), progress=False))
    model = cls.from_pretrained(out).eval()  # stock class, from safetensors
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.bin"))
    losses = json.loads((out / ".train_state" / "state.json").read_text())["losses"]
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4  # it learnt something
    rec = record(out)
    batches = load_batches(out, data, "test", rec["batch_size"])
    assert evaluate(model, batches)["loss"] == pytest.approx(rec["test"]["loss"], abs=1e-6)
    assert abs(rec["validation"]["loss"] - rec["test"]["loss"]) > 1e-4  # negative control: the other split's figure
    if arch == "vit":
        assert json.loads((out / "preprocessor_config.json").read_text())["size"] == {"height": 8, "width": 8}
        assert T.AutoImageProcessor.from_pretrained(out) is not None
    else:
        assert len(T.AutoTokenizer.from_pretrained(out)) == model.config.vocab_size
    if arch == "llama":
        assert model.config.num_key_value_heads == 2 < model.config.num_attention_heads
    if arch in ("qwen3_moe", "qwen2_moe"):  # read as a mixture of experts in every layer, by the adapter every command uses
        shape = adapter_for(model.config).shape(model.config)
        assert (shape.n_experts, shape.experts_per_token, shape.d_mlp) == (4, 2, 24)
        assert shape.d_shared == (48 if arch == "qwen2_moe" else 0)  # Qwen2-MoE's shared expert


def test_cli_train_with_gpt2_bpe_and_eval(tmp_path, text_file, capsys):
    out = tmp_path / "g"
    assert main(["train", "--arch", "gpt2", "--preset", "tiny", "--data", str(text_file), "--seed", "3", "-o", str(out),
                 "--tokenizer", "gpt2", "--gpt2-bpe", str(shared_data("gpt2-encoder.json", "gpt2-vocab.bpe").parent), "--steps", "4"]) == 0
    assert "wrote" in capsys.readouterr().out
    tok = T.AutoTokenizer.from_pretrained(out)
    assert len(tok) == 50257 and T.GPT2LMHeadModel.from_pretrained(out).config.vocab_size == 50257
    assert record(out)["steps_done"] == 4 and record(out)["seed"] == 3
    assert main(["eval", str(out), "--data", str(text_file), "--batch-size", "2"]) == 0
    assert "loss/token" in capsys.readouterr().out
    # a non-empty output is refused without --force, replaced with it
    assert main(["train", "--arch", "gpt2", "--data", str(text_file), "-o", str(out), "--steps", "2"]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["train", "--arch", "gpt2", "--data", str(text_file), "-o", str(out), "--steps", "2", "--force",
                 "--tokenizer", "bpe", "--vocab-size", "300"]) == 0
    assert record(out)["tokenizer"] == "bpe" and len(T.AutoTokenizer.from_pretrained(out)) <= 300


def test_train_errors(tmp_path, text_file):
    kw = dict(arch="gpt2", preset="tiny", data=str(text_file), seed=0, progress=False)
    with pytest.raises(SymmergeError, match="unknown preset"):
        train(TrainArgs(**(kw | {"preset": "huge"}), out=str(tmp_path / "x")))
    with pytest.raises(SymmergeError, match="unknown architecture"):
        train(TrainArgs(**(kw | {"arch": "bert"}), out=str(tmp_path / "x")))
    with pytest.raises(SymmergeError, match="nothing|no .train_state"):
        train(TrainArgs(**kw, out=str(tmp_path / "x"), resume=True))
    with pytest.raises(SymmergeError, match="needs image data"):
        train(TrainArgs(**(kw | {"arch": "vit"}), out=str(tmp_path / "x")))
    with pytest.raises(SymmergeError, match="--gpt2-bpe"):
        train(TrainArgs(**kw, out=str(tmp_path / "x"), tokenizer="gpt2"))
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".symmerge-skeleton-*"))  # nothing left behind
    train(TrainArgs(**kw, out=str(tmp_path / "r"), steps=4, stop_after=2))
    with pytest.raises(SymmergeError, match="different settings"):
        train(TrainArgs(**(kw | {"seed": 1}), out=str(tmp_path / "r"), steps=4, resume=True))
    assert main(["train", "--arch", "gpt2", "--preset", "huge", "--data", str(text_file), "-o", str(tmp_path / "y")]) == 2


def test_small_presets_have_the_papers_shapes():
    for arch in ("gpt2", "neox", "llama", "qwen3", "qwen3_moe", "qwen2_moe", "olmo", "olmo2", "gemma3", "phi3"):
        c = lm_config(arch, get_preset(arch, "small"), 50257, 0, 0)
        d = c.to_dict()
        width = d.get("n_embd", d.get("hidden_size"))
        layers = d.get("n_layer", d.get("num_hidden_layers"))
        heads = d.get("n_head", d.get("num_attention_heads"))
        ctx = d.get("n_positions", d.get("max_position_embeddings"))
        assert (width, layers, heads, ctx) == (256, 6, 4, 256), arch
    assert lm_config("llama", get_preset("llama", "small"), 65, 0, 0).num_key_value_heads == 2
    assert vit_config(get_preset("vit", "small"), 28, 10).patch_size == 4
    assert vit_config(get_preset("vit", "small"), 8, 10).patch_size == 2
    with pytest.raises(SymmergeError, match="image sizes"):
        vit_config(get_preset("vit", "small"), 32, 10)
    assert lm_config("qwen3", get_preset("qwen3", "small"), 65, 0, 0).num_key_value_heads == 2
    assert lm_config("qwen3_moe", get_preset("qwen3_moe", "small"), 65, 0, 0).num_experts == 8
    assert set(PRESETS) == {"gpt2", "neox", "llama", "qwen3", "qwen3_moe", "qwen2_moe", "olmo", "olmo2", "gemma3", "phi3", "vit"}
    assert all("tiny" in v for v in PRESETS.values())


def test_demo_presets_build_stock_models_of_their_shape():
    """`demo` (width 128, 3 layers, 4 heads, context 64) builds and runs for every LM architecture;
    Llama keeps GQA (2 KV heads < 4) and SwiGLU width ~ 8/3 d rounded to a multiple of 8."""
    for arch in ("gpt2", "neox", "llama", "qwen3", "qwen3_moe", "qwen2_moe", "olmo", "olmo2", "gemma3", "phi3"):
        p = get_preset(arch, "demo")
        c = lm_config(arch, p, 65, 0, 0)
        torch.manual_seed(0)
        model = getattr(T, HF_CLASSES[arch])(c).eval()
        d = c.to_dict()
        shape = [d.get(k, d.get(k2)) for k, k2 in (("n_embd", "hidden_size"), ("n_layer", "num_hidden_layers"),
                                                   ("n_head", "num_attention_heads"), ("n_positions", "max_position_embeddings"))]
        assert shape == [128, 3, 4, 64], arch
        with torch.no_grad():
            logits = model(torch.randint(0, 65, (2, p.context), generator=torch.Generator().manual_seed(0))).logits
        assert logits.shape == (2, p.context, 65) and torch.isfinite(logits).all(), arch
    llama = lm_config("llama", get_preset("llama", "demo"), 65, 0, 0)
    assert llama.num_key_value_heads == 2 < llama.num_attention_heads
    assert llama.intermediate_size % 8 == 0 and abs(llama.intermediate_size - 8 * 128 / 3) < 8
    gemma = lm_config("gemma3", get_preset("gemma3", "demo"), 65, 0, 0)  # both attention kinds, local over half
    assert gemma.layer_types == ["sliding_attention", "sliding_attention", "full_attention"]
    assert gemma.sliding_window == 32 and gemma.tie_word_embeddings and gemma.pad_token_id is None
    shape = adapter_for(gemma).shape(gemma)  # read with Gemma 3's group: post-norms and QK-norm per head
    assert shape.post_norm and shape.qk_norm == "head" and shape.tied
    neox = lm_config("neox", get_preset("neox", "demo"), 65, 0, 0)
    shape = adapter_for(neox).shape(neox)  # partial rotary, read the way symmerge reads any checkpoint
    assert shape.rotary_dims == shape.d_head // 4 > 0


def test_shape_overrides_train_a_model_of_that_shape(tmp_path, text_file, capsys):
    """`--d-model/--layers/--heads/--kv-heads/--d-mlp` change the preset's shape (width sweeps); the stock
    config has that shape, symmerge.json records it, a resume must use the same shape, bad shapes fail clearly."""
    out = tmp_path / "w"
    assert main(["train", "--arch", "llama", "--data", str(text_file), "-o", str(out), "--steps", "2", "--d-model", "48",
                 "--heads", "6", "--kv-heads", "3", "--d-mlp", "40", "--layers", "1"]) == 0
    c = T.LlamaConfig.from_pretrained(out)
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.num_hidden_layers) == \
        (48, 6, 3, 40, 1)
    assert record(out)["preset_values"]["d_model"] == 48 and record(out)["shape"]["kv_heads"] == 3
    base = dict(arch="gpt2", preset="tiny", data=str(text_file), seed=0, progress=False, steps=4)
    train(TrainArgs(**base, out=str(tmp_path / "r"), stop_after=2, shape={"d_model": 16}))
    with pytest.raises(SymmergeError, match="different settings"):  # the preset's width is another run
        train(TrainArgs(**base, out=str(tmp_path / "r"), resume=True))
    assert T.GPT2Config.from_pretrained(train(TrainArgs(**base, out=str(tmp_path / "r"), resume=True,
                                                        shape={"d_model": 16}))).n_embd == 16
    for shape, msg in (({"d_model": 30}, "not divisible by 4 heads"), ({"kv_heads": 2}, "applies to llama"),
                       ({"d_mlp": 0}, "positive integers"), ({"context": 8}, "cannot override")):
        with pytest.raises(SymmergeError, match=msg):
            train(TrainArgs(**base, out=str(tmp_path / "bad"), shape=shape))
    with pytest.raises(SymmergeError, match="multiple of --kv-heads"):
        train(TrainArgs(**(base | {"arch": "llama"}), out=str(tmp_path / "bad"), shape={"kv_heads": 3}))
    assert not (tmp_path / "bad").exists()
    assert main(["train", "--arch", "neox", "--data", str(text_file), "-o", str(tmp_path / "n"), "--d-model", "24",
                 "--heads", "2"]) == 2 and "rotary" in capsys.readouterr().err


def test_neox_switches_train_that_architecture(tmp_path, text_file, capsys):
    """`--rotary-pct` and `--parallel-residual` (GPT-NeoX) reach the stock config and the shape symmerge reads
    from it; fractions that are not an even number of head dimensions and other architectures fail clearly."""
    out = tmp_path / "n"
    assert main(["train", "--arch", "neox", "--data", str(text_file), "-o", str(out), "--steps", "2",
                 "--rotary-pct", "1.0", "--parallel-residual", "off"]) == 0
    c = T.GPTNeoXConfig.from_pretrained(out)
    shape = adapter_for(c).shape(c)
    assert shape.rotary_dims == shape.d_head and not shape.parallel and not c.use_parallel_residual
    assert record(out)["shape"] == {"rotary_pct": 1.0, "parallel_residual": False}
    default = lm_config("neox", get_preset("neox", "tiny"), 65, 0, 0)
    assert adapter_for(default).shape(default).parallel  # the preset's default is Pythia's
    for argv, msg in ((["--arch", "neox", "--rotary-pct", "0.3"], "even"), (["--arch", "neox", "--rotary-pct", "0"], "even"),
                      (["--arch", "gpt2", "--rotary-pct", "0.5"], "applies to neox"),
                      (["--arch", "llama", "--parallel-residual", "off"], "applies to neox")):
        assert main(["train", *argv, "--data", str(text_file), "-o", str(tmp_path / "bad")]) == 2, argv
        assert msg in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
