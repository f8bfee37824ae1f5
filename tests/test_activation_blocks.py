"""Activation matching's per-block groups re-solved by weight matching given its rotation (`--blocks weight`):
planted elements still recovered exactly, the rotation kept, and the option reaches the matcher."""

from __future__ import annotations

import pytest
import torch

from factories import make_model, rel_distance, save_model
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.algebra.spec import ROTATION
from symmerge.match.activation import activation_match
from symmerge.match.activation_blocks import blocks_given_rotation
from symmerge.store.model import load_model
from test_activation_matching import batches


@pytest.mark.parametrize("arch", ["gpt2", "llama", "vit"])
def test_planted_recovery_with_blocks_from_weights(arch, tmp_path):
    A = load_model(save_model(make_model(arch, 0), tmp_path / "a"))
    B = load_model(tmp_path / "a")
    B.params = apply(A.spec, random_element(A.spec, torch.Generator().manual_seed(3)), A.params)
    found = activation_match(A, B, batches(arch))  # every family: the planted element has a residual scale
    res = blocks_given_rotation(A, B, None, found)
    assert torch.equal(res.g[ROTATION], found.g[ROTATION])
    assert res.extra["blocks"] == "weight"
    assert rel_distance(apply(A.spec, res.g, B.params), A.params) <= 1e-5
    shuffled = dict(res.g)  # negative control: one FFN unit pair swapped
    shuffled["blocks.0.ffn"] = res.g["blocks.0.ffn"].clone()
    shuffled["blocks.0.ffn"][[0, 1]] = shuffled["blocks.0.ffn"][[1, 0]]
    assert rel_distance(apply(A.spec, shuffled, B.params), A.params) > 1e-3


def test_blocks_from_weights_start_at_the_rotation_found(tmp_path):
    """From a wrong rotation the per-block groups cannot undo it: the result depends on the rotation given
    (negative control that the rotation is held, not re-solved)."""
    A = load_model(save_model(make_model("gpt2", 0), tmp_path / "a"))
    B = load_model(tmp_path / "a")
    B.params = apply(A.spec, random_element(A.spec, torch.Generator().manual_seed(3)), A.params)
    found = activation_match(A, B, batches("gpt2"))
    found.g = {**found.g, ROTATION: torch.eye(found.g[ROTATION].shape[0], dtype=found.g[ROTATION].dtype)}
    res = blocks_given_rotation(A, B, None, found)
    assert torch.equal(res.g[ROTATION], found.g[ROTATION])
    assert rel_distance(apply(A.spec, res.g, B.params), A.params) > 0.1


def test_only_the_rotation_selected_leaves_the_element(tmp_path):
    A = load_model(save_model(make_model("gpt2", 0), tmp_path / "a"))
    found = activation_match(A, A, batches("gpt2"), ["residual_rotation"])
    assert blocks_given_rotation(A, A, ["residual_rotation"], found) is found


def _distance_to(spec, B, ref):
    """A loss for `per_block`: how far g·B lies from ref·B (lowest, 0, at ref)."""
    target = apply(spec, ref, B.params)
    return lambda g: rel_distance(apply(spec, g, B.params), target)


@pytest.mark.parametrize("prefer", [0, 2])
def test_best_keeps_the_candidate_the_loss_prefers(prefer, tmp_path):
    """`--blocks best` keeps the candidate whose loss is lowest, element and all; the other candidates' losses are
    in the report. Two unrelated models, so the candidates differ (checked: otherwise the choice proves nothing)."""
    from symmerge.match.activation_blocks import CANDIDATES, per_block
    from symmerge.match.weight import weight_match

    A = load_model(save_model(make_model("llama", 0), tmp_path / "a"))
    B = load_model(save_model(make_model("llama", 1), tmp_path / "b"))
    found = activation_match(A, B, batches("llama"))
    ref = blocks_given_rotation(A, B, None, found).g if prefer == 0 else weight_match(A.spec, A, B, None).g
    res = per_block(A, B, None, found, "best", _distance_to(A.spec, B, ref))
    losses = res.extra["blocks_candidates"]
    assert res.extra["blocks_kept"] == CANDIDATES[prefer] and losses[CANDIDATES[prefer]] <= 1e-12
    assert min(v for k, v in losses.items() if k != CANDIDATES[prefer]) > 1e-6, "the candidates do not differ"
    assert rel_distance(apply(A.spec, res.g, B.params), apply(A.spec, ref, B.params)) <= 1e-12
    assert torch.equal(per_block(A, B, None, found, "weight", None).g[ROTATION], found.g[ROTATION])
    assert per_block(A, B, None, found, "activation", None) is found


def test_align_default_keeps_the_lowest_midpoint_loss(tmp_path, monkeypatch):
    """`align --method activation` (the API) finishes with `best`: the losses it reports are the midpoint's stock
    loss on validation batches, not on the batches it was fitted on (the barrier's middle point, computed apart),
    and it keeps the lowest."""

    import symmerge.data.batches
    from symmerge import api
    from symmerge.evaluation.barrier_pair import barrier

    A = load_model(save_model(make_model("gpt2", 0), tmp_path / "a"))
    B = load_model(save_model(make_model("gpt2", 1), tmp_path / "b"))
    split = {"train": batches("gpt2"), "validation": batches("gpt2", seed=1)}
    monkeypatch.setattr(symmerge.data.batches, "load_batches", lambda model, data, which, *a, **k: split[which])
    res = api.align(A, B, method="activation", data="fake", groups=None)
    fig = res.report
    assert fig["blocks"] == "best"
    kept = fig["blocks_kept"]
    assert fig["blocks_candidates"][kept] == min(fig["blocks_candidates"].values())
    moved = B.moved(res.elements["B"])

    def mid(a, b, data):
        return barrier(a, b, data, points=3, progress=False, dtype=torch.float64)["loss"][1]

    tol = 8 * torch.finfo(torch.float32).eps * mid(A, moved, split["validation"])  # the align forward: float32
    assert fig["blocks_candidates"][kept] == pytest.approx(mid(A, moved, split["validation"]), abs=tol)
    assert abs(mid(A, moved, split["train"]) - mid(A, moved, split["validation"])) > 100 * tol  # the controls
    assert abs(mid(A, B, split["validation"]) - mid(A, moved, split["validation"])) > 100 * tol


@pytest.mark.parametrize("blocks, reads", [("best", {"train", "validation"}), ("weight", {"train"}),
                                           ("activation", {"train"})])
def test_align_reads_held_out_batches_only_where_its_blocks_judge_them(blocks, reads, tmp_path, monkeypatch):
    """`align --method activation` loads the validation split only for `--blocks best`, the one choice that judges
    candidates on it; "weight" and "activation" read the training split alone (the control: "best" reads both)."""
    import symmerge.data.batches
    from symmerge.workflows.pair import align_checkpoints

    a = save_model(make_model("gpt2", 0), tmp_path / "a")
    b = save_model(make_model("gpt2", 1), tmp_path / "b")
    split = {"train": batches("gpt2"), "validation": batches("gpt2", seed=1)}
    read = set()

    def load(model, data, which, *args, **kwargs):
        read.add(which)
        return split[which]

    monkeypatch.setattr(symmerge.data.batches, "load_batches", load)
    rep = align_checkpoints(a, b, tmp_path / "out", "activation", {"blocks": blocks}, data="fake")
    assert read == reads
    assert rep.get("blocks", "activation") == blocks  # the option reached the matcher (the data-only element says nothing)
