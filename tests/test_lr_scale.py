"""`--lr-scale FAMILY=FACTOR`: a family's Adam rate is FACTOR times the run's (the others' unchanged); the
factors are checked, change nothing when all are 1, and a resumed run keeps them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from factories import lm_batches
from learned_common import CONTINUOUS, quick
from symmerge import SymmergeError
from symmerge.algebra.elements import random_element
from symmerge.match.learn_config import parse_lr_scale
from symmerge.match.learn_loop import Interrupted
from symmerge.match.learned import learn
from symmerge.match.learner import Learner, rate_groups, trainables

pytestmark = pytest.mark.usefixtures("one_thread")


def test_parse_lr_scale():
    assert parse_lr_scale(None) == {} and parse_lr_scale("") == {}
    assert parse_lr_scale("residual_rotation=3, ov_map=0.25") == {"residual_rotation": 3.0, "ov_map": 0.25}
    for bad, says in (("residual_rotation", "FAMILY=FACTOR"), ("=3", "FAMILY=FACTOR"), ("ov_map=0", "above 0"),
                      ("ov_map=-1", "above 0"), ("ov_map=nan", "finite"), ("ov_map=x", "not a number"),
                      ("ov_map=1,ov_map=2", "twice")):
        with pytest.raises(SymmergeError, match=says):
            parse_lr_scale(bad)


def test_groups_follow_the_families(pair):
    a, b = pair
    learner = Learner(a, b, quick(method="dual"), None)
    names = list(trainables(learner.slots))
    assert rate_groups(learner.slots, learner.spec, None) == [(1.0, names)]  # no factor: one group, same order
    groups = dict(rate_groups(learner.slots, learner.spec, "residual_rotation=3"))
    assert sorted(groups) == [1.0, 3.0] and sorted(groups[1.0] + groups[3.0]) == sorted(names)
    assert groups[3.0] and all(".residual.rotation." in f".{n}." for n in groups[3.0])
    with pytest.raises(SymmergeError, match="ffn_perm, not learned here"):  # dual keeps permutations fixed
        rate_groups(learner.slots, learner.spec, "ffn_perm=2")


def test_a_factor_scales_that_family_only(pair):
    """On a planted problem (B = g*·A, so every step helps and the best state is the last): factor 1 for every
    family is the run with none; a tiny factor freezes its family and leaves the others learning; factor 2 is
    another run (negative control)."""
    a, _ = pair
    b = a.moved(random_element(a.spec, torch.Generator().manual_seed(5), CONTINUOUS, spread=1.5))
    train, val = lm_batches(3, 0), lm_batches(1, 1)
    cfg = quick(method="dual", lr=0.02, steps=6, lam_range=(0.5, 0.5))
    base = learn(a, b, train, val, cfg)
    ones = learn(a, b, train, val, dataclasses.replace(cfg, lr_scale="residual_rotation=1,ov_map=1"))
    for side in ("A", "B"):
        for n, t in base.elements[side].items():
            assert torch.equal(t, ones.elements[side][n]), n
    frozen = learn(a, b, train, val, dataclasses.replace(cfg, lr_scale="residual_rotation=1e-12"))
    doubled = learn(a, b, train, val, dataclasses.replace(cfg, lr_scale="residual_rotation=2"))
    rot, ov = "residual.rotation", "blocks.0.ov"

    def change(r, n):
        return float((r.elements["A"][n] - torch.eye(r.elements["A"][n].shape[-1], dtype=r.elements["A"][n].dtype))
                     .abs().max())

    assert change(base, rot) > 1e-4 and change(frozen, rot) < 1e-9  # A's side starts at the identity
    assert change(frozen, ov) > 1e-4
    assert not torch.equal(doubled.elements["A"][rot], base.elements["A"][rot])


def test_resume_keeps_the_factors(pair, tmp_path):
    a, b = pair
    init = random_element(b.spec, torch.Generator().manual_seed(6))
    train, val = lm_batches(3, 0), lm_batches(1, 1)
    cfg = quick(method="dual", steps=8, lr=0.1, checkpoint_every=100, lr_scale="ov_map=3")
    whole = learn(a, b, train, val, cfg, init=init)
    with pytest.raises(Interrupted):
        learn(a, b, train, val, cfg, init=init, checkpoint=tmp_path / "cut", on_step=lambda step: step == 4)
    resumed = learn(a, b, train, val, cfg, init=init, checkpoint=tmp_path / "cut", resume=True)
    for n, t in whole.elements["B"].items():
        assert torch.equal(t, resumed.elements["B"][n]), n
    with pytest.raises(SymmergeError, match="lr_scale"):  # another factor is another run
        learn(a, b, train, val, dataclasses.replace(cfg, lr_scale="ov_map=2"), init=init, checkpoint=tmp_path / "cut",
              resume=True)


def test_many_models_take_the_factors(tmp_path):
    """`merge` runs the pair's loop: a tiny factor freezes its family in every model, the others learn."""
    from factories import make_model, save_model
    from symmerge.match.learn_many import learn_many
    from symmerge.store.model import load_model

    a = load_model(save_model(make_model("gpt2", 0), tmp_path / "a"))
    models = [a] + [a.moved(random_element(a.spec, torch.Generator().manual_seed(s), CONTINUOUS, spread=1.0))
                    for s in (5, 6)]
    cfg = quick(method="dual", groups=CONTINUOUS, lr=0.02, steps=6, eval_every=2)
    train, val = lm_batches(3, 0), lm_batches(2, 1)
    def run(**kw):
        return learn_many(models, [0.4, 0.3, 0.3], train, val, dataclasses.replace(cfg, **kw)).elements

    start, free, frozen = run(steps=0), run(), run(lr_scale="residual_rotation=1e-12")
    rot, ov = "residual.rotation", "blocks.0.ov"
    assert all(torch.allclose(frozen[i][rot], start[i][rot], atol=1e-9) for i in range(3))
    assert not all(torch.allclose(free[i][rot], start[i][rot], atol=1e-4) for i in range(3))
    assert not all(torch.allclose(frozen[i][ov], start[i][ov], atol=1e-4) for i in range(3))
