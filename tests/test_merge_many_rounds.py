"""The rounds of many-model weight matching: what a round costs (counted, not timed), the stop rule, the
cached target and the exact objective update.

Models: three (or four) independently initialised tiny GPT-2s; planted: A and g1·A, g2·A.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from factories import make_model, save_model
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.match import activation_many, registry
from symmerge.match import many as many_mod
from symmerge.match.many import ROUND_TOL, objective, weight_match_many
from symmerge.match.options import ManyOptions
from symmerge.match.part_cache import PartCache
from symmerge.store.model import LazyModel, load_model
from symmerge.store.parts import part_keys


@pytest.fixture(scope="module")
def gpt2s(tmp_path_factory):
    root = tmp_path_factory.mktemp("rounds")
    return [load_model(save_model(make_model("gpt2", s), root / f"m{s}")) for s in range(4)]


def _monotone(h) -> bool:
    return all(b >= a for a, b in zip(h, h[1:]))


def _count(monkeypatch, obj, name: str) -> list:
    calls = []
    real = getattr(obj, name)

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(obj, name, counted)
    return calls


def test_objective_exact_at_every_round_and_passes_counted(gpt2s, monkeypatch):
    """After round 1 the objective is updated from each match's own distances, never recomputed over every
    model: two full passes (the start, round 1) for any number of rounds; each round's value equals the
    exact objective of the elements it ends with (to float64 rounding), and the history never decreases."""
    spec, w = gpt2s[0].spec, [0.4, 0.3, 0.2, 0.1]
    params = [m.params for m in gpt2s]
    passes = _count(monkeypatch, many_mod, "objective_terms")
    ends = []  # the elements at the end of every round, read off the orders' last match
    real_rounds = many_mod.rounds

    def spy(n, value_of, match, identity, *a, **k):
        def watched(i, keep, elements, g0):
            step = match(i, keep, elements, g0)
            ends.append((i, keep, [dict(e) for e in elements], step))
            return step
        return real_rounds(n, value_of, watched, identity, *a, **k)

    monkeypatch.setattr(many_mod, "rounds", spy)
    res = weight_match_many(spec, params, w, spec.default_families(), max_rounds=4, seed=2, tol=0.0)
    assert len(passes) == 2, f"{len(passes)} full objective passes for {len(res.history) - 1} rounds"
    assert _monotone(res.history) and res.history[-1] > res.history[1] > res.history[0], res.history
    monkeypatch.undo()
    exact = objective(spec, params, res.elements, w)
    assert exact == pytest.approx(res.history[-1], rel=1e-12, abs=0)
    # each later-round gain is the exact change of the objective (checked on the first leave-one-out match)
    i, keep, before, step = next(e for e in ends if len(e[1]) == 3)
    after = [*before[:i], step.g, *before[i + 1:]]
    scales = res.extra["scale_gauge"]  # the matches see the models in one residual scale (`many.scale_gauge`)
    before, after = (many_mod.with_scales(spec, e, scales) for e in (before, after))
    want = objective(spec, params, after, w) - objective(spec, params, before, w)
    assert step.gain == pytest.approx(want, rel=1e-9, abs=1e-13)
    # negative control: the same gain without the w_i (1 - w_i) factor is not the change
    assert abs(step.gain / (w[i] * (1 - w[i])) - want) > 10 * abs(step.gain - want)


def test_each_match_forms_its_target_once(gpt2s, monkeypatch):
    """The mean of the others is formed once per match (one read and apply of each part of each other
    model), whatever the number of sweeps inside the match."""
    spec, n = gpt2s[0].spec, 3
    parts = _count(monkeypatch, many_mod.MeanParts, "part")
    res = weight_match_many(spec, [m.params for m in gpt2s[:n]], [1 / n] * n, spec.default_families(), max_rounds=3,
                            max_iters=5, seed=0, tol=0.0)
    matches = (n - 1) + (len(res.history) - 2) * n
    assert len(parts) == matches * len(part_keys(spec.shape)), (len(parts), matches)
    assert len(res.round_sweeps) == len(res.history) - 1 and res.round_sweeps[0] >= n - 1
    assert all(n <= k <= 5 * n for k in res.round_sweeps[1:]), res.round_sweeps  # max_iters 5 per match


def test_target_on_disk_gives_the_same_result_as_in_memory(gpt2s, tmp_path):
    """Streamed checkpoints keep each match's target on disk: the elements and history are those of the
    in-memory cache to float64 rounding (the buffers' alignment may change a reduction's last bit)."""
    spec = gpt2s[0].spec
    lazy = [LazyModel(m.path) for m in gpt2s[:3]]
    kw = dict(families=spec.default_families(), max_rounds=2, max_iters=4, seed=1)
    mem = weight_match_many(spec, lazy, [1 / 3] * 3, cache_on_disk=False, **kw)
    disk = weight_match_many(spec, lazy, [1 / 3] * 3, **kw)  # default for LazyModels: on disk
    eps = torch.finfo(torch.float64).eps
    assert disk.history == pytest.approx(mem.history, rel=1e3 * eps, abs=0)
    def gap(a, b):  # the largest difference of two elements, in units of the tolerance
        return max(float((a[k] - b[k]).abs().max()) / (1e6 * eps * max(1.0, float(a[k].abs().max()))) for k in a)

    for a, b in zip(mem.elements, disk.elements):
        assert gap(a, b) <= 1, max(a, key=lambda k: float((a[k] - b[k]).abs().max()))
    assert mem.history[-1] > mem.history[0] + 0.1  # they did move
    # negative control: each model's element against the next model's (a cache that served the wrong target)
    assert min(gap(a, b) for a, b in zip(mem.elements, disk.elements[1:] + disk.elements[:1])) > 100


def test_part_cache_round_trip_and_cleanup():
    keys = ["embed", 0, "final"]
    parts = {k: {f"{k}.w": torch.randn(3, 2, dtype=torch.float64), f"{k}.eps": torch.tensor(1e-5, dtype=torch.float64)}
             for k in keys}  # names out of alphabetical order: a file lists them sorted
    for on_disk, strides in ((False, False), (True, False), (True, True)):
        cache = PartCache(keys, on_disk, strides).fill(parts.__getitem__)
        folder = cache._dir.name if on_disk else None
        assert all(list(cache.part(k)) == list(parts[k]) for k in keys), "a part's tensors come back in its order"
        got = cache.part(0)
        got["0.w"] += 1  # a read is a fresh tensor: the cache is unchanged
        assert all(torch.equal(cache.part(k)[n], t) for k in keys for n, t in parts[k].items())
        with pytest.raises(KeyError):
            cache.part(1)
        cache.close()
        if on_disk:
            import os

            assert not os.path.exists(folder)


def test_stop_rule_and_its_default(gpt2s):
    """Rounds stop after the first leave-one-out round whose relative gain is at most `tol` (converged), or at
    `max_rounds` (not converged); the default lives in one place and the registry and CLI take it from there."""
    spec, params, w = gpt2s[0].spec, [m.params for m in gpt2s[:3]], [1 / 3] * 3
    loose = weight_match_many(spec, params, w, spec.default_families(), max_rounds=6, max_iters=3, tol=1.0)
    assert loose.converged and len(loose.history) == 3  # start, round 1, one leave-one-out round
    capped = weight_match_many(spec, params, w, spec.default_families(), max_rounds=2, max_iters=3, tol=0.0)
    h = capped.history
    assert len(h) == 3 and capped.converged == (h[-1] - h[-2] <= 0.0)
    for fn in (weight_match_many, activation_many.activation_match_many, many_mod.rounds):
        assert inspect.signature(fn).parameters["tol"].default == ROUND_TOL, fn.__name__
    assert ManyOptions().round_tol == ROUND_TOL
    assert 0 < ROUND_TOL < 1e-2
    assert registry.many_options_for("weight")["round_tol"] == ROUND_TOL
    assert registry.many_options_for("weight", {"round_tol": 1e-3})["round_tol"] == 1e-3


def test_cli_round_tol_reported(gpt2s, tmp_path):
    import json

    from symmerge.cli import main

    paths = [str(m.path) for m in gpt2s[:3]]
    rep = tmp_path / "r.json"
    assert main(["merge", *paths, "-o", str(tmp_path / "m"), "--round-tol", "0.5", "--max-iters", "3",
                 "--json", str(rep)]) == 0
    r = json.loads(rep.read_text())
    assert r["round_tol"] == 0.5 and r["converged"] and r["rounds"] == 2 == len(r["objective"]) - 1
    with pytest.raises(SystemExit):
        main(["merge", *paths, "-o", str(tmp_path / "m2"), "--round-tol", "-1"])


def test_zero_weights_planted(gpt2s):
    """A weight of 0 is allowed: with weights (1/2, 1/2, 0) the two planted copies of A still align exactly,
    and a model whose others all weigh 0 (weights 1, 0, 0) does not divide by zero."""
    a = gpt2s[0]
    fams = a.spec.default_families()
    copies = [a.params] + [apply(a.spec, random_element(a.spec, torch.Generator().manual_seed(s), fams), a.params)
                           for s in (5, 6)]
    res = weight_match_many(a.spec, copies, [0.5, 0.5, 0.0], fams, max_rounds=3)
    assert res.history[-1] > 1 - 1e-9 and res.history[0] < 0.9
    one = weight_match_many(a.spec, copies, [1.0, 0.0, 0.0], fams, max_rounds=2, max_iters=2)
    assert all(math.isfinite(v) for v in one.history) and one.history[-1] == pytest.approx(1.0, abs=1e-12)


def test_merge_reuses_a_found_alignment(gpt2s, tmp_path, monkeypatch):
    """`merge_models(start=...)` with the method's own alignment matches nothing again and writes what it
    found; an alignment of other models is refused before any work."""
    from symmerge import SymmergeError
    from symmerge.workflows.merge_many import merge_models

    paths = [m.path for m in gpt2s[:3]]
    lazy = [LazyModel(p) for p in paths]
    opts = {"max_iters": 3, "max_rounds": 2}
    found = registry.align_many("weight", lazy, [1 / 3] * 3, lazy[0].spec.default_families(), opts=opts)
    runs = _count(monkeypatch, many_mod, "weight_match_many")
    rep = merge_models(paths, tmp_path / "m", opts=opts, start=found)
    assert not runs and rep["objective"] == found.figures["objective"]
    fresh = merge_models(paths, tmp_path / "m2", opts=opts)
    assert len(runs) == 1 and fresh["objective"] == found.figures["objective"]
    short = registry.ManyAlignment("weight", found.elements[:2], found.figures)
    with pytest.raises(SymmergeError, match="alignment of 2 models"):
        merge_models(paths, tmp_path / "m3", opts=opts, start=short)
    assert not (tmp_path / "m3").exists()


def test_a_later_round_costs_at_most_round_one_per_match(gpt2s, monkeypatch):
    """Each match of a later round is bounded by round 1's mean sweeps per match (rounded up) and ends on a
    sweep worth at most the round's stop rule shared over the n matches (`many.later_match_bounds`): a later
    round cannot cost more sweeps than n such matches, whatever the models; the history still never decreases."""
    spec, n, tol, max_iters = gpt2s[0].spec, 4, 1e-3, 20
    params, w = [m.params for m in gpt2s], [0.4, 0.3, 0.2, 0.1]
    calls = []
    real = many_mod.weight_match

    def spy(*a, **k):
        res = real(*a, **k)
        calls.append((k.get("g0") is not None, a[4], k.get("min_gain", 0.0), res))
        return res

    monkeypatch.setattr(many_mod, "weight_match", spy)
    res = weight_match_many(spec, params, w, spec.default_families(), max_rounds=4, max_iters=max_iters, seed=0, tol=tol)
    monkeypatch.undo()
    assert _monotone(res.history), res.history
    first = [len(r.history) - 1 for later, _, _, r in calls if not later]
    cap = min(max_iters, math.ceil(sum(first) / len(first)))
    later = [(it, gain, r) for is_later, it, gain, r in calls if is_later]
    visited = [i for order in res.orders[1:] for i in order]  # the model of each later match, in call order
    assert len(later) == len(visited) > 0 and all(it == cap for it, _, _ in later), (cap, [it for it, *_ in later])
    assert all(k <= n * cap for k in res.round_sweeps[1:]), (cap, res.round_sweeps)
    _, norm2 = many_mod.objective_terms(spec, params, [{}] * n, w)
    share = tol * max(abs(h) for h in res.history) / n  # the round rule's share; the value used is at most this
    stopped = 0
    for (it, min_gain, r), i in zip(later, visited):
        d = r.extra["distances"]
        assert 0 < min_gain * w[i] * (1 - w[i]) / norm2 <= share * (1 + 1e-12)
        if len(d) - 1 < it:  # stopped before the cap: on a sweep worth at most the share
            stopped += 1
            assert d[-2] - d[-1] <= min_gain
    assert stopped > 0  # the gain bound did end some matches
