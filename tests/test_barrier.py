"""Interpolation and the barrier harness, checked against the stock forward."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from checks import assert_different_function, assert_same_function, stock
from conftest import shared_data
from factories import example_inputs
from symmerge import SymmergeError
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.cli import main
from symmerge.data.batches import load_batches
from symmerge.evaluation.barrier_pair import barrier
from symmerge.evaluation.forward import interpolate
from symmerge.store.compatible import check_compatible
from symmerge.store.model import build_hf_model, export_state_dict, load_model, save_model
from symmerge.training.trainer import TrainArgs, train


@pytest.fixture(scope="module")
def trained_gpt2(tmp_path_factory):
    """A tiny character-level GPT-2 trained by symmerge on a slice of Tiny Shakespeare, and test batches."""
    root = tmp_path_factory.mktemp("pair")
    text = root / "shakespeare.txt"
    text.write_text(shared_data("tinyshakespeare.txt").read_text()[:30000])
    train(TrainArgs(arch="gpt2", preset="tiny", data=str(text), seed=0, out=str(root / "a"), steps=150,
                    lr=1e-2, progress=False))
    return root / "a", load_batches(root / "a", str(text), "test", batch_size=4, max_batches=3)


def test_interpolate_same_model_is_identity(model_dirs):
    a = load_model(model_dirs["llama"])
    mid = interpolate(a.params, a.params, 0.37)
    for k, v in a.params.items():
        assert torch.allclose(mid[k], v, rtol=0, atol=1e-15), k
    assert interpolate(a.params, a.params, 0.0) is not a.params
    # negative control: B = A with its largest tensor doubled: the midpoint moves by 0.37 of that tensor
    key = max(a.params, key=lambda k: float(a.params[k].abs().max()))
    moved = interpolate(a.params, {**a.params, key: 2 * a.params[key]}, 0.37)
    assert float((moved[key] - a.params[key]).abs().max()) > 0.3 * float(a.params[key].abs().max()) > 1e-15


def test_barrier_of_a_model_with_itself_is_zero(trained_gpt2):
    path, batches = trained_gpt2
    a = load_model(path)
    r = barrier(a, a, batches, points=5, progress=False)
    assert abs(r["barrier"]) < 1e-6 and abs(r["accuracy_barrier"]) < 1e-9
    assert len(r["lambdas"]) == 5 and max(r["loss"]) - min(r["loss"]) < 1e-6
    # negative control: a transformed copy of A as B (plain averaging is off the line) on one batch
    b = load_model(path)
    b.params = apply(b.spec, random_element(a.spec, torch.Generator().manual_seed(0), spread=8.0), a.params)
    assert barrier(a, b, batches[:1], points=3, progress=False)["barrier"] > 0.05


def test_barrier_endpoints_equal_stock_forward(trained_gpt2):
    """The endpoints' losses are HF's own; plain averaging of a model with a transformed copy of itself is
    far off the line: over three planted elements (spread 8, all test batches) every midpoint stands more
    than 5 standard errors above the line and they stand 0.2 nats above it on average. (One element on
    3 batches was borderline: its barrier scatters from 0.16 to 0.45 nats with the draw, its standard
    error is 0.04 on 3 batches.)"""
    import transformers as T

    path, _ = trained_gpt2
    batches = load_batches(path, str(path.parent / "shakespeare.txt"), "test", batch_size=4)
    batches = [bt for bt in batches if bt["input_ids"].shape == batches[0]["input_ids"].shape]  # full ones
    assert len(batches) >= 10
    stock = T.GPT2LMHeadModel.from_pretrained(path).eval()
    with torch.no_grad():
        outs = [stock(**bt) for bt in batches]
    losses = [float(o.loss) for o in outs]  # HF's own shifted cross-entropy
    mean = sum(losses) / len(losses)  # equal-sized batches: mean of means = mean per token
    # negative control: the cross-entropy with the labels not shifted (each position scored on its own token)
    unshifted = sum(float(F.cross_entropy(o.logits.flatten(0, 1), bt["labels"].flatten()))
                    for o, bt in zip(outs, batches)) / len(batches)
    a = load_model(path)
    barriers = []
    for seed in (0, 1, 2):
        b = load_model(path)
        b.params = apply(b.spec, random_element(a.spec, torch.Generator().manual_seed(seed), spread=8.0), a.params)
        r = barrier(a, b, batches, points=3, progress=False)
        assert abs(r["loss"][0] - mean) < 1e-4 and abs(r["loss"][-1] - mean) < 1e-4, (seed, r)
        assert abs(r["loss"][0] - unshifted) > 0.1, (unshifted, r)
        assert r["barrier_lambda"] == 0.5 and r["barrier"] > 5 * r["loss_se"][1], (seed, r)
        barriers.append(r["barrier"])
    assert sum(barriers) / len(barriers) > 0.2, barriers


def test_barrier_refine_adds_points(trained_gpt2):
    path, batches = trained_gpt2
    a = load_model(path)
    b = load_model(path)
    b.params = apply(b.spec, random_element(b.spec, torch.Generator().manual_seed(1)), a.params)
    r = barrier(a, b, batches[:1], points=5, refine=True, progress=False)
    assert len(r["lambdas"]) == 9 and r["lambdas"] == sorted(r["lambdas"])


def test_interpolate_cli_and_errors(model_dirs, tmp_path, capsys):
    a, b = model_dirs["gpt2"], model_dirs["gpt_neox"]
    out = tmp_path / "mid"
    assert main(["interpolate", str(a), str(a), "--lam", "0.3", "-o", str(out)]) == 0
    ma, mo = load_model(a), load_model(out)
    for k in ma.params:
        assert torch.allclose(ma.params[k], mo.params[k], atol=1e-12), k
    capsys.readouterr()
    assert main(["interpolate", str(a), str(b), "--lam", "0.5", "-o", str(tmp_path / "x")]) == 2
    assert "same architecture" in capsys.readouterr().err
    assert main(["interpolate", str(a), str(a), "--lam", "1.5", "-o", str(tmp_path / "x")]) == 2
    assert "outside [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_incompatible_shapes_name_the_mismatch(model_dirs):
    with pytest.raises(SymmergeError, match="widths|FFN widths|head"):
        check_compatible(load_model(model_dirs["llama"]), load_model(model_dirs["llama_untied"]))


def _set_norm_eps(hf_model, eps: float) -> None:
    """Point every normalisation layer of a stock model at `eps` (the negative control's wrong eps)."""
    for module in hf_model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = eps
        elif hasattr(module, "variance_epsilon"):
            module.variance_epsilon = eps


def test_interpolated_export_is_the_stock_model_of_the_average(model_dirs, tmp_path):
    """`symmerge interpolate` writes a checkpoint whose stock `from_pretrained` model computes what the
    interpolated canonical parameters compute through the stock forward (norm eps included: the planted
    residual scale moves it). Negative controls: the checkpoint's config with A's eps, and another λ."""
    a = load_model(model_dirs["vit"])
    g = random_element(a.spec, torch.Generator().manual_seed(2))
    g["residual.scale"] = torch.tensor(0.05, dtype=torch.float64)  # a small scale: eps matters
    b = load_model(model_dirs["vit"])
    b.params = apply(a.spec, g, a.params)
    save_model(b, b.params, tmp_path / "b")
    assert main(["interpolate", str(model_dirs["vit"]), str(tmp_path / "b"), "--lam", "0.5", "-o", str(tmp_path / "mid")]) == 0
    x = example_inputs("vit")

    def canonical(lam):  # the interpolated canonical parameters through the stock forward, in memory
        return build_hf_model(*export_state_dict(a, interpolate(a.params, b.params, lam)), a.shape.hf_class)

    written = stock(tmp_path / "mid")
    assert json.loads((tmp_path / "mid" / "config.json").read_text())["layer_norm_eps"] == pytest.approx(
        float(interpolate(a.params, b.params, 0.5)["norm.eps"]))
    assert_same_function(written, canonical(0.5), x, what="interpolate's checkpoint")
    assert_different_function(written, canonical(0.3), x, what="the midpoint at another λ")
    _set_norm_eps(written, a.shape.eps)
    assert_different_function(written, canonical(0.5), x, factor=10, what="the midpoint with A's eps")


def test_barrier_cli_json_plot_and_errors(trained_gpt2, model_dirs, tmp_path, capsys):
    path, _ = trained_gpt2
    text = path.parent / "shakespeare.txt"
    moved = tmp_path / "moved"
    assert main(["transform", str(path), "-o", str(moved), "--seed", "1"]) == 0
    report, png = tmp_path / "r.json", tmp_path / "r.png"
    assert main(["barrier", str(path), str(moved), "--data", str(text), "--points", "5", "--max-batches", "2",
                 "--json", str(report), "--plot", str(png)]) == 0
    r = json.loads(report.read_text())
    for key in ("barrier", "lambdas", "loss", "accuracy", "accuracy_barrier"):
        assert key in r
    assert r["lambdas"] == [0.0, 0.25, 0.5, 0.75, 1.0] and len(r["loss"]) == 5
    assert abs(r["loss"][0] - r["loss"][-1]) < 1e-4  # the transformed copy computes the same function
    assert abs(r["loss"][2] - r["loss"][0]) > 1e-2  # negative control: the midpoint, another function
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"

    capsys.readouterr()
    # different architectures
    assert main(["barrier", str(path), str(model_dirs["gpt_neox"]), "--data", str(text)]) == 2
    assert "same architecture" in capsys.readouterr().err
    # a model folder without a tokenizer
    assert main(["barrier", str(model_dirs["gpt2"]), str(model_dirs["gpt2"]), "--data", str(text)]) == 2
    assert "tokenizer" in capsys.readouterr().err


def test_barrier_on_checkpoints_symmerge_did_not_train(tmp_path, capsys):
    """A stock HF ViT saved with its own image processor: the harness needs nothing symmerge wrote."""
    import transformers as T

    cfg = T.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      image_size=8, patch_size=4, num_channels=1, num_labels=10)
    proc = T.ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5])
    for seed in (0, 1):
        torch.manual_seed(seed)
        T.ViTForImageClassification(cfg).save_pretrained(tmp_path / f"m{seed}")
        proc.save_pretrained(tmp_path / f"m{seed}")
    report = tmp_path / "r.json"
    assert main(["barrier", str(tmp_path / "m0"), str(tmp_path / "m1"), "--data", "digits", "--points", "3",
                 "--max-batches", "2", "--json", str(report)]) == 0
    r = json.loads(report.read_text())
    stock = T.ViTForImageClassification.from_pretrained(tmp_path / "m0").eval()
    batches = load_batches(tmp_path / "m0", "digits", "test", batch_size=8, max_batches=2)
    with torch.no_grad():
        loss = sum(float(stock(**b).loss) for b in batches) / len(batches)
    assert abs(r["loss"][0] - loss) < 1e-5
    assert abs(r["loss"][-1] - loss) > 1e-3  # negative control: the other endpoint, another model


def test_planted_element_aligned_back_has_no_barrier(trained_gpt2, tmp_path):
    """transform (every group) then `align --groups all`: the path from A to the aligned copy is flat (< 1e-4),
    while the path to the transformed copy is not (negative control)."""
    path, test = trained_gpt2
    moved, back = tmp_path / "moved", tmp_path / "back"
    assert main(["transform", str(path), "-o", str(moved), "--seed", "3"]) == 0
    assert main(["align", str(path), str(moved), "-o", str(back), "--groups", "all"]) == 0
    a = load_model(path)
    assert barrier(a, load_model(back), test, points=5, progress=False)["barrier"] < 1e-4
    assert barrier(a, load_model(moved), test, points=5, progress=False)["barrier"] > 0.05
