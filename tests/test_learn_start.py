"""Learned and dual matching start from the element of the matcher their `start` option names (weight matching
where none is named, activation matching when asked): with no step taken, what they return is that element."""

import pytest
import torch

from factories import lm_batches, make_model
from symmerge.errors import SymmergeError
from symmerge.match import registry
from symmerge.match.learn_report import time_line
from symmerge.match.options import STARTS


def _data() -> registry.Data:
    return registry.Data(lm_batches(3, 0), lm_batches(2, 1))


def _same(x: dict, y: dict) -> bool:
    """The same element: permutations equal, continuous parts equal to float32 rounding (the learner holds
    them in float32)."""
    eps = torch.finfo(torch.float32).eps
    return x.keys() == y.keys() and all(
        torch.equal(x[k], y[k]) if not x[k].is_floating_point() else
        torch.allclose(x[k].double(), y[k].double(), rtol=0, atol=16 * eps * max(1.0, y[k].abs().max().item()))
        for k in x)


@pytest.mark.parametrize("method", ["learned", "dual"])
def test_no_step_returns_the_named_starts_element(pair, method):
    """steps=0: B's element is the start's (A's the identity's for dual), for either start; the two starts give
    different elements here, so the check tells them apart (each start is the other's control)."""
    a, b = pair
    families, data = b.spec.default_families(), _data()
    found = {}
    for start in STARTS:
        expected = registry.align(start, a, b, families, data, {})
        got = registry.align(method, a, b, families, data, {"recipe": "quick", "steps": 0, "start_from": start},
                             device="cpu", dtype="float32")  # as `symmerge align` passes them; a start that casts gets the device
        assert got.start.method == start and _same(got.elements["B"], expected.elements["B"])
        assert got.figures["time"]["start_s"] == round(got.start.figures["seconds"], 3)  # where the time went
        assert "its start" in time_line(got.figures)
        found[start] = got.elements["B"]
    assert not _same(found["weight"], found["activation"])


def test_the_default_start_is_weight_matching(pair):
    a, b = pair
    got = registry.align("learned", a, b, b.spec.default_families(), _data(), {"recipe": "quick", "steps": 0})
    assert registry.get("learned").starts_from == "weight" == got.start.method


def test_many_models_start_from_the_named_many_matcher(tmp_path):
    """The many-model form, learned and dual: with no step taken, every model's element is the named start's
    many-model element, and the report names it; the two starts differ here (each the other's control)."""
    from factories import save_model
    from symmerge.store.model import load_model

    models = [load_model(save_model(make_model("gpt2", s), tmp_path / str(s))) for s in range(3)]
    families, data, w = models[0].spec.default_families(), _data(), [0.5, 0.3, 0.2]
    quick = {"recipe": "quick", "max_rounds": 1, "max_iters": 5, "steps": 0, "val_simplex_points": 2}
    expected = {start: registry.align_many(start, models, w, families, data, quick).elements for start in STARTS}
    assert not all(_same(x, y) for x, y in zip(expected["weight"], expected["activation"]))
    for method in ("learned", "dual"):
        for start in STARTS:
            got = registry.align_many(method, models, w, families, data, {**quick, "start_from": start})
            assert got.figures["start"]["method"] == start and got.figures["time"]["start_s"] >= 0
            assert all(_same(g, e) for g, e in zip(got.elements, expected[start])), (method, start)


def test_an_unknown_start_is_refused():
    with pytest.raises(SymmergeError, match="choose from weight, activation"):
        registry.options("dual", {"start_from": "learned"})


@pytest.mark.parametrize("command", ["align", "merge"])
def test_align_and_merge_take_the_start(command):
    """`--start-from` is a flag of both commands, and reaches the options they run with (none given: weight matching)."""
    from symmerge.cli import build_parser
    from symmerge.commands.option_flags import options_of

    head = [command, "a", "b"] if command == "align" else [command, "a", "b", "c"]
    given = build_parser().parse_args([*head, "-o", "o", "--method", "dual", "--data", "d", "--start-from", "activation"])
    plain = build_parser().parse_args([*head, "-o", "o", "--method", "dual", "--data", "d"])
    assert options_of(given, "dual").resolved()["start_from"] == "activation"
    assert options_of(plain, "dual").resolved()["start_from"] == "weight"


@pytest.mark.parametrize("method", ["learned", "dual"])
def test_every_group_starts_without_the_residual_scale_fit(pair, method):
    """`--groups all`: the learners start from weight matching over every family but the residual scale (which
    weight matching alone fits far from 1 here: the control), with the scale at the identity, and then learn it."""
    a, b = pair
    data = _data()
    fitted = registry.align("weight", a, b, None, data, {})
    assert abs(float(fitted.elements["B"]["residual.scale"]) - 1) > 0.2
    without = registry.align("weight", a, b, [f for f in b.spec.families() if f != "residual_scale"], data, {})
    got = registry.align(method, a, b, None, data, {"recipe": "quick", "steps": 0})
    assert _same(got.start.elements["B"], without.elements["B"]) and float(got.start.elements["B"]["residual.scale"]) == 1
    learned = registry.align(method, a, b, None, data, {"recipe": "quick", "steps": 3})
    assert any(abs(float(g["residual.scale"]) - 1) > 1e-6 for g in learned.elements.values())
