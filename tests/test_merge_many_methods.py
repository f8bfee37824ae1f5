"""Merging many models by every method on one architecture of each block structure (`factories.STRUCTURES`), against
the stock transformers forward.

Planted: A (a factory model; the ViT trained briefly on digits) and g1·A, g2·A (random elements of the default families, saved as stock
checkpoints). The language models' batches are labelled with A's own predictions (the ViT's are digits), so that a wrong merge costs loss.
Each method's elements bring all three into shared coordinates: every aligned endpoint computes its
input's function, the weighted average computes A's function and its average_excess is 0; plain averaging
of the same three is well above (negative control). Learned and dual matching start from weight
matching's solution; with learning steps the best validation state may lie *below* it (an average better
than the endpoints: on these batches sharpening A helps), so A's function is checked with 0 steps and
learning's promise (never worse on validation, endpoints exact) with steps.
"""

from __future__ import annotations

import json

import pytest
import torch

from checks import assert_different_function, assert_same_function, stock, tolerance
from factories import STRUCTURES, lm_batches, make_model, save_model
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.evaluation.barrier_many import many_barrier
from symmerge.evaluation.forward import StockForward
from symmerge.match import registry
from symmerge.match.activation_many import activation_match_many, average_loss
from symmerge.match.learn_config import LearnConfig
from symmerge.match.learn_many import learn_many
from symmerge.store.model import load_model
from symmerge.store.model import save_model as save_canonical

pytestmark = pytest.mark.usefixtures("one_thread")

METHODS = ("weight", "activation", "learned", "dual")
QUICK = {"recipe": "quick", "max_rounds": 3, "max_iters": 5, "steps": 0, "eval_every": 2, "val_simplex_points": 2}


def own_labels(model, batches: list[dict]) -> list[dict]:
    """The batches labelled with the model's own argmax predictions (next token: label t+1 is the argmax at t)."""
    ev = StockForward(model)
    out = []
    for b in batches:
        pred = ev.logits(model.params, b).argmax(-1)
        if pred.dim() == 2:  # (B, T): the HF loss scores logits at t against labels at t + 1
            labels = b["input_ids"].clone()
            labels[:, 1:] = pred[:, :-1]
        else:
            labels = pred
        out.append({**b, "labels": labels})
    return out


def raw_batches(arch: str, n: int, seed: int) -> list[dict]:
    return lm_batches(n, seed, size=3, length=10)


class Planted:
    """A, g1·A, g2·A of one architecture (folders and in-memory models), batches, and weight matching's start."""

    def __init__(self, arch: str, root):
        if arch == "vit":  # trained on digits: the random factory ViT's loss is flat under plain averaging
            from symmerge.training.trainer import TrainArgs, train

            a = root / "a"
            train(TrainArgs(arch="vit", preset="tiny", data="digits", seed=0, out=str(a), steps=60, lr=1e-2, progress=False))
        else:
            a = save_model(make_model(arch, 0), root / "a")
        model = load_model(a)
        self.paths = [a]
        for s in (1, 2):
            g = random_element(model.spec, torch.Generator().manual_seed(s), model.spec.default_families())
            self.paths.append(save_canonical(model, apply(model.spec, g, model.params), root / f"g{s}a"))
        self.models = [load_model(p) for p in self.paths]
        if arch == "vit":
            from symmerge.data.batches import load_batches

            self.data = registry.Data(load_batches(a, "digits", "train", 8, None, 2),
                                      load_batches(a, "digits", "validation", 8, None, 2))
        else:
            self.data = registry.Data(own_labels(model, raw_batches(arch, 2, 0)), own_labels(model, raw_batches(arch, 1, 1)))
        self.families = model.spec.default_families()
        self.weights = [0.5, 0.3, 0.2]
        self.start = registry.align_many("weight", self.models, self.weights, self.families, opts=QUICK)
        self.plain = many_barrier(self.models, self.data.val, self.weights, points=2, simplex_points=2, progress=False)
        self.stock = [stock(p) for p in self.paths]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    cache = {}

    def get(arch: str) -> Planted:
        if arch not in cache:
            cache[arch] = Planted(arch, tmp_path_factory.mktemp(arch))
        return cache[arch]

    return get


def _inputs(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k != "labels"}


def _logits(hf, batch) -> torch.Tensor:
    from factories import logits

    return logits(hf, _inputs(batch))


def _moved(p: Planted, elements) -> list:
    return [m.moved(g) for m, g in zip(p.models, elements)]


