"""Merging a model with exact copies of itself gives its function, at the float32 tolerance, on GPT-2, Llama
and ViT.

Planted: A (float32), g1·A (a permutation of the residual stream, heads and FFN units) and g2·A (a random
element of every family, the residual scale included: what `symmerge transform` plants by default), merged
by `symmerge merge` with its default families, which leave the residual scale out. The merge brings every
model to the first one's residual scale (`match.many.scale_gauge`); negative controls: without that step
the head maps absorb part of g2's scale and the merge misses A's function, and the plain average of the
three is far from it.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from checks import assert_different_function, assert_same_function, gap, stock
from factories import example_inputs, make_model, save_model
from symmerge.cli import main
from symmerge.match import many
from symmerge.store.model import load_model
from symmerge.store.model import save_model as save_canonical


@pytest.fixture(scope="module", params=["gpt2", "llama", "vit"])
def planted(request, tmp_path_factory):
    arch = request.param
    root = tmp_path_factory.mktemp(f"planted-{arch}")
    a = save_model(make_model(arch, 0, dtype=torch.float32), root / "a")
    assert main(["transform", str(a), "-o", str(root / "g1a"), "--seed", "3", "--groups",
                 "residual_perm,head_perm,ffn_perm"]) == 0
    assert main(["transform", str(a), "-o", str(root / "g2a"), "--seed", "5"]) == 0
    return arch, [a, root / "g1a", root / "g2a"]


def _eps(folder) -> float:
    config = json.loads((folder / "config.json").read_text())
    return next(v for k, v in config.items() if k in ("layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps"))


def _merge(paths, out, *extra) -> dict:
    rep = out.with_suffix(".json")
    assert main(["merge", *map(str, paths), "-o", str(out), "--json", str(rep), *extra]) == 0
    return json.loads(rep.read_text())


def test_merging_exact_copies_gives_the_function(planted, tmp_path):
    arch, paths = planted
    x = example_inputs(arch)
    out, al = tmp_path / "m", tmp_path / "al"
    rep = _merge(paths, out, "--aligned", str(al))
    assert_same_function(stock(out), stock(paths[0]), x, dtype=torch.float32, what="merged vs A")
    for i, p in enumerate(paths, start=1):
        assert_same_function(stock(al / str(i)), stock(p), x, dtype=torch.float32, what=f"aligned {i}")
    assert rep["objective"][-1] > 1 - 1e-9 and rep["converged"]
    planted_scale = math.sqrt(_eps(paths[2]) / _eps(paths[0]))  # transform writes eps·a²
    assert planted_scale > 1.01 or planted_scale < 0.99
    assert rep["scale_gauge"][:2] == pytest.approx([1.0, 1.0], rel=1e-6)
    assert rep["scale_gauge"][2] == pytest.approx(1 / planted_scale, rel=1e-5)
    plain = [load_model(p) for p in paths]  # negative control: the plain average
    save_canonical(plain[0], {k: sum(m.params[k] for m in plain) / 3 for k in plain[0].params}, tmp_path / "plain")
    assert_different_function(stock(tmp_path / "plain"), stock(paths[0]), x, dtype=torch.float32, what="plain average")


def test_without_one_residual_scale_the_copies_do_not_merge(planted, tmp_path, monkeypatch):
    """Negative control of the scale gauge: the matched families alone leave g2's scale, partly absorbed by
    the head maps, and the merge misses A's function by more than the tolerance."""
    arch, paths = planted
    monkeypatch.setattr(many, "scale_gauge", lambda *args: None)
    rep = _merge(paths, tmp_path / "m")
    assert "scale_gauge" not in rep and rep["objective"][-1] < 1 - 1e-6
    assert gap(stock(tmp_path / "m"), stock(paths[0]), example_inputs(arch), dtype=torch.float32) > 2
