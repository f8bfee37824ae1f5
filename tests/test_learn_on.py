"""Learning on past the plan (`LearnConfig.extend`): a run still improving at its planned end learns more
chunks while its last evaluation is its best and fell by more than FLAT, within the cap; the rule, the
report, the end line and resume are exact, and `extend=1` takes the planned steps (negative control)."""

from __future__ import annotations

import pytest
import torch

from factories import lm_batches
from learned_common import CONTINUOUS
from symmerge.algebra.elements import random_element
from symmerge.match.learn_config import FLAT, LearnConfig
from symmerge.match.learn_loop import RESTART, Interrupted, extension_chunk, scheduled_lr
from symmerge.match.learn_report import time_line
from symmerge.match.learned import learn

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread

PLANNED, EVERY = 12, 3


def _planted(pair):
    """B = g*·A for a random continuous g*: learning removes the barrier, slowly at a small rate."""
    a, _ = pair
    gstar = random_element(a.spec, torch.Generator().manual_seed(5), CONTINUOUS, spread=1.5)
    return a, a.moved(gstar)


def _cfg(**kw) -> LearnConfig:
    base = dict(groups=CONTINUOUS, steps=PLANNED, lr=0.004, eval_every=EVERY, lam_range=(0.5, 0.5), grid_points=3,
                extend=2.0, progress=False, checkpoint_every=100)
    return LearnConfig(**{**base, **kw})


def test_schedule_is_the_plan_then_cycles_from_a_fraction_of_the_rate():
    chunk = extension_chunk(PLANNED, EVERY)
    assert chunk == EVERY and extension_chunk(1000, 100) == 200 and extension_chunk(1000, 300) == 300
    assert scheduled_lr(1.0, 0, PLANNED, chunk) == 1.0 and scheduled_lr(1.0, PLANNED - 1, PLANNED, chunk) < 0.05
    assert 0 < RESTART < 1
    assert [scheduled_lr(1.0, PLANNED + i * chunk, PLANNED, chunk) for i in range(3)] == [RESTART] * 3
    assert scheduled_lr(1.0, PLANNED + 1, PLANNED, chunk) < RESTART


def test_a_run_still_improving_learns_on_by_the_rule(pair):
    a, b = _planted(pair)
    train, val = lm_batches(4, 0), lm_batches(2, 1)
    on = learn(a, b, train, val, _cfg()).report
    off = learn(a, b, train, val, _cfg(extend=1.0)).report
    assert off["steps"] == PLANNED and off["extended_steps"] == 0 and "--extend" not in off["end_line"]
    hist = {h["step"]: h["barrier"] for h in off["history"]}
    assert off["best_step"] == PLANNED and hist[PLANNED - EVERY] - hist[PLANNED] > FLAT, "the plan ends still improving"
    chunk = extension_chunk(PLANNED, EVERY)
    assert on["extended_steps"] > 0 and on["steps"] == PLANNED + on["extended_steps"] <= 2 * PLANNED
    assert on["extended_steps"] % chunk == 0 and on["planned_steps"] == PLANNED
    assert f"learned {on['extended_steps']} steps past the planned {PLANNED}" in on["end_line"]
    # the planned part is the same run; every chunk was added because the one before ended best and falling
    assert on["history"][: len(off["history"])] == off["history"]
    barrier = {h["step"]: h["barrier"] for h in on["history"]}
    for end in range(PLANNED, on["steps"], chunk):
        best = min(x for s, x in barrier.items() if s <= end)
        assert barrier[end] == best and barrier[end - EVERY] - barrier[end] > FLAT, end
    last = on["steps"]
    assert last == 2 * PLANNED or barrier[last] != min(barrier.values()) or barrier[last - EVERY] - barrier[last] <= FLAT
    assert on["barrier_after"] <= off["barrier_after"]
    # where the time went: the steps past the plan are part of the loop, and the end line says so
    assert 0 < on["time"]["past_plan_s"] < on["time"]["loop_s"] and on["time"]["validation_s"] > 0
    assert off["time"]["past_plan_s"] == 0 and "s past the plan" in time_line(on) and "past the plan" not in time_line(off)
    assert " s " not in on["end_line"]  # the end line holds no timing: a report is the same on every run


def test_resume_within_the_extension_equals_uninterrupted(pair, tmp_path):
    a, b = _planted(pair)
    train, val = lm_batches(4, 0), lm_batches(2, 1)
    whole = learn(a, b, train, val, _cfg(), checkpoint=tmp_path / "whole")
    assert whole.report["extended_steps"] >= EVERY
    cut_at = PLANNED + 1
    with pytest.raises(Interrupted):
        learn(a, b, train, val, _cfg(), checkpoint=tmp_path / "cut", on_step=lambda step: step == cut_at)
    taken = []
    resumed = learn(a, b, train, val, _cfg(), checkpoint=tmp_path / "cut", resume=True, on_step=taken.append)
    assert taken[0] == cut_at + 1, taken  # resumed, not started over (a deterministic rerun would be equal too)
    for n, t in whole.elements["B"].items():
        assert torch.equal(t, resumed.elements["B"][n]), n
    assert whole.report["history"] == resumed.report["history"]
    assert whole.report["extended_steps"] == resumed.report["extended_steps"]