def _check_endpoints(p: Planted, aligned: list, what: str) -> None:
    """Every aligned endpoint computes its input's function (stock forward of the input's folder)."""
    batch = p.data.val[0]
    ev = StockForward(p.models[0])
    for i, (m, hf) in enumerate(zip(aligned, p.stock)):
        assert_same_function(ev.logits(m.params, batch), _logits(hf, batch), dtype=_precision(hf),
                             what=f"{what}: aligned endpoint {i + 1}")


def _precision(hf) -> torch.dtype:
    from checks import precision

    return precision(hf)


#: on one architecture of each structure: the many-model matchers' per-architecture parts (the solvers of each
#: family, the hooks, the parametrisation) are the pair matchers', which test_weight_matching,
#: test_activation_matching and test_learned run on every architecture
@pytest.mark.parametrize("arch,method", [(a, m) for a in STRUCTURES for m in METHODS])
def test_planted_merge_gives_a_function(arch, method, planted):
    p = planted(arch)
    res = p.start if method == "weight" else registry.align_many(
        method, p.models, p.weights, p.families, p.data, opts=QUICK, start=p.start if method in ("learned", "dual") else None)
    aligned = _moved(p, res.elements)
    _check_endpoints(p, aligned, f"{arch}/{method}")
    batch = p.data.val[0]
    mean = {k: sum(w * m.params[k] for w, m in zip(p.weights, aligned)) if aligned[0].params[k].dim() else
            aligned[0].params[k] for k in aligned[0].params}
    ev = StockForward(p.models[0])
    ref = _logits(p.stock[0], batch)
    d = _precision(p.stock[0])
    assert_same_function(ev.logits(mean, batch), ref, dtype=d, what=f"{arch}/{method}: merged vs A")
    r = many_barrier(aligned, p.data.val, p.weights, points=2, simplex_points=2, progress=False)
    tol = tolerance(d, torch.tensor(r["average_loss"]))
    assert abs(r["average_excess"]) <= tol and r["simplex_barrier"] <= tol and r["pairwise_max"] <= tol, r
    # negative control: plain averaging of the same three
    plain = {k: sum(w * m.params[k] for w, m in zip(p.weights, p.models)) for k in p.models[0].params}
    assert_different_function(ev.logits(plain, batch), ref, dtype=d, what=f"{arch}: plain average vs A")
    assert p.plain["average_excess"] > 0.02, p.plain["average_excess"]
    if method in ("weight", "activation"):
        h = res.figures["objective"]
        assert all(b >= a for a, b in zip(h, h[1:])) and res.figures["rounds"] >= 1, h


@pytest.mark.parametrize("method", ["learned", "dual"])
@pytest.mark.parametrize("arch", STRUCTURES)
def test_learning_never_worsens_and_keeps_the_endpoints(arch, method, planted):
    """With learning steps: the validation objective is never above the start's (0 at the planted solution),
    the reported objective is what the returned elements give, and every endpoint is still exact."""
    p = planted(arch)
    res = registry.align_many(method, p.models, p.weights, p.families, p.data, opts={**QUICK, "steps": 3},
                              start=p.start)
    f = res.figures
    objective = [h["objective"] for h in f["history"]]  # the best-state rule: the lowest, the first of equals
    assert f["objective_after"] == min(objective) and f["best_step"] == f["history"][objective.index(min(objective))]["step"]
    assert f["objective_before"] == objective[0] and abs(objective[0]) < 1e-4, f["history"]
    assert f["gauge"].startswith("reference: model 1") and f["steps"] == 3
    assert all(torch.equal(res.elements[0][k], p.start.elements[0][k]) for k in p.start.elements[0])  # the gauge
    aligned = _moved(p, res.elements)
    _check_endpoints(p, aligned, f"{arch}/{method} learned")
    ends = [StockForward(p.models[0], torch.float32).mean_loss(m.params, p.data.val) for m in aligned]
    mix = {k: sum(w * m.params[k] for w, m in zip(p.weights, aligned)) if aligned[0].params[k].dim() else
           aligned[0].params[k] for k in aligned[0].params}
    excess = StockForward(p.models[0], torch.float32).mean_loss(mix, p.data.val) - sum(
        w * e for w, e in zip(p.weights, ends))
    assert excess == pytest.approx(f["history"][[h["step"] for h in f["history"]].index(f["best_step"])]["excess"][0],
                                   abs=1e-4)


