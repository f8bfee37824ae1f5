"""`residual_perm`: the residual rotation restricted to permutation matrices, the residual group of
permutation-only matching (weight matching by assignment, learned matching by straight-through)."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from checks import assert_different_function, assert_reported_gap, assert_same_function, with_tensor_of
from factories import example_inputs, lm_batches, make_model, rel_distance, save_model
from learned_common import plain_loss
from symmerge import SymmergeError, cli
from symmerge.algebra import groups as G
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.match.activation import activation_match
from symmerge.match.learn_config import LearnConfig
from symmerge.match.learned import learn
from symmerge.match.learner import Learner
from symmerge.match.outputs import output_report, save_outputs
from symmerge.match.weight import weight_match
from symmerge.store.model import load_model

PERMS_ONLY = ["residual_perm", "head_perm", "ffn_perm"]


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    return load_model(save_model(make_model("gpt2", 0), d / "a")), load_model(save_model(make_model("gpt2", 1), d / "b"))


def test_the_restricted_group_holds_permutation_matrices_only(gpt2_pair):
    a, _ = gpt2_pair
    spec = a.spec.restricted(PERMS_ONLY)
    grp = spec.groups["residual.rotation"]
    assert grp.family == "residual_perm" and grp.discrete and grp.dimension == 0
    assert "residual_perm" not in a.spec.families() and a.spec.groups["residual.rotation"].family == "residual_rotation"
    g = random_element(a.spec, torch.Generator().manual_seed(0), PERMS_ONLY)["residual.rotation"]
    assert G.membership_error(grp, g) == 0.0 and not torch.equal(g, torch.eye(g.shape[0], dtype=g.dtype))
    assert sorted(g.argmax(1).tolist()) == list(range(g.shape[0]))
    # negative control: a rotation (here one fixing the all-ones vector, a symmetry of GPT-2) is not a member
    rot = G.random_element(a.spec.groups["residual.rotation"], torch.Generator().manual_seed(0))
    assert G.membership_error(a.spec.groups["residual.rotation"], rot) < 1e-12
    assert G.membership_error(grp, rot) > 0.1
    with pytest.raises(SymmergeError, match="not both"):
        a.spec.select(["residual_perm", "residual_rotation"])


@pytest.mark.parametrize("arch", ["gpt2", "llama", "olmo2"])
def test_cli_permutations_only_recovers_a_planted_permutation(tmp_path, arch):
    """B = g·A with g a random residual, head and FFN permutation: B computes A's function (stock HF,
    LayerNorm included), and weight matching over the permutations alone recovers A exactly;
    without the residual permutation it cannot (negative control)."""
    a = save_model(make_model(arch, 0), tmp_path / "a")
    groups = ",".join(PERMS_ONLY)
    assert cli.main(["transform", str(a), "-o", str(tmp_path / "b"), "--groups", groups, "--seed", "4"]) == 0
    x = example_inputs(arch)
    hf_a, hf_b = (T.AutoModelForCausalLM.from_pretrained(tmp_path / n).eval() for n in ("a", "b"))
    assert_same_function(hf_b, hf_a, x, what=f"{arch} permuted")
    assert_different_function(with_tensor_of(hf_b, hf_a, 0), hf_a, x, what="one reader left unpermuted")
    A, B = load_model(tmp_path / "a"), load_model(tmp_path / "b")
    assert rel_distance(B.params, A.params) > 0.1, "the planted element must move the weights"
    assert cli.main(["align", str(a), str(tmp_path / "b"), "-o", str(tmp_path / "c"), "--groups", groups]) == 0
    assert rel_distance(load_model(tmp_path / "c").params, A.params) <= 1e-5
    without = weight_match(B.spec, A.params, B.params, ["head_perm", "ffn_perm"], max_iters=10)
    assert rel_distance(apply(B.spec, without.g, B.params), A.params) > 0.1


def test_learned_permutations_only_moves_the_residual_permutation_and_keeps_b(gpt2_pair, tmp_path):
    """Straight-through learning of the residual permutation: its latent gets the gradient a dense
    matrix in its place would get, a large learning rate reassigns it, and g·B is a stock HF checkpoint
    with B's logits; its residual element is a permutation matrix."""
    a, b = gpt2_pair
    init = weight_match(b.spec, a.params, b.params, PERMS_ONLY, max_iters=5).g
    assert G.membership_error(b.spec.restricted(PERMS_ONLY).groups["residual.rotation"], init["residual.rotation"]) == 0
    learner = Learner(a, b, LearnConfig(groups=PERMS_ONLY, progress=False), init)
    slot = next(s for s in learner.slots if s.group == "residual.rotation")
    assert slot.param is None, "the residual permutation is discrete: straight-through, not parameterised"
    batch = lm_batches(1, 0)[0]
    learner.loss(batch, 0.5).backward()
    grad = slot.raw["latent"].grad.clone()
    assert float(grad.abs().max()) > 0
    # reference: the same hard element, its residual matrix a leaf we differentiate against
    g = {n: t.detach() if torch.is_tensor(t) else t for n, t in learner.element("B", hard=True).items()}
    leaf = g["residual.rotation"].to(torch.float32).requires_grad_(True)
    g = {n: (t.to(torch.float32) if torch.is_tensor(t) and t.is_floating_point() else t) for n, t in g.items()}
    g["residual.rotation"] = leaf
    plain_loss(a, learner, batch, 0.5, {"B": g}).backward()
    assert torch.allclose(grad, leaf.grad, rtol=1e-4, atol=1e-6)
    leaf.grad = None  # negative control: the dense gradient at another λ
    plain_loss(a, learner, batch, 0.3, {"B": g}).backward()
    assert not torch.allclose(grad, leaf.grad, rtol=1e-4, atol=1e-6)

    cfg = LearnConfig(groups=PERMS_ONLY, steps=9, lr=0.5, eval_every=3, grid_points=3, progress=False)
    result = learn(a, b, lm_batches(3, 0), lm_batches(1, 1), cfg, init=init)
    r = result.elements["B"]["residual.rotation"]
    assert sorted(r.argmax(1).tolist()) == list(range(r.shape[0])) and torch.equal(r, r.round())
    assert result.report["best_step"] > 0 and result.report["barrier_after"] < result.report["barrier_before"]
    assert int((r != init["residual.rotation"]).any(dim=1).sum()) > 0, "lr 0.5 must reassign the residual permutation"
    report = output_report(save_outputs(result, a, b, tmp_path / "out"), b.shape.hf_class, lm_batches(1, 9)[0])
    assert_reported_gap(report[0], lm_batches(1, 9)[0])


def test_activation_matching_over_permutations_only(gpt2_pair):
    a, b = gpt2_pair
    res = activation_match(a, b, lm_batches(2, 0), PERMS_ONLY)
    r = res.g["residual.rotation"]
    assert not torch.equal(r, torch.eye(r.shape[0], dtype=r.dtype))
    assert G.membership_error(b.spec.restricted(PERMS_ONLY).groups["residual.rotation"], r) == 0.0


def test_dual_matching_keeps_a_residual_permutation_fixed(gpt2_pair):
    a, b = gpt2_pair
    with pytest.raises(SymmergeError, match="nothing to learn"):
        Learner(a, b, LearnConfig(method="dual", groups=PERMS_ONLY, progress=False), None)
