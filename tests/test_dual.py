"""Dual matching: both endpoints keep their functions, the dual path is a one-sided path, its gradients at
the start are twice the one-sided ones, and `align --method dual` end to end on real text."""

from __future__ import annotations

import json

import pytest
import torch

from checks import assert_reported_gap, assert_same_function
from factories import lm_batches
from learned_common import CONTINUOUS, char_pair, logits_of, quick
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.match.learn_config import LearnConfig
from symmerge.match.learned import learn
from symmerge.match.learner import Learner
from symmerge.match.outputs import output_report, save_outputs

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def test_dual_outputs_compute_a_and_b(pair, tmp_path):
    a, b = pair
    init = random_element(b.spec, torch.Generator().manual_seed(4))
    result = learn(a, b, lm_batches(3, 0), lm_batches(1, 1), quick(method="dual", lr=0.2), init=init)
    assert float((result.elements["A"]["residual.rotation"] - torch.eye(24, dtype=torch.float64)).abs().max()) > 1e-3
    assert all(torch.equal(result.elements["B"][n], init[n]) for n in ("blocks.0.heads", "blocks.1.ffn")), \
        "dual matching must keep the absorbed permutations"
    pairs = save_outputs(result, a, b, tmp_path / "dual")
    assert [p[1].name for p in pairs] == ["A", "B"]
    for row in output_report(pairs, a.shape.hf_class, lm_batches(1, 9)[0]):
        assert_reported_gap(row, lm_batches(1, 9)[0])

def test_dual_path_is_a_one_sided_path_moved_by_g_a(pair):
    """The group acts linearly on the weights, so (1 - lam) gA·A + lam gB·B = gA·((1 - lam) A + lam
    (gA^-1 gB)·B): dual matching reaches the same paths (the same losses at every lam) as one-sided
    matching with g = gA^-1 gB; it can differ only in how the optimiser gets there. Stock HF logits,
    float64. Negative control: dropping gA^-1 changes the path."""
    from symmerge.algebra.elements import compose, inverse
    from symmerge.evaluation.forward import interpolate

    a, b = pair
    gen = torch.Generator().manual_seed(5)
    ga = random_element(a.spec, gen, CONTINUOUS)
    gb = random_element(a.spec, gen, CONTINUOUS)
    one_sided = compose(a.spec, inverse(a.spec, ga), gb)  # first gB, then gA^-1
    batch = lm_batches(1, 3)[0]
    for lam in (0.3, 0.5):
        dual = interpolate(apply(a.spec, ga, a.params), apply(a.spec, gb, b.params), lam)
        single = interpolate(a.params, apply(a.spec, one_sided, b.params), lam)
        ref = logits_of(a, single, batch)
        assert_same_function(logits_of(a, dual, batch), ref, dtype=torch.float64, what=f"dual path at {lam}")
        wrong = interpolate(a.params, apply(a.spec, gb, b.params), lam)
        assert float((logits_of(a, wrong, batch) - ref).abs().max()) > 1e-2

@pytest.mark.parametrize("param", ["auto", "expm"])
def test_dual_gradients_at_the_start_are_the_one_sided_gradient_twice(pair, param):
    """At the identity start, dual matching's A-side gradient is minus its B-side gradient, and the
    B-side gradient is one-sided learning's (same start, permutations fixed): the loss depends on
    gA^-1 gB only. So Adam moves both sides by the same step in opposite directions and the relative
    element by twice one-sided learning's step at the same lr. Negative control: a different lambda
    gives different gradients."""
    a, b = pair
    # continuous start: with permutations in it, one-sided maps act before them and dual's after, so
    # the same maps would sit under other head indices
    init = random_element(b.spec, torch.Generator().manual_seed(8), CONTINUOUS)
    batch = lm_batches(1, 4)[0]

    def grads(method, lam):
        learner = Learner(a, b, LearnConfig(method=method, groups=CONTINUOUS, param=param, dtype="float64"), init)
        learner.loss(batch, lam).backward()
        return {k: t.grad.clone() for k, t in learner.trainables().items()}

    dual, single = grads("dual", 0.4), grads("learned", 0.4)
    b_keys = [k for k in dual if k.startswith("B.")]
    assert b_keys and len(b_keys) * 2 == len(dual) and set(b_keys) == set(single)
    for k in b_keys:
        assert float(single[k].abs().max()) > 1e-6, k
        assert torch.allclose(dual[k], single[k], rtol=1e-6, atol=1e-10), k
        assert torch.allclose(dual["A" + k[1:]], -single[k], rtol=1e-6, atol=1e-10), k
    other = grads("learned", 0.7)
    assert any(not torch.allclose(other[k], single[k], rtol=1e-3, atol=1e-8) for k in b_keys)