def test_learned_many_solves_a_planted_problem_from_the_identity(tmp_path):
    """g1·A, g2·A with random continuous elements and no weight-matching start: the simplex loss is poor at the
    start and learning the two non-reference elements brings the validation objective down by over 90%."""
    a = load_model(save_model(make_model("gpt2", 0), tmp_path / "a"))
    fams = ["residual_rotation", "qk_map", "ov_map"]
    models = [a] + [a.moved(random_element(a.spec, torch.Generator().manual_seed(s), fams, spread=1.5)) for s in (5, 6)]
    cfg = LearnConfig(groups=fams, steps=60, lr=0.02, eval_every=15, progress=False)
    train, val = own_labels(a, raw_batches("gpt2", 4, 0)), own_labels(a, raw_batches("gpt2", 2, 1))
    res = learn_many(models, [1 / 3] * 3, train, val, cfg, val_points=2)
    r = res.report
    assert r["objective_before"] > 0.2, "the planted problem is too easy to prove anything"
    assert r["objective_after"] < 0.1 * r["objective_before"], r["history"]
    assert set(r["parameterisation"]) == {n for n in a.spec.select(fams)}


def test_activation_objective_never_decreases_and_is_the_average_loss(tmp_path):
    """Three independently initialised GPT-2s: the objective (minus the loss of the weighted average on the
    batches) never decreases over the rounds, and it is the stock forward's loss of the merged checkpoint."""
    models = [load_model(save_model(make_model("gpt2", s), tmp_path / f"m{s}")) for s in range(3)]
    batches = own_labels(models[0], raw_batches("gpt2", 2, 0))
    w = [0.4, 0.3, 0.3]
    res = activation_match_many(models, w, batches, models[0].spec.default_families(), max_rounds=3, seed=1)
    h = res.history
    assert all(b >= a for a, b in zip(h, h[1:])) and len(h) >= 3 and h[-1] > h[0], h
    merged = {k: sum(wi * apply(m.spec, g, m.params)[k] for wi, m, g in zip(w, models, res.elements))
              for k in models[0].params}
    save_canonical(models[0], merged, tmp_path / "merged")
    hf = stock(tmp_path / "merged")
    with torch.no_grad():
        loss = sum(float(hf(**b).loss) for b in batches) / len(batches)
    assert -h[-1] == pytest.approx(loss, abs=1e-9)
    assert average_loss(models, res.elements, w, batches) == pytest.approx(loss, abs=1e-9)
    # negative control: the weights in another order give another average and loss
    assert abs(average_loss(models, res.elements, [0.3, 0.3, 0.4], batches) - loss) > 1e-4


def test_activation_objective_reads_the_held_out_batches_where_given(tmp_path):
    """With held-out batches (those `--blocks best` chooses on), the objective is the average's loss on them, not
    on the batches the activations are taken on (a learner's start can give every window of the split there)."""
    models = [load_model(save_model(make_model("gpt2", s), tmp_path / f"m{s}")) for s in range(3)]
    batches = own_labels(models[0], raw_batches("gpt2", 2, 0))
    held = own_labels(models[0], raw_batches("gpt2", 2, 5))
    w = [0.4, 0.3, 0.3]
    res = activation_match_many(models, w, batches, models[0].spec.default_families(), max_rounds=2, seed=1,
                                held_out=held)
    h = res.history
    assert all(b >= a for a, b in zip(h, h[1:])), h
    assert -h[-1] == pytest.approx(average_loss(models, res.elements, w, held), abs=1e-9)
    assert abs(-h[-1] - average_loss(models, res.elements, w, batches)) > 1e-4  # the control: the training batches


def test_cli_merge_by_every_data_method(planted, tmp_path, monkeypatch):
    """`merge --method activation|learned|dual --data`: OUT computes A's function (learned/dual with
    --steps 0), DIR/i its input's; the report says the gauge."""
    import symmerge.data.batches

    p = planted("gpt2")
    monkeypatch.setattr(symmerge.data.batches, "load_batches", lambda *a, **k: p.data.train if a[2] == "train" else p.data.val)
    x = _inputs(p.data.val[0])
    for method in ("activation", "learned", "dual"):
        out, al, rep = tmp_path / f"{method}-m", tmp_path / f"{method}-al", tmp_path / f"{method}.json"
        from symmerge.cli import main

        assert main(["merge", *map(str, p.paths), "-o", str(out), "--aligned", str(al), "--json", str(rep),
                     "--method", method, "--data", "fake", "--steps", "0", "--max-rounds", "2", "--weights",
                     "0.5,0.3,0.2"]) == 0
        assert_same_function(stock(out), p.stock[0], x, what=f"{method}: merged vs A")
        for i in range(3):
            assert_same_function(stock(al / str(i + 1)), p.stock[i], x, what=f"{method}: aligned {i + 1}")
        r = json.loads(rep.read_text())
        assert r["method"] == method and r["rounds"] >= 1
        if method != "activation":
            assert "reference: model 1" in r["gauge"] and r["start"]["method"] == "weight" and r["start"]["rounds"] >= 1
