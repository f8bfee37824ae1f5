"""Interpolation and the barrier harness, checked against the stock forward."""

from __future__ import annotations

import json

import pytest
import torch

from factories import make_model
from symmerge import SymmergeError
from symmerge.apply import apply
from symmerge.barrier import barrier
from symmerge.cli import main
from symmerge.merge import check_compatible, interpolate
from symmerge.model import build_hf_model, export_state_dict, load_model
from symmerge.spec import random_element


def _train(model, batches, steps=60, lr=3e-3):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for i in range(steps):
        b = batches[i % len(batches)]
        loss = model(**b).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _copy_task(n=16, seq=12, vocab=61, seed=0):
    """Sequences that repeat their first half: learnable, so a trained model has low loss."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        half = torch.randint(0, vocab, (4, seq // 2), generator=gen)
        ids = torch.cat([half, half], 1)
        out.append({"input_ids": ids, "labels": ids})
    return out


@pytest.fixture(scope="module")
def trained_gpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    batches = _copy_task()
    m = _train(make_model("gpt2", seed=3, dtype=torch.float32), batches)
    m.save_pretrained(root / "a")
    return root / "a", _copy_task(n=4, seed=1)


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
    assert r["barrier"] > 0.5, r
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
