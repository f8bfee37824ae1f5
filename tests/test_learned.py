"""Learned and dual matching: outputs compute their inputs' functions (stock HF), a planted problem is
solved, resumed runs equal uninterrupted ones, bad input is refused."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from checks import assert_reported_gap, assert_same_function
from factories import ARCHS, STRUCTURES, lm_batches, make_model, save_model
from learned_common import CONTINUOUS, learned_align, logits_of, quick
from symmerge import SymmergeError
from symmerge.algebra import groups as G
from symmerge.algebra.apply import StraightThrough, apply
from symmerge.algebra.elements import random_element
from symmerge.evaluation.barrier_pair import highest_excess
from symmerge.evaluation.forward import StockForward
from symmerge.match.learn_config import LearnConfig, parse_lam_range
from symmerge.match.learn_loop import Interrupted
from symmerge.match.learned import learn
from symmerge.match.learner import Learner
from symmerge.match.objectives import peak_lambda
from symmerge.match.outputs import checkpoint_folder, output_report, save_outputs
from symmerge.store.model import load_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def test_learned_output_computes_b(pair, tmp_path):
    """g·B (continuous groups learned, permutations straight-through, from a random start) is a stock
    HF checkpoint with B's logits to 1e-4."""
    a, b = pair
    init = random_element(b.spec, torch.Generator().manual_seed(3))
    result = learn(a, b, lm_batches(3, 0), lm_batches(1, 1), quick(lr=0.05, steps=12), init=init)
    g = result.elements["B"]
    assert float((g["residual.rotation"] - init["residual.rotation"]).abs().max()) > 1e-3, "nothing was learned"
    report = output_report(save_outputs(result, a, b, tmp_path / "out"), b.shape.hf_class, lm_batches(1, 9)[0])
    assert_reported_gap(report[0], lm_batches(1, 9)[0])
    # negative control: a rotation that does not fix the all-ones vector is not a symmetry of GPT-2
    bad = dict(g, **{"residual.rotation": G._haar_orthogonal(b.shape.d_model, torch.Generator().manual_seed(0))})
    x = lm_batches(1, 9)[0]
    assert float((logits_of(b, apply(b.spec, bad, b.params), x) - logits_of(b, b.params, x)).abs().max()) > 1e-3


def test_planted_problem_is_solved(pair):
    """B = g*·A for a random continuous g*: the midpoint of A and B is poor; learned matching from the
    identity brings the validation midpoint loss back to A's loss (the barrier falls by > 90%)."""
    a, _ = pair
    gstar = random_element(a.spec, torch.Generator().manual_seed(5), CONTINUOUS, spread=1.5)
    b = a.moved(gstar)
    val = lm_batches(2, 1)
    result = learn(a, b, lm_batches(4, 0), val, LearnConfig(groups=CONTINUOUS, steps=60, lr=0.02, eval_every=15,
                                                            lam_range=(0.5, 0.5), grid_points=3, progress=False))
    rep = result.report
    loss_a, mid_before, mid_after = rep["losses_before"][0], rep["losses_before"][1], rep["losses_after"][1]
    assert mid_before - loss_a > 0.2, "the planted problem is too easy to prove anything"
    assert abs(mid_after - loss_a) < 0.1 * (mid_before - loss_a), rep["history"]
    assert rep["barrier_after"] < 0.1 * rep["barrier_before"]
    # the reported barrier is what the returned element gives
    learner = Learner(a, b, LearnConfig(groups=["head_perm"]), None)  # see test_best_state_kept...
    learner.base["B"] = result.elements["B"]
    assert learner.curve(val, [0.5])[0] == pytest.approx(mid_after, abs=1e-6)


