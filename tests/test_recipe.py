"""The defaults of learned / dual matching (issue 17): the full recipe takes every training batch for its
epochs and sizes the validation data, `--lr auto` is deterministic for a seed, within its budget and
recorded in the report, `--recipe quick` keeps the old smoke test, and the end of a run names its best
step and how the curve moved after it."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from factories import lm_batches
from learned_common import CONTINUOUS, char_pair
from symmerge import SymmergeError
from symmerge.algebra.elements import random_element
from symmerge.data.batches import load_batches
from symmerge.evaluation.forward import grid
from symmerge.match import learner as learner_module
from symmerge.match import lr_search, objectives
from symmerge.match.learn_config import DEFAULT_LR, EPOCHS, EXTEND, LearnConfig
from symmerge.match.learn_plan import plan_line
from symmerge.match.learn_report import after_best, end_line
from symmerge.match.learned import learn
from symmerge.match.learner import Learner
from symmerge.match.lr_search import BUDGET, EVAL_SHARE, MAX_EXTRA, MIN_STEPS, candidates, choose_lr, plan, search_steps

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def _planted(pair):
    """B = g*·A for a random continuous g*: a pair whose barrier learning can remove, so rates differ."""
    a, _ = pair
    gstar = random_element(a.spec, torch.Generator().manual_seed(5), CONTINUOUS, spread=1.5)
    return a, a.moved(gstar)


def _auto(**kw) -> LearnConfig:
    base = dict(groups=CONTINUOUS, steps=50, eval_every=25, grid_points=5, lam_range=(0.4, 0.6), lr="auto",
                val_batches=None, progress=False)
    return LearnConfig(**{**base, **kw})


def _without_time(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "seconds"}


@pytest.mark.parametrize("run_steps", [100, 449, 450, 981, 5000, 10**5, 10**7])
@pytest.mark.parametrize("n_val", [1, 7, 55])
def test_lr_search_plan_costs_at_most_a_tenth(run_steps, n_val):
    """The planned search costs at most BUDGET of the run's own training steps (its evaluations counted
    as steps, at most EVAL_SHARE of it), or is refused when it cannot afford MIN_STEPS steps per rate;
    more run, more search."""
    try:
        k, n = plan(run_steps, n_val, 5)
    except SymmergeError as e:
        assert "needs a longer run" in str(e) and run_steps < 450
        return
    assert search_steps(k, n, 5) <= BUDGET * run_steps and k >= MIN_STEPS and 1 <= n <= n_val
    assert n == 1 or search_steps(0, n, 5) <= EVAL_SHARE * BUDGET * run_steps
    k2, n2 = plan(run_steps * 10, n_val, 5)
    assert k2 > k and n2 >= n
    with pytest.raises(SymmergeError, match="needs a longer run"):
        plan(449, n_val, 5)


def test_lr_search_costs_what_it_counts_and_repeats_for_a_seed(pair, monkeypatch):
    """At the real budget, for a run of 800 steps (the search alone runs): the training steps and
    evaluated batches the search really takes, counted as `search_steps` counts them (a λ point on n
    batches as ceil(n·r / 3) steps, r = 2 the validation batches' size over the training ones'), equal
    the record's cost and are at most a tenth of the run's steps.
    The same seed gives the same choice and record (timing aside); another seed other barriers."""
    from symmerge.match import learn_loop

    a, b = _planted(pair)
    train, val = lm_batches(4, 0), lm_batches(9, 1, size=8)  # validation batches twice the training ones
    cfg = dataclasses.replace(_auto(), steps=800, eval_every=80)
    counted = {"steps": 0, "eval": 0}
    real_step, real_curve = learn_loop.Run.train_step, Learner.curve

    def step(self, i, stop=False):
        counted["steps"] += 1
        return real_step(self, i, stop)

    def curve(self, batches, lams):
        rows = sum(x["input_ids"].numel() for x in batches) / train[0]["input_ids"].numel()
        counted["eval"] += len(lams) * math.ceil(rows / lr_search.FORWARDS_PER_STEP)
        return real_curve(self, batches, lams)

    monkeypatch.setattr(learn_loop.Run, "train_step", step)
    monkeypatch.setattr(Learner, "curve", curve)
    lr, record = choose_lr(Learner(a, b, _auto(), None), train, val, cfg)
    assert counted["steps"] == len(record["rates"]) * record["steps_each"] and record["steps_each"] >= MIN_STEPS
    assert counted["steps"] + counted["eval"] == record["cost_steps"] <= BUDGET * 800 == BUDGET * record["run_steps"]
    assert lr == record["chosen"] and 1 <= record["val_batches"] <= len(val)
    again_lr, again = choose_lr(Learner(a, b, _auto(), None), train, val, cfg)
    assert again_lr == lr and _without_time(again) == _without_time(record)
    _, other = choose_lr(Learner(a, b, _auto(seed=3), None), train, val, dataclasses.replace(cfg, seed=3))
    assert other["excess"] != record["excess"]


@pytest.mark.parametrize("target,extended,chosen", [
    (3e-3, [], 3e-3),                 # interior: the grid alone
    (3e-2, [3e-2, 1e-1], 3e-2),       # above the top: one half-decade up is best, one more shows it
    (1e3, [3e-2, 1e-1], 1e-1),        # far above: MAX_EXTRA rates added, the highest chosen
    (7e-5, [3e-5], 1e-4),             # below the bottom, nearer 1e-4: the grid's end stays best
])
def test_lr_search_brackets_its_choice(pair, monkeypatch, target, extended, chosen):
    """A best rate at an end of the grid is bracketed: the next half-decade beyond it is tried, until the
    best is interior or MAX_EXTRA rates were added; the record lists them and the cost stays within the
    tenth of the run. The short runs' barriers are replaced by |log(rate / target)| so the answer is known."""
    a, b = pair
    learner = Learner(a, b, _auto(), None)
    real = objectives.highest_excess  # the probe's score: the path objective's
    monkeypatch.setattr(objectives, "highest_excess", lambda lams, losses: real(lams, losses) * 0 + (
        abs(math.log(learner.cfg.lr / target)) if isinstance(learner.cfg.lr, float) else 10.0))
    cfg = dataclasses.replace(_auto(), steps=800, eval_every=80)
    lr, record = choose_lr(learner, lm_batches(4, 0), lm_batches(3, 1), cfg)
    assert record["extended"] == pytest.approx(extended) and lr == pytest.approx(chosen) == record["chosen"]
    assert len(record["rates"]) == len(candidates("learned")) + len(extended) <= len(candidates("learned")) + MAX_EXTRA
    assert record["cost_steps"] <= BUDGET * 800


