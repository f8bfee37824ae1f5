"""Interpolation and the barrier harness, checked against the stock forward."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import SHARED_DATA
from symmerge import SymmergeError
from symmerge.apply import apply
from symmerge.barrier import barrier
from symmerge.cli import main
from symmerge.data import load_batches
from symmerge.merge import check_compatible, interpolate
from symmerge.model import build_hf_model, export_state_dict, load_model
from symmerge.spec import random_element
from symmerge.train import TrainArgs, train


@pytest.fixture(scope="module")
def trained_gpt2(tmp_path_factory):
    """A tiny character-level GPT-2 trained by symmerge on a slice of Tiny Shakespeare, and test batches."""
    root = tmp_path_factory.mktemp("pair")
    text = root / "shakespeare.txt"
    text.write_text((SHARED_DATA / "tinyshakespeare.txt").read_text()[:30000])
    train(TrainArgs(arch="gpt2", preset="tiny", data=str(text), seed=0, out=str(root / "a"), steps=150,
                    lr=1e-2, progress=False))
    return root / "a", load_batches(root / "a", str(text), "test", batch_size=4, max_batches=3)


def test_interpolate_same_model_is_identity(model_dirs):
    a = load_model(model_dirs["llama"])
    mid = interpolate(a.params, a.params, 0.37)
    for k, v in a.params.items():
        assert torch.allclose(mid[k], v, rtol=0, atol=1e-15), k
    assert interpolate(a.params, a.params, 0.0) is not a.params


def test_barrier_of_a_model_with_itself_is_zero(trained_gpt2):
    path, batches = trained_gpt2
    a = load_model(path)
    r = barrier(a, a, batches, points=5, progress=False)
    assert abs(r["barrier"]) < 1e-6 and abs(r["accuracy_barrier"]) < 1e-9
    assert len(r["lambdas"]) == 5 and max(r["loss"]) - min(r["loss"]) < 1e-6


def test_barrier_endpoints_equal_stock_forward(trained_gpt2):
    path, batches = trained_gpt2
    a = load_model(path)
    g = random_element(a.spec, torch.Generator().manual_seed(0))
    b = load_model(path)
    b.params = apply(b.spec, g, a.params)
    r = barrier(a, b, batches, points=3, progress=False)
    import transformers as T

    stock = T.GPT2LMHeadModel.from_pretrained(path).eval()
    with torch.no_grad():
        losses = [float(stock(**bt).loss) for bt in batches]  # HF's own shifted cross-entropy
    mean = sum(losses) / len(losses)  # equal-sized batches: mean of means = mean per token
    assert abs(r["loss"][0] - mean) < 1e-4 and abs(r["loss"][-1] - mean) < 1e-4
    # plain averaging of a model with a transformed copy of itself is far off the line
    assert r["barrier"] > max(0.2, 5 * r["loss_se"][1]), r
    assert r["barrier_lambda"] == 0.5


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


def test_interpolated_export_is_the_stock_model_of_the_average(model_dirs):
    """The midpoint written by export computes what HF computes on the averaged canonical weights."""
    a = load_model(model_dirs["vit"])
    g = random_element(a.spec, torch.Generator().manual_seed(2))
    pb = apply(a.spec, g, a.params)
    mid = interpolate(a.params, pb, 0.5)
    cfg, sd = export_state_dict(a, mid)
    hf = build_hf_model(cfg, sd, a.shape.hf_class)
    assert json.loads(cfg.to_json_string())["layer_norm_eps"] == pytest.approx(float(mid["norm.eps"]))
    assert all(torch.equal(hf.state_dict()[k], v) for k, v in sd.items())


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