@pytest.mark.parametrize("sampling", ["uniform", "peak"])
def test_resume_equals_uninterrupted(pair, tmp_path, sampling):
    """Also with peak sampling, whose lambdas depend on the last validation curve (cut between evaluations)."""
    a, b = pair
    init = random_element(b.spec, torch.Generator().manual_seed(6))
    train, val = lm_batches(3, 0), lm_batches(1, 1)
    cfg = quick(steps=8, lr=0.1, seed=11, checkpoint_every=100, lam_sampling=sampling, lam_range=(0.1, 0.9))
    whole = learn(a, b, train, val, cfg, init=init, checkpoint=tmp_path / "whole")
    with pytest.raises(Interrupted, match="--resume"):
        learn(a, b, train, val, cfg, init=init, checkpoint=tmp_path / "cut", on_step=lambda step: step == 4)
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["plan.json", "state.json", "state.safetensors"]  # no pickles
    taken = []
    resumed = learn(a, b, train, val, cfg, init=init, checkpoint=tmp_path / "cut", resume=True, on_step=taken.append)
    for n, t in whole.elements["B"].items():
        assert torch.equal(t, resumed.elements["B"][n]), n
    assert whole.report["history"] == resumed.report["history"]
    # a deterministic run started over would be equal too: the resumed one took only the steps after the cut
    assert taken == [5, 6, 7, 8], taken
    # negative control: another seed takes other batches and lambdas, so the result differs
    other = learn(a, b, train + lm_batches(2, 5), val, dataclasses.replace(cfg, seed=12), init=init)
    assert not torch.equal(other.elements["B"]["residual.rotation"], whole.elements["B"]["residual.rotation"])
    with pytest.raises(SymmergeError, match="lr=0.1"):
        learn(a, b, train, val, dataclasses.replace(cfg, lr=0.2), init=init, checkpoint=tmp_path / "cut", resume=True)
    flip = {"uniform": "peak", "peak": "uniform"}[sampling]
    with pytest.raises(SymmergeError, match=f"lam_sampling='{sampling}', not '{flip}'"):
        learn(a, b, train, val, dataclasses.replace(cfg, lam_sampling=flip), init=init, checkpoint=tmp_path / "cut",
              resume=True)


def test_a_pair_takes_peak_sampling_unless_told(pair):
    """No λ sampling given: a pair's run is the run that asks for peak, not uniform's, and its report says so."""
    a, b = pair
    train, val = lm_batches(3, 0), lm_batches(1, 1)
    runs = {s: learn(a, b, train, val, quick(lr=0.1, lam_range=(0.1, 0.9), lam_sampling=s)).report
            for s in (None, "peak", "uniform")}
    assert runs[None]["history"] == runs["peak"]["history"]
    assert runs[None]["history"] != runs["uniform"]["history"]  # negative control: the sampling matters here
    assert runs[None]["settings"]["lam_sampling"] == "peak" and runs["uniform"]["settings"]["lam_sampling"] == "uniform"


def test_a_run_stopped_before_its_first_checkpoint_starts_again_on_resume(pair, tmp_path, capsys):
    """Killed after saving its plan and before its first checkpoint, a run leaves the plan alone in its folder:
    without --resume that folder is an unfinished run (refused), with it the run starts again from step 0 with
    the saved plan and equals the uninterrupted run; --resume of a folder that does not exist is refused."""
    a, b = pair
    train, val = lm_batches(3, 0), lm_batches(1, 1)
    cfg = quick(steps=6, lr=0.1, seed=3, eval_every=2, checkpoint_every=100)
    whole = learn(a, b, train, val, cfg, checkpoint=tmp_path / "whole")
    out = tmp_path / "out"
    with pytest.raises(Interrupted):
        learn(a, b, train, val, cfg, checkpoint=checkpoint_folder(out), on_step=lambda step: step == 2)
    for name in ("state.json", "state.safetensors"):
        (checkpoint_folder(out) / name).unlink()
    plan = (checkpoint_folder(out) / "plan.json").read_text()
    with pytest.raises(SymmergeError, match="--resume"):
        learned_align(a, b, train, val, cfg, out)
    taken = []
    resumed = learn(a, b, train, val, cfg, checkpoint=checkpoint_folder(out), resume=True, on_step=taken.append)
    assert taken == [1, 2, 3, 4, 5, 6], taken  # a resume from a checkpoint would take the steps after it alone
    assert "holds no checkpoint yet" in capsys.readouterr().out
    assert (checkpoint_folder(out) / "plan.json").read_text() == plan  # the saved plan, kept
    for n, t in whole.elements["B"].items():
        assert torch.equal(t, resumed.elements["B"][n]), n
    assert whole.report["history"] == resumed.report["history"]
    report = learned_align(a, b, train, val, cfg, out, resume=True)  # the CLI's pieces take the same folder
    assert report["steps"] == 6 and (out / "config.json").is_file() and not checkpoint_folder(out).exists()
    with pytest.raises(SymmergeError, match="no learned-matching checkpoint"):
        learned_align(a, b, train, val, cfg, tmp_path / "nowhere", resume=True)
    assert not (tmp_path / "nowhere").exists() and not checkpoint_folder(tmp_path / "nowhere").exists()