def test_lr_auto_is_deterministic_and_recorded(pair, monkeypatch):
    """The search's record is in the report (rates tried, their barriers, the choice, which the run
    then uses), it is the lowest-barrier rate, and the same seed gives the same search to the bit;
    another seed (other batches and λ) gives other barriers (negative control). The budget is a tenth
    of the run (the test above); here it is the whole run, so that the run can be short."""
    monkeypatch.setattr(lr_search, "BUDGET", 1.0)
    a, b = _planted(pair)
    train, val = lm_batches(4, 0), lm_batches(2, 1)
    rep = learn(a, b, train, val, _auto(steps=70)).report
    search = rep["plan"]["lr_search"]
    assert search["grid"] == candidates("learned") and set(search["grid"]) <= set(search["rates"])
    assert search["rates"] == sorted(search["rates"]) and len(search["barriers"]) == len(search["rates"])
    assert rep["settings"]["lr"] == rep["plan"]["lr"] == search["chosen"]
    scores = [x if x is not None else float("inf") for x in search["excess"]]
    assert search["chosen"] == search["rates"][scores.index(min(scores))]
    assert min(scores) < search["start_excess"], "no rate improved on the start: the search shows nothing"
    assert len(set(scores)) == len(scores), "rates scored alike: the search does not tell them apart"
    assert search["cost_steps"] <= search["run_steps"] and search["steps_each"] >= MIN_STEPS
    assert f"lr {search['chosen']:.3g} (--lr auto" in rep["end_line"]
    assert f"--lr auto chose {search['chosen']:.3g}" in plan_line(rep["plan"])  # printed before the run
    # the same seed again, the search alone: the same record
    resolved = dataclasses.replace(_auto(steps=70), eval_every=25)
    _, again = choose_lr(Learner(a, b, _auto(steps=70), None), train, val, resolved)
    assert _without_time(again) == _without_time(search)
    _, other = choose_lr(Learner(a, b, _auto(steps=70, seed=3), None), train, val, dataclasses.replace(resolved, seed=3))
    assert other["excess"] != search["excess"]


