"""`symmerge inspect` and `symmerge transform` end to end, through stock `from_pretrained`, in float32,
on configurations the property tests never built; and bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import transformers as T
from safetensors.torch import load_file, save_file

from checks import assert_different_function, assert_same_function, precision
from factories import logits
from symmerge.cli import main


def _train_a_little(model, inputs_fn, steps: int = 20):
    """A few optimiser steps so the weights are not at their initialisation (norm params move too)."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        batch = inputs_fn(gen)
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _lm_batch(vocab):
    return lambda gen: {"input_ids": (ids := torch.randint(0, vocab, (4, 16), generator=gen)), "labels": ids}


def _vit_batch(gen):
    return {"pixel_values": torch.randn(4, 3, 16, 16, generator=gen), "labels": torch.randint(0, 5, (4,), generator=gen)}


def other_models():
    """Shapes unlike tests/factories.py: Pythia-style partial rotary, GQA Llama with tied embeddings, ViT."""
    return {
        "neox": (lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
            hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=256, vocab_size=97,
            max_position_embeddings=64, rotary_pct=0.25, bos_token_id=0, eos_token_id=0)), _lm_batch(97)),
        "llama_gqa_tied": (lambda: T.LlamaForCausalLM(T.LlamaConfig(
            hidden_size=48, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, intermediate_size=96,
            vocab_size=97, max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
            pad_token_id=None)), _lm_batch(97)),
        "vit": (lambda: T.ViTForImageClassification(T.ViTConfig(
            hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, image_size=16,
            patch_size=4, num_channels=3, num_labels=5)), _vit_batch),
    }


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    out = {}
    for name, (make, batch_fn) in other_models().items():
        torch.manual_seed(1)
        model = _train_a_little(make(), batch_fn)
        model.config.architectures = [type(model).__name__]
        model.save_pretrained(root / name)
        out[name] = (root / name, batch_fn(torch.Generator().manual_seed(99)))
    return out