def test_best_state_kept_and_early_stopping(pair):
    a, b = pair
    cfg = quick(steps=30, lr=0.1, eval_every=2, patience=2, seed=1)  # a third of a rate whose backward can overflow
    result = learn(a, b, lm_batches(3, 0), lm_batches(1, 1), cfg)
    rep = result.report
    assert rep["stopped_early"] and rep["steps"] < 30
    assert rep["barrier_after"] == min(h["barrier"] for h in rep["history"])
    assert rep["best_step"] != rep["steps"], "the best state is not the last one here: the check shows it is kept"
    # the returned element is the best one, not the last (evaluated by a learner started from it whose only slot
    # is a permutation: continuous slots at the identity would move the element by rounding, 1e-16)
    learner = Learner(a, b, LearnConfig(groups=["head_perm"]), result.elements["B"])
    curve = learner.curve(lm_batches(1, 1), [0.0, 0.5, 1.0])
    assert curve[1] == pytest.approx(rep["losses_after"][1], abs=1e-6)


def test_a_finite_loss_with_a_non_finite_gradient_stops_the_run_before_its_step(pair, monkeypatch):
    """The loss is finite but its backward is not (0 * sqrt'(0) = NaN at the fifth step): the run stops as
    diverged at that step and returns its best state, all finite; stepping on it would make every element NaN."""
    from symmerge.match.learner import Learner as L

    calls, real = [0], L.loss

    def overflowing(self, batch, mix):
        loss = real(self, batch, mix)
        calls[0] += 1
        return loss + 0.0 * torch.sqrt(loss - loss.detach()) if calls[0] == 5 else loss

    monkeypatch.setattr(L, "loss", overflowing)
    a, b = pair
    result = learn(a, b, lm_batches(3, 0), lm_batches(1, 1), quick(steps=30, lr=0.1, eval_every=2, patience=100, seed=1))
    assert result.report["diverged"] and result.report["steps"] == 4
    assert all(torch.isfinite(v).all() for v in result.elements["B"].values() if torch.is_tensor(v))


def test_best_state_breaks_ties_below_the_line(pair):
    """Paths at or below the straight line all have barrier 0; the best state among them is the one
    whose highest interior point stands lowest (scripted validation curves, grid 0, 0.5, 1)."""
    from symmerge.match.learn_loop import Run

    learner = Learner(*pair, quick(grid_points=3), None)
    curves = iter([[0.1, 0.1], [0.12], [0.09], [0.08], [0.085], [0.105]])  # endpoints once, then L(0.5) per evaluation
    learner.curve = lambda batches, lams: next(curves)
    run = Run(learner, [], [], None, None)
    for step in range(5):
        run.evaluate(step)
    barriers = [h["barrier"] for h in run.meta["history"]]
    assert barriers == pytest.approx([0.02, 0.0, 0.0, 0.0, 0.005])
    assert run.meta["best_step"] == 2 and run.meta["history"][2]["barrier"] == 0.0  # not step 1, the first at 0
    assert run.meta["bad_evals"] == 2
    assert highest_excess([0.0, 0.5, 1.0], [0.1, 0.08, 0.1]) == pytest.approx(-0.02)
    assert math.isnan(highest_excess([0.0, 0.5, 1.0], [0.1, math.inf, 0.1]))