def test_epochs_and_validation_defaults_take_all_the_data(pair, monkeypatch):
    """With epochs (and no steps) every training batch is used, each once per epoch; the validation
    barrier of the default ("auto") is measured on every validation batch when few are given (a
    tiny dataset): the start's curve equals the one on all of them, not on the first two."""
    a, b = pair
    train, val = lm_batches(3, 0), lm_batches(3, 1)
    seen = []
    real = learner_module.Learner.loss
    monkeypatch.setattr(learner_module.Learner, "loss", lambda self, batch, lam: seen.append(id(batch)) or real(self, batch, lam))
    cfg = LearnConfig(groups=CONTINUOUS, epochs=2, lr=0.01, grid_points=3, extend=1.0, progress=False)
    assert cfg.steps is None and cfg.val_batches == "auto"
    rep = learn(a, b, train, val, cfg).report
    assert rep["steps"] == rep["plan"]["steps"] == 6 and rep["plan"]["train_batches"] == 3
    assert sorted(seen) == sorted([id(t) for t in train] * 2)
    assert rep["plan"]["val_batches"] == 3 == rep["plan"]["val_batches_given"]
    fresh = Learner(a, b, cfg, None)
    assert rep["losses_before"] == pytest.approx(fresh.curve(val, grid(3)), abs=1e-6)
    assert rep["losses_before"] != pytest.approx(fresh.curve(val[:2], grid(3)), abs=1e-6)


