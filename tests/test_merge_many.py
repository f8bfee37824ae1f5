"""Merging many models and the barrier of many models, against the stock transformers forward.

Planted: A (a tiny ViT trained on digits) and g1·A, g2·A (random elements of the default families).
Merging the three gives A's function, the aligned endpoints their inputs' functions, and the average
of the aligned three has no excess; plain averaging of the same three is well above (negative control).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
import transformers as T

from checks import assert_same_function
from factories import make_model, save_model
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.algebra.simplex import dirichlet
from symmerge.cli import main
from symmerge.data.batches import load_batches
from symmerge.evaluation.barrier_many import many_barrier
from symmerge.match.many import objective, weight_match_many
from symmerge.store.model import load_model
from symmerge.store.model import save_model as save_canonical
from symmerge.training.trainer import TrainArgs, train

README = Path(__file__).resolve().parents[1] / "README.md"


def _train_vit(out: Path, seed: int) -> Path:
    train(TrainArgs(arch="vit", preset="tiny", data="digits", seed=seed, out=str(out), steps=60, lr=1e-2, progress=False))
    return out


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A trained ViT and two copies moved by planted elements of the default families (stock checkpoints)."""
    root = tmp_path_factory.mktemp("many")
    a = _train_vit(root / "a", 0)
    model = load_model(a)
    fams = model.spec.default_families()
    paths = [a]
    for s in (1, 2):
        g = random_element(model.spec, torch.Generator().manual_seed(s), fams)
        paths.append(save_canonical(model, apply(model.spec, g, model.params), root / f"g{s}a"))
    batches = load_batches(a, "digits", "test", batch_size=8, max_batches=4)
    return root, paths, batches


def _logits(path, batches) -> torch.Tensor:
    m = T.ViTForImageClassification.from_pretrained(path).eval()
    with torch.no_grad():
        return torch.cat([m(pixel_values=b["pixel_values"]).logits.double() for b in batches])


def _monotone(h) -> bool:
    return all(b >= a for a, b in zip(h, h[1:]))


def test_merge_planted_gives_a_function_and_aligned_endpoints_keep_theirs(planted, tmp_path):
    root, paths, batches = planted
    out, al, rep = tmp_path / "m", tmp_path / "al", tmp_path / "r.json"
    assert main(["merge", *map(str, paths), "-o", str(out), "--aligned", str(al), "--json", str(rep),
                 "--max-rounds", "3"]) == 0
    ref = [_logits(p, batches) for p in paths]
    assert_same_function(_logits(out, batches), ref[0], dtype=torch.float32, what="merged vs A")
    for i in range(3):
        assert_same_function(_logits(al / str(i + 1), batches), ref[i], dtype=torch.float32, what=f"aligned {i + 1}")
    # negative control: plain averaging of the same three does not compute A's function
    avg = tmp_path / "plain"
    plain = [load_model(p) for p in paths]
    mean = {k: sum(m.params[k] for m in plain) / 3 for k in plain[0].params}
    save_canonical(plain[0], mean, avg)
    assert float((_logits(avg, batches) - ref[0]).abs().max()) > 0.1 * float(ref[0].abs().max())
    r = json.loads(rep.read_text())
    assert r["command"] == "merge" and r["rounds"] == len(r["objective"]) - 1 >= 1
    assert _monotone(r["objective"]) and r["objective"][0] < 0.9 and r["objective"][-1] > 1 - 1e-9
    assert r["weights"] == [1 / 3] * 3 and len(r["found"]) == 3