def test_straight_through_permutations(pair):
    """The dense straight-through element acts exactly as the index permutation, and the latents get
    the gradient of the dense product P @ W (reference: the same elements acting as dense matrices
    through the orthogonal-group path of `apply`). Negative control: a different weighting of the
    outputs changes those gradients."""
    a, b = pair
    learner = Learner(a, b, LearnConfig(groups=["ffn_perm", "head_perm", "residual_rotation"]),
                      random_element(b.spec, torch.Generator().manual_seed(2)))
    rotation = next(s for s in learner.slots if s.param is not None)  # a non-identity rotation acts first
    for t in rotation.raw.values():
        t.data.normal_(0, 0.1, generator=torch.Generator().manual_seed(3))
    dense_spec = dataclasses.replace(learner.spec, groups={
        n: (dataclasses.replace(g, kind="orthogonal", constraints=()) if g.kind == "permutation" else g)
        for n, g in learner.spec.groups.items()})
    hard = apply(learner.spec, learner.element("B", hard=True), learner.frozen["B"].params())
    weights = {k: torch.randn(t.shape, generator=torch.Generator().manual_seed(i), dtype=t.dtype)
               for i, (k, t) in enumerate(sorted(hard.items()))}

    def dense(g):  # the straight-through elements as dense matrices: P in value, L's gradient
        return {n: (torch.nn.functional.one_hot(t.index, t.latent.shape[-1]).to(t.latent.dtype) + t.latent
                    - t.latent.detach()) if isinstance(t, StraightThrough) else t for n, t in g.items()}

    def latent_grads(spec, w):
        for t in learner.trainables().values():
            t.grad = None
        g = learner.element("B", hard=False)
        soft = apply(spec, dense(g) if spec is dense_spec else g, learner.frozen["B"].params())
        for k in hard:
            assert torch.equal(hard[k], soft[k].detach()), k
        sum((soft[k] * w[k]).sum() for k in soft).backward()
        return {s.key: s.raw["latent"].grad.clone() for s in learner.slots if s.param is None}

    fast, reference = latent_grads(learner.spec, weights), latent_grads(dense_spec, weights)
    assert any(k.endswith(".ffn") for k in fast) and any(k.endswith(".heads") for k in fast)
    for k in reference:
        assert float(reference[k].abs().max()) > 0, k
        assert torch.allclose(fast[k], reference[k], rtol=1e-5, atol=1e-6), k
    other = latent_grads(learner.spec, {k: w.flip(-1) for k, w in weights.items()})
    assert any(not torch.allclose(other[k], reference[k], rtol=1e-5, atol=1e-6) for k in reference)
    learner.loss(lm_batches(1, 0)[0], 0.5).backward()
    for s in learner.slots:
        grads = s.raw["latent"].grad if s.param is None else next(iter(s.raw.values())).grad
        assert float(grads.abs().max()) > 0, s.key


def test_interpolated_loss_handles_the_residual_scale(pair):
    """A residual scale moves eps to a^2 eps; the objective rescales to the HF model's eps, so a·A has
    A's logits (float64). Negative control: without the rescale they change."""
    a, _ = pair
    obj = StockForward(a, torch.float64)
    batch = lm_batches(1, 0)[0]
    scaled = apply(a.spec, {"residual.scale": torch.tensor(0.01, dtype=torch.float64)}, a.params)
    base = obj.forward(a.params, batch).logits
    assert_same_function(obj.forward(scaled, batch).logits, base, dtype=torch.float64, what="a·A")
    obj.rescale = False
    assert float((obj.forward(scaled, batch).logits - base).abs().max()) > 1e-2


def test_bad_input_is_refused(pair, tmp_path):
    a, b = pair
    train, val = lm_batches(1, 0), lm_batches(1, 1)
    for lam in [(-0.1, 0.5), (0.6, 0.4), (0.5, 1.2)]:
        with pytest.raises(SymmergeError, match="lam-range"):
            learn(a, b, train, val, quick(lam_range=lam))
    with pytest.raises(SymmergeError, match="lam-sampling"):
        learn(a, b, train, val, quick(lam_sampling="worst"))
    with pytest.raises(SymmergeError, match="at least 3 grid points"):
        learn(a, b, train, val, quick(grid_points=2))  # align --val-points 2
    with pytest.raises(SymmergeError, match="residual_rotation"):
        learn(a, b, train, val, quick(param="direct"))  # GPT-2's rotation is orthogonal: no free matrix
    with pytest.raises(SymmergeError, match="nothing to learn"):
        learn(a, b, train, val, quick(method="dual", groups=["head_perm", "ffn_perm"]))
    with pytest.raises(SymmergeError, match="no learned-matching checkpoint"):
        learn(a, b, train, val, quick(), checkpoint=tmp_path / "none", resume=True)
    with pytest.raises(SymmergeError, match="labels"):
        learn(a, b, [{"input_ids": train[0]["input_ids"]}], val, quick())
    with pytest.raises(SymmergeError, match="has no entry"):
        learn(a, b, train, val, quick(), init={"residual.rotation": torch.eye(24, dtype=torch.float64)})