def test_dual_learner_runs_the_relative_path_with_the_two_sided_loss_and_gradients(pair, monkeypatch):
    """Dual matching runs the path as (1 - lam)·A + lam·(gA^-1 gB)·B (`Learner.relative`: A's tensors are not
    transformed), which is gA^-1 of the two-sided path (1 - lam)·gA·A + lam·gB·B: away from the identity (random
    group parameters on both sides), float64, the loss and every group parameter's gradient equal the two-sided
    path's to 1e-9 relative. Negative control: the relative element without gA^-1 (gB alone) changes the loss."""
    from symmerge.algebra import groups as G

    a, b = pair
    init = random_element(b.spec, torch.Generator().manual_seed(8), CONTINUOUS)
    learner = Learner(a, b, LearnConfig(method="dual", groups=CONTINUOUS, dtype="float64"), init)
    assert learner.relative
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for t in learner.trainables().values():
            t.add_(0.05 * torch.randn(t.shape, generator=gen, dtype=t.dtype))
    batch = lm_batches(1, 4)[0]

    def run():
        params = learner.trainables()
        for t in params.values():
            t.grad = None
        loss = learner.loss(batch, 0.4)
        loss.backward()
        return float(loss.detach()), {k: None if t.grad is None else t.grad.clone() for k, t in params.items()}

    relative = run()
    learner.relative = False
    two_sided = run()
    assert relative[0] == pytest.approx(two_sided[0], rel=1e-9)
    for k, g in two_sided[1].items():
        assert float(g.abs().max()) > 0, k
        assert float((relative[1][k] - g).abs().max()) <= 1e-9 * float(g.abs().max()), k
    learner.relative = True
    monkeypatch.setattr(G, "inverse", lambda group, g: G.identity(group))
    assert abs(run()[0] - two_sided[0]) > 1e-6


def test_learn_releases_the_freed_heap_before_building_the_learner(pair, monkeypatch):
    """The heap freed before the frozen stores are kept (data, the weight-matching start) goes back to the OS
    first (`heap.release_freed_heap`), so it does not stay resident under them for the whole run (the order of
    the two calls is recorded: a release after the build, or none, fails)."""
    import symmerge.match.learned as L

    order = []
    monkeypatch.setattr(L, "release_freed_heap", lambda: order.append("release"))
    real = L.Learner
    monkeypatch.setattr(L, "Learner", lambda *a, **k: order.append("learner") or real(*a, **k))
    a, b = pair
    learn(a, b, lm_batches(1, 0), lm_batches(1, 1), quick(method="dual", steps=1, eval_every=1))
    assert order[:2] == ["release", "learner"]


def test_cli_dual_align_on_real_text(tmp_path, capsys):
    """`symmerge align --method dual` end to end on Tiny Shakespeare characters: OUT/A and OUT/B load
    with stock `from_pretrained` and compute A's and B's logits (1e-4; negative control: B's logits
    differ from A's), the report records the quick recipe's learning rate for dual (half of learned's)
    and the peak lambda sampling asked for, the end-of-run line names the best step and its validation
    barrier, and a validation grid of 2 points is refused with exit code 2 and nothing written."""
    import transformers as T

    from symmerge import cli

    pair, tok, text = char_pair(tmp_path, 20000)
    common = [*pair, "--method", "dual", "--recipe", "quick", "--batch-size", "4",
              "--max-batches", "2", "--val-batches", "1", "--steps", "4", "--eval-every", "2"]
    with pytest.raises(SystemExit) as refused:  # argparse refuses while parsing
        cli.main(["align", *common, "-o", str(tmp_path / "bad"), "--val-points", "2"])
    assert refused.value.code == 2
    assert "at least 3" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    out = tmp_path / "out"
    assert cli.main(["align", *common, "-o", str(out), "--json", str(tmp_path / "r.json"), "--lam-sampling", "peak"]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["settings"]["lr"] == 5e-3 and report["settings"]["method"] == "dual" and report["recipe"] == "quick"
    line = f"best at step {report['best_step']} of 4: validation barrier {report['barrier_after']:.4f}"
    assert line in capsys.readouterr().out and report["end_line"].startswith(line)
    assert report["settings"]["lam_sampling"] == "peak"
    x = {"input_ids": torch.tensor([tok.encode(text[:32])])}

    def run(folder):
        with torch.no_grad():
            return T.AutoModelForCausalLM.from_pretrained(folder).eval()(**x).logits

    for side, src in (("A", "m0"), ("B", "m1")):  # float32 checkpoints
        assert_same_function(run(out / side), run(tmp_path / src), dtype=torch.float32, what=side)
    assert float((run(out / "B") - run(tmp_path / "m0")).abs().max()) > 1e-2


@pytest.mark.parametrize("command", ["align", "merge"])
def test_groups_all_learns_the_residual_scale(tmp_path, command):
    """`--groups all` is every family for the learner as for weight matching: the residual scale is learned (and
    the outputs keep their functions, which `align` checks as it writes them); without `--groups` it stays fixed
    (the default families, the negative control)."""
    from symmerge import cli

    pair, _, _ = char_pair(tmp_path, 20000)
    common = [*pair, "--method", "dual", "--recipe", "quick", "--batch-size", "4", "--max-batches", "2",
              "--val-batches", "1", "--steps", "4", "--eval-every", "2"]
    for groups, learned in ((["--groups", "all"], True), ([], False)):
        out, rep = tmp_path / f"out{learned}", tmp_path / f"r{learned}.json"
        assert cli.main([command, *common, *groups, "-o", str(out), "--json", str(rep)]) == 0
        report = json.loads(rep.read_text())
        params = report["parameterisation"]
        assert ("residual.scale" in params) == learned, params
        assert ("residual.scale" in report["fixed_groups"]) != learned, report["fixed_groups"]