@pytest.mark.parametrize("name", ["neox", "llama_gqa_tied", "vit"])
def test_transform_preserves_function_of_unseen_checkpoints(name, trained, tmp_path, capsys):
    src, batch = trained[name]
    before = _digest(src)
    assert main(["inspect", str(src), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    cls = getattr(T, json.loads((src / "config.json").read_text())["architectures"][0])
    assert info["parameters"] == sum(p.numel() for p in cls.from_pretrained(src).parameters())
    assert info["group_dimension"] > 0 and info["families"][0]["family"] == "residual_rotation"
    assert main(["inspect", str(src)]) == 0
    text = capsys.readouterr().out
    assert "residual_rotation" in text and "ffn_perm" in text and f"{info['parameters']:,} parameters" in text
    assert "residual_perm" in text and any("residual_perm" in n for n in info["notes"])  # the selectable subgroup

    out = tmp_path / "out"
    assert main(["transform", str(src), "-o", str(out), "--seed", "7"]) == 0
    assert _digest(src) == before, "transform modified its input"

    ref_model, new_model = cls.from_pretrained(src).eval(), cls.from_pretrained(out).eval()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    ref = logits(ref_model, inputs)
    # float32 checkpoints; 100 ulps of the logits' scale (seen: under 5), tighter than the 1e-4 relative it had
    assert_same_function(new_model, ref, inputs, dtype=precision(ref_model), ulps=100, what=f"transformed {name}")

    # every attention and FFN matrix changed by more than half its norm
    a_sd, b_sd = ref_model.state_dict(), new_model.state_dict()
    mats = [k for k, v in a_sd.items() if v.dim() == 2 and any(s in k for s in ("attn", "attention", "mlp"))]
    assert mats
    for k in mats:
        assert float((b_sd[k] - a_sd[k]).norm()) > 0.5 * float(a_sd[k].norm()), k

    # negative control: the same weights with one reader's residual axis left unrotated
    broken = dict(b_sd)
    k = next(k for k in mats if "q" in k.split(".")[-2] or "query" in k)
    broken[k] = a_sd[k]
    new_model.load_state_dict(broken)
    with torch.no_grad():
        assert float((new_model(**inputs).logits - ref).abs().max()) > 1e-3


def test_transform_groups_subset_and_refusals(trained, tmp_path, capsys):
    src, _ = trained["neox"]
    out = tmp_path / "o"
    assert main(["transform", str(src), "-o", str(out), "--groups", "ffn_perm,head_perm"]) == 0
    # a second run into the same folder is refused, and --force replaces it
    assert main(["transform", str(src), "-o", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["transform", str(src), "-o", str(out), "--force", "--seed", "3"]) == 0
    assert main(["transform", str(src), "-o", str(tmp_path / "x"), "--groups", "glu_scale"]) == 2
    assert "no glu_scale" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# --- bad input ------------------------------------------------------------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _expect_error(args, capsys, fragment: str, out: Path) -> str:
    """The error line of `args`, which exits 2 with `fragment` in it and leaves nothing at `out`."""
    capsys.readouterr()  # drop what the set-up printed
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # progress bars may precede it
    assert err.startswith("symmerge ") and fragment in err, err
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*")), "partial output left behind"
    return err


def test_bad_inputs(trained, tmp_path, capsys):
    src, _ = trained["llama_gqa_tied"]
    out = tmp_path / "out"
    _expect_error(["transform", str(tmp_path / "nope"), "-o", str(out)], capsys, "not a folder", out)

    no_cfg = _copy(src, tmp_path / "no_cfg")
    (no_cfg / "config.json").unlink()
    _expect_error(["transform", str(no_cfg), "-o", str(out)], capsys, "no config.json", out)

    no_w = _copy(src, tmp_path / "no_w")
    (no_w / "model.safetensors").unlink()
    _expect_error(["transform", str(no_w), "-o", str(out)], capsys, "no model.safetensors", out)

    pickled = _copy(src, tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    _expect_error(["transform", str(pickled), "-o", str(out)], capsys, "never unpickles", out)

    trunc = _copy(src, tmp_path / "trunc")
    data = (trunc / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(data[: len(data) // 2])
    _expect_error(["transform", str(trunc), "-o", str(out)], capsys, "truncated", out)

    mismatch = _copy(src, tmp_path / "mismatch")
    cfg = json.loads((mismatch / "config.json").read_text())
    cfg["intermediate_size"] = 100
    (mismatch / "config.json").write_text(json.dumps(cfg))
    _expect_error(["transform", str(mismatch), "-o", str(out)], capsys, "config.json implies", out)

    nan = _copy(src, tmp_path / "nan")
    sd = load_file(str(nan / "model.safetensors"))
    key = next(k for k in sd if "up_proj" in k)
    sd[key][0, 0] = float("nan")
    save_file(sd, str(nan / "model.safetensors"), metadata={"format": "pt"})
    _expect_error(["transform", str(nan), "-o", str(out)], capsys, "NaN", out)


def test_unsupported_and_symmetry_breaking(tmp_path, capsys):
    out = tmp_path / "out"
    bert = T.BertForMaskedLM(T.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=32, vocab_size=50))
    bert.config.architectures = ["BertForMaskedLM"]
    bert.save_pretrained(tmp_path / "bert")
    _expect_error(["inspect", str(tmp_path / "bert")], capsys, "post-norm", out)

    opt = T.OPTForCausalLM(T.OPTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32,
                                       vocab_size=50, word_embed_proj_dim=16))
    opt.config.architectures = ["OPTForCausalLM"]
    opt.save_pretrained(tmp_path / "opt")
    err = _expect_error(["inspect", str(tmp_path / "opt")], capsys, "OPTForCausalLM is not supported; supported: ", out)
    assert "GPT2LMHeadModel" in err.split("supported: ")[-1]


def test_the_largest_spread_still_preserves_the_function(trained, tmp_path):
    """--spread is capped where a float32 output still computes its input's function; past the cap (the
    library call the CLI refuses) it does not: the cap is where the conditioning breaks, not arbitrary."""
    from symmerge.algebra.apply import apply
    from symmerge.algebra.elements import random_element
    from symmerge.commands.transform import SPREAD_MAX
    from symmerge.store.model import load_model, save_model

    src, batch = trained["llama_gqa_tied"]
    cls = T.LlamaForCausalLM
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    ref_model = cls.from_pretrained(src).eval()
    ref = logits(ref_model, inputs)
    out = tmp_path / "out"
    assert main(["transform", str(src), "-o", str(out), "--spread", f"{SPREAD_MAX:g}"]) == 0
    assert_same_function(cls.from_pretrained(out).eval(), ref, inputs, dtype=precision(ref_model), ulps=1e3,
                         what=f"transformed at --spread {SPREAD_MAX:g}")
    with pytest.raises(SystemExit) as refused:  # argparse's usage error
        main(["transform", str(src), "-o", str(tmp_path / "no"), "--spread", f"{SPREAD_MAX * 1.01:g}"])
    assert refused.value.code == 2 and not (tmp_path / "no").exists()
    m = load_model(src)  # negative control: 1e4 x the cap, through the library
    save_model(m, apply(m.spec, random_element(m.spec, torch.Generator().manual_seed(0), None, SPREAD_MAX * 1e4),
                        m.params), tmp_path / "far")
    assert_different_function(cls.from_pretrained(tmp_path / "far").eval(), ref, inputs, dtype=precision(ref_model),
                              factor=10, what="transformed far past the cap")