def _arch_batches(arch: str, n: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    if arch == "vit":
        return [{"pixel_values": torch.randn(3, 1, 8, 8, generator=gen, dtype=torch.float64),
                 "labels": torch.randint(0, 10, (3,), generator=gen)} for _ in range(n)]
    return lm_batches(n, seed, size=3, length=10)


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "gpt2"])
def test_every_architecture(arch, tmp_path):
    """On every adapter: gradients reach every learned slot of learned (with permutations) and dual matching (and
    no model weight); dual outputs are stock checkpoints computing their inputs' functions, and learned ones too on
    one architecture of each structure (its outputs differ from dual's only in learned permutations, which every
    adapter writes as dual's fixed ones)."""
    a = load_model(save_model(make_model(arch, 0), tmp_path / "a"))
    b = load_model(save_model(make_model(arch, 1), tmp_path / "b"))
    init = random_element(b.spec, torch.Generator().manual_seed(7))
    train, val, probe = _arch_batches(arch, 2, 0), _arch_batches(arch, 1, 1), _arch_batches(arch, 1, 9)[0]
    signed = {n for n, grp in b.spec.groups.items() if "signed_permutation" in grp.constraints}
    for method in ("learned", "dual"):
        learner = Learner(a, b, quick(method=method), init)
        assert not signed & {s.group for s in learner.slots}, "discrete signed permutations must stay fixed"
        learner.loss(train[0], 0.5).backward()
        for s in learner.slots:
            grads = [t.grad for t in s.raw.values()]
            assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(
                float(g.abs().max()) > 0 for g in grads), f"{arch}/{method}: no gradient reaches {s.key}"
        assert not any(t.requires_grad for f in learner.frozen.values() for t in f.params().values())
        if method == "dual" or arch in STRUCTURES:
            result = learn(a, b, train, val, quick(method=method, steps=3, lr=0.1), init=init)
            for row in output_report(save_outputs(result, a, b, tmp_path / method), a.shape.hf_class, probe):
                assert_reported_gap(row, probe)


def test_absolute_anchor_with_cayley_signs(pair, tmp_path):
    """Anchored at the initial element itself, plain Cayley cannot start from a rotation with
    det(R) = -1 (it has eigenvalue -1) and says so; cayley-signs can, and its output computes B."""
    a, b = pair
    u = G.ones_complement_basis(24)
    seed = next(s for s in range(50) if float(torch.linalg.det(u.T @ random_element(
        b.spec, torch.Generator().manual_seed(s))["residual.rotation"] @ u)) < 0)
    init = random_element(b.spec, torch.Generator().manual_seed(seed))
    polar = "qk_map=polar,ov_map=polar"
    with pytest.raises(SymmergeError, match="cayley-signs"):
        learn(a, b, lm_batches(2, 0), lm_batches(1, 1), quick(anchor="absolute", param=f"residual_rotation=cayley,{polar}"), init=init)
    result = learn(a, b, lm_batches(2, 0), lm_batches(1, 1),
                   quick(anchor="absolute", param=f"residual_rotation=cayley-signs,{polar}", lr=0.1), init=init)
    assert result.report["parameterisation"]["residual.rotation"] == "cayley-signs"
    for row in output_report(save_outputs(result, a, b, tmp_path / "abs"), b.shape.hf_class, lm_batches(1, 9)[0]):
        assert_reported_gap(row, lm_batches(1, 9)[0])