def test_cli_defaults_and_the_quick_recipe(tmp_path, capsys):
    """`align --method dual` with no tuning flags: batches of 1024 tokens (32 windows of 32), every
    training batch of the split for EPOCHS epochs, every validation batch, λ over 0.2-0.8 on an 11-point
    grid; this tiny run is too short for --lr auto's search, so the default rate is used and said so
    (asked for explicitly, --lr auto is refused, nothing written). `--recipe quick`: 8 batches of 8,
    λ over 0.4-0.6, 5 points, evaluations every 25 steps, dual's fixed rate."""
    from symmerge import cli

    common, _, _ = char_pair(tmp_path, 8000)
    train = load_batches(common[0], common[-1], "train", 32)
    val = load_batches(common[0], common[-1], "validation", 32)
    out, js = tmp_path / "out", tmp_path / "r.json"
    assert cli.main(["align", *common, "--method", "dual", "-o", str(out), "--json", str(js)]) == 0
    rep = json.loads(js.read_text())
    plan, settings = rep["plan"], rep["settings"]
    assert plan["train_batches"] == len(train) and plan["steps"] == rep["steps"] == EPOCHS * len(train)
    assert plan["val_batches"] == len(val) and settings["grid_points"] == 11 and settings["lam_range"] == [0.2, 0.8]
    assert plan["eval_every"] == -(-plan["steps"] // 10) and rep["recipe"] == "full"
    assert settings["lr"] == DEFAULT_LR["dual"] and "too short for --lr auto" in rep["lr_note"]
    printed = capsys.readouterr().out
    assert f"best at step {rep['best_step']} of {rep['steps']}" in printed and "too short for --lr auto" in printed
    assert cli.main(["align", *common, "--method", "dual", "-o", str(tmp_path / "no"), "--lr", "auto"]) == 2
    assert "needs a longer run" in capsys.readouterr().err and not (tmp_path / "no").exists()
    assert cli.main(["align", *common, "--method", "dual", "-o", str(tmp_path / "q"), "--recipe", "quick",
                     "--steps", "30", "--json", str(js)]) == 0  # its 200 steps: test_registry
    rep = json.loads(js.read_text())
    assert rep["plan"]["train_batches"] == 8 and rep["steps"] == 30 and rep["settings"]["lr"] == DEFAULT_LR["dual"]
    assert rep["settings"]["lam_range"] == [0.4, 0.6] and rep["settings"]["grid_points"] == 5
    assert rep["settings"]["eval_every"] == 25 and rep["recipe"] == "quick"
    assert len(rep["history"][0]["losses"]) == 5


def test_an_explicit_default_length_is_the_default_run(tmp_path):
    """`--epochs EPOCHS` given is the run with no flag, to the bit (the outputs' bytes, the steps, every validation
    barrier), since a given length fixes it only where `extend` is above 1 (EXTEND is 1): a benchmark record made
    with the flag is the default's run. Control: another length changes the run."""
    from safetensors.torch import load_file

    from symmerge import cli

    common, _, _ = char_pair(tmp_path, 6000)
    runs = {}
    for name, flags in (("none", []), ("given", ["--epochs", f"{EPOCHS:g}"]), ("other", ["--epochs", f"{EPOCHS / 2:g}"])):
        out, js = tmp_path / name, tmp_path / f"{name}.json"
        assert cli.main(["align", *common, "--method", "dual", "-o", str(out), "--json", str(js), *flags]) == 0
        rep = json.loads(js.read_text())
        runs[name] = (load_file(out / "A" / "model.safetensors"), rep["steps"], [h["barrier"] for h in rep["history"]])
    (wa, steps, curve), (wb, steps_b, curve_b), (_, steps_o, _) = runs["none"], runs["given"], runs["other"]
    assert EXTEND == 1.0 and steps == steps_b == EPOCHS * len(load_batches(common[0], common[-1], "train", 32))
    assert curve == curve_b and wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert steps_o == steps // 2


def test_merge_takes_the_same_recipe(tmp_path, capsys):
    """`merge --method dual` with no tuning flags runs the full recipe as align does: batches of 1024 tokens,
    every training batch for EPOCHS epochs, evaluations spread over the run, learning on to EXTEND times
    the plan; this run is too short for --lr auto's search, so dual's fixed rate is used and the end
    line says so; --lr auto asked for is refused with nothing written; `--recipe quick` is the smoke test."""
    from symmerge import cli

    common, _, _ = char_pair(tmp_path, 8000)
    models, data = common[:2], common[-1]
    train = load_batches(models[0], data, "train", 32)
    js = tmp_path / "r.json"
    assert cli.main(["merge", *models, "--method", "dual", "--data", data, "-o", str(tmp_path / "m"),
                     "--json", str(js)]) == 0
    rep = json.loads(js.read_text())
    settings = rep["settings"]
    assert rep["planned_steps"] == EPOCHS * len(train) and settings.get("extend", 1.0) == EXTEND and settings["val_batches"] == "auto"
    assert settings["eval_every"] == -(-rep["planned_steps"] // 10) and settings["lr"] == DEFAULT_LR["dual"]
    assert "too short for --lr auto" in rep["lr_note"]
    assert "too short for --lr auto" in capsys.readouterr().out
    assert cli.main(["merge", *models, "--method", "dual", "--data", data, "-o", str(tmp_path / "no"),
                     "--lr", "auto"]) == 2
    assert "needs a longer run" in capsys.readouterr().err and not (tmp_path / "no").exists()
    assert cli.main(["merge", *models, "--method", "dual", "--data", data, "-o", str(tmp_path / "q"),
                     "--recipe", "quick", "--steps", "6", "--json", str(js)]) == 0
    rep = json.loads(js.read_text())
    assert rep["planned_steps"] == 6 and rep["settings"]["eval_every"] == 25 and "lr_note" not in rep
    assert f"lr {DEFAULT_LR['dual']:.3g}" in capsys.readouterr().out


def _history(barriers):
    return [{"step": 10 * i, "barrier": b, "losses": []} for i, b in enumerate(barriers)]


def test_after_best_says_how_the_curve_moved():
    rose = after_best(_history([0.3, 0.1, 0.02, 0.05, 0.04]), 20, se=0.003)
    assert rose["trend"] == "rose" and rose["highest_after"] == 0.05 and rose["last"] == 0.04
    flat = after_best(_history([0.3, 0.1, 0.02, 0.0215, 0.021]), 20, se=0.003)
    assert flat["trend"] == "stayed" and flat["rise"] == pytest.approx(0.0015)
    last = after_best(_history([0.3, 0.1, 0.02]), 20, se=None)
    assert last["trend"] == "last" and last["fell_by"] == pytest.approx(0.08)
    assert after_best(_history([0.3, 0.1, None]), 10, se=None)["trend"] == "diverged"
    rep = {"best_step": 20, "steps": 40, "barrier_after": 0.02, "barrier_after_se": 0.003, "barrier_before": 0.3,
           "after_best": rose, "plan": {"lr": 1e-3}}
    line = end_line(rep)
    assert line.startswith("best at step 20 of 40: validation barrier 0.0200 ± 0.0030 (start 0.3000)")
    assert "rose to 0.0500 (last 0.0400)" in line and line.endswith("lr 0.001")
    assert "stayed within +0.0015 over 2 evaluations" in end_line(dict(rep, after_best=flat))
    assert "a longer run may go lower" in end_line(dict(rep, after_best=last))