def test_barrier_of_three_planted_and_plain(planted, tmp_path):
    root, paths, batches = planted
    al = tmp_path / "al"
    assert main(["merge", *map(str, paths), "-o", str(tmp_path / "m"), "--aligned", str(al), "--max-rounds", "2"]) == 0
    plain, aligned, png = tmp_path / "plain.json", tmp_path / "aligned.json", tmp_path / "tri.png"
    common = ["--data", "digits", "--max-batches", "4", "--points", "3", "--simplex-points", "4"]
    assert main(["barrier", *map(str, paths), *common, "--json", str(plain), "--plot", str(png)]) == 0
    assert main(["barrier", *(str(al / str(i)) for i in (1, 2, 3)), *common, "--json", str(aligned)]) == 0
    p, a = json.loads(plain.read_text()), json.loads(aligned.read_text())
    assert png.stat().st_size > 0 and len(p["triangle"]["points"]) == 66
    # endpoint losses are the stock forward's
    stock = T.ViTForImageClassification.from_pretrained(paths[0]).eval()
    with torch.no_grad():
        loss = sum(float(stock(**b).loss) for b in batches) / len(batches)
    assert abs(p["endpoint_losses"][0] - loss) < 1e-5
    assert abs(a["average_excess"]) < 1e-4 and a["simplex_barrier"] < 1e-4 and a["pairwise_max"] < 1e-4
    assert p["average_excess"] > 0.05 and p["simplex_barrier"] > 0.05 and p["pairwise_max"] > 0.05
    assert p["average_excess"] == pytest.approx(p["average_loss"] - sum(p["endpoint_losses"]) / 3)
    for key in ("average_accuracy_drop", "pairwise_max_accuracy", "simplex_accuracy_barrier"):
        assert key in p and math.isfinite(p[key])


def test_objective_never_decreases_and_matches_its_definition(tmp_path):
    """Three independently initialised GPT-2s: the leave-one-out rounds improve on round 1, never decrease,
    and the streamed objective equals sum_{i<j} w_i w_j ||X_i - X_j||^2 computed in memory."""
    models = [load_model(save_model(make_model("gpt2", s), tmp_path / f"m{s}")) for s in range(3)]
    w = [0.5, 0.3, 0.2]
    spec = models[0].spec
    res = weight_match_many(spec, [m.params for m in models], w, spec.default_families(), max_rounds=3, seed=1)
    h = res.history
    assert _monotone(h) and h[2] > h[1] > h[0], h
    xs = [apply(spec, g, m.params) for g, m in zip(res.elements, models)]
    names = [k for k, t in xs[0].items() if t.dim() > 0]
    pair = sum(w[i] * w[j] * float(((xs[i][k] - xs[j][k]) ** 2).sum())
               for i in range(3) for j in range(i + 1, 3) for k in names)
    norm = sum(w[i] * float((models[i].params[k] ** 2).sum()) for i in range(3) for k in names)
    assert objective(spec, [m.params for m in models], res.elements, w) == pytest.approx(1 - pair / norm, rel=1e-12)
    # negative control: the objective with the weights ignored (equal weights)
    assert objective(spec, [m.params for m in models], res.elements, [1 / 3] * 3) != pytest.approx(1 - pair / norm, rel=1e-6)
    assert h[-1] == pytest.approx(1 - pair / norm, rel=1e-12)


def test_dirichlet_points_lie_on_the_simplex():
    pts = dirichlet(4, 50, seed=3)
    assert all(abs(sum(p) - 1) < 1e-12 and min(p) > 0 for p in pts)
    assert pts == dirichlet(4, 50, seed=3) and pts != dirichlet(4, 50, seed=4)


def test_many_barrier_api_uses_the_weights(planted):
    root, paths, batches = planted
    models = [load_model(p) for p in paths]
    r = many_barrier(models, batches[:2], [1.0, 0.0, 0.0], points=2, simplex_points=2, progress=False)
    assert r["average_excess"] == pytest.approx(0.0, abs=1e-12)  # the average is A itself
    # negative control: equal weights (the weights ignored): the average of the unaligned three is well above
    uniform = many_barrier(models, batches[:2], [1 / 3] * 3, points=2, simplex_points=2, progress=False)
    assert uniform["average_excess"] > 0.05, uniform["average_excess"]


def _readme_block(lang: str, title: str) -> str:
    text = README.read_text()
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)[0]


def test_readme_python_example_runs(planted, tmp_path, monkeypatch, capsys):
    root, paths, batches = planted
    monkeypatch.chdir(tmp_path)
    code = _readme_block("python", "Many models")  # "### Many models" of "Merging many models"
    (tmp_path / "runs").mkdir()
    for i, p in enumerate(paths):  # stand-ins for the README's three trainings (A and two planted copies)
        shutil.copytree(p, tmp_path / "runs" / f"digits-{i}")
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "rounds" in out and (tmp_path / "runs" / "digits-merged" / "config.json").is_file()