def test_peak_lambda_weights_the_highest_point():
    """Half the draws are uniform over the range; the other half fall within half a grid spacing of the
    grid points inside the range, the one highest above the straight line most often."""
    lams = [i / 10 for i in range(11)]
    line = [0.1 + 0.02 * lam for lam in lams]
    losses = [x + (0.03 if lam == 0.3 else 0.01 if lam == 0.6 else 0.0) for x, lam in zip(line, lams)]
    g = torch.Generator().manual_seed(0)
    draws = [peak_lambda(lams, losses, (0.2, 0.8), torch.rand(3, generator=g, dtype=torch.float64).tolist())
             for _ in range(4000)]
    assert all(0.2 <= x <= 0.8 for x in draws)
    near = lambda c: sum(abs(x - c) <= 0.05 for x in draws) / len(draws)  # noqa: E731
    assert near(0.3) > 0.40  # about 1/2 * (most of the focused half) + 1/2 * 0.1 (its share of the uniform half)
    assert near(0.3) > 4 * near(0.6) and near(0.6) > near(0.5)
    # negative control: a flat curve leaves the focused half spread evenly, so lambda = 0.3 gets ~1/7 + 1/12
    flat = [peak_lambda(lams, line, (0.2, 0.8), torch.rand(3, generator=g, dtype=torch.float64).tolist())
            for _ in range(4000)]
    assert 0.15 < sum(abs(x - 0.3) <= 0.05 for x in flat) / len(flat) < 0.30
    # a non-finite curve or a range between grid points falls back to uniform draws
    assert peak_lambda(lams, [None] + losses[1:], (0.2, 0.8), [0.9, 0.25, 0.5]) == pytest.approx(0.35)
    assert peak_lambda(lams, losses, (0.42, 0.48), [0.9, 0.5, 0.5]) == pytest.approx(0.45)


def test_parse_lam_range():
    assert parse_lam_range("0.4,0.6") == (0.4, 0.6)
    assert parse_lam_range("0.5") == (0.5, 0.5)
    for bad in ("a,b", "0.1,0.2,0.3"):
        with pytest.raises(SymmergeError, match="lam-range"):
            parse_lam_range(bad)


def test_learned_align_one_call(pair, tmp_path):
    """The pieces behind the CLI, composed as it composes them: refuses a non-empty OUT, refuses to silently
    restart an unfinished run, resumes it, writes OUT, reports the logit gaps and removes its state."""
    a, b = pair
    out = tmp_path / "out"
    cfg = quick(steps=4, eval_every=2)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(SymmergeError, match="not empty"):
        learned_align(a, b, lm_batches(2, 0), lm_batches(1, 1), cfg, tmp_path / "full")
    with pytest.raises(Interrupted):
        learn(a, b, lm_batches(2, 0), lm_batches(1, 1), cfg, checkpoint=checkpoint_folder(out), on_step=lambda s: s == 2)
    with pytest.raises(SymmergeError, match="--resume"):
        learned_align(a, b, lm_batches(2, 0), lm_batches(1, 1), cfg, out)
    report = learned_align(a, b, lm_batches(2, 0), lm_batches(1, 1), cfg, out, resume=True)
    assert report["steps"] == 4
    assert_reported_gap(report["outputs"][0], lm_batches(1, 1)[0])  # measured on the first validation batch
    assert (out / "config.json").is_file() and not checkpoint_folder(out).exists()
    json.dumps(report)  # the report is JSON as it stands


def test_lap_shortcut_equals_the_exact_assignment():
    """`lap` takes the row-wise argmax when it is a permutation and the exact solver otherwise; both
    give an assignment of the optimal total (checked against scipy on every matrix)."""
    from scipy.optimize import linear_sum_assignment

    from symmerge.match.learner import lap

    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(40, generator=gen)
    near_one_hot = torch.nn.functional.one_hot(perm, 40).double() + 0.1 * torch.rand(40, 40, generator=gen, dtype=torch.float64)
    competing = torch.rand(3, 40, 40, generator=gen, dtype=torch.float64)  # rows share maxima: solver path
    assert torch.equal(lap(near_one_hot), perm)
    assert len(set(competing[0].argmax(1).tolist())) < 40  # the shortcut does not apply here
    for x in [near_one_hot, *competing]:
        p = lap(x)
        rows, cols = linear_sum_assignment(x.numpy(), maximize=True)
        assert sorted(p.tolist()) == list(range(40))
        assert float(x[torch.arange(40), p].sum()) == pytest.approx(float(x.numpy()[rows, cols].sum()), abs=1e-12)
        # negative control: the assignment with two rows' columns exchanged totals clearly less
        q = p.clone()
        q[[0, 1]] = p[[1, 0]]
        assert float(x[torch.arange(40), q].sum()) < float(x.numpy()[rows, cols].sum()) - 1e-6
    assert lap(competing).shape == (3, 40)


