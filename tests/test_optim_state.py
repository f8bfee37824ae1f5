"""One saver of an optimiser's state: `store.optim_state` round-trips Adam's moments and steps exactly, over
several parameter groups, for `symmerge train` and learned matching alike."""

import pytest
import torch

from symmerge.store.optim_state import optimizer_tensors, restore_optimizer


def _stepped(seed: int = 0, steps: int = 3):
    torch.manual_seed(seed)
    a, b, c = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(2))
    opt = torch.optim.AdamW([{"params": [a, b]}, {"params": [c], "weight_decay": 0.0}], lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        ((a.sum(0) * b).sum() ** 2 + (c ** 3).sum()).backward()
        opt.step()
    return opt, [a, b, c]


def _run_on(opt, params, steps: int = 2) -> list[torch.Tensor]:
    a, b, c = params
    for _ in range(steps):
        opt.zero_grad()
        ((a.sum(0) * b).sum() ** 2 + (c ** 3).sum()).backward()
        opt.step()
    return [p.detach().clone() for p in params]


def test_a_restored_optimizer_takes_the_same_steps():
    names = ["a", "b", "c"]
    opt, params = _stepped()
    saved = {k: v.clone() for k, v in optimizer_tensors(opt, names, "adam.").items()}
    assert sorted(saved) == sorted(f"adam.{n}.{k}" for n in names for k in ("step", "exp_avg", "exp_avg_sq"))
    start = [p.detach().clone() for p in params]
    expected = _run_on(opt, params)

    fresh, params2 = _stepped(steps=0)
    with torch.no_grad():
        for p, s in zip(params2, start):
            p.copy_(s)
    restore_optimizer(fresh, names, {**saved, "other.a.exp_avg": torch.zeros(1)}, "adam.")
    got = _run_on(fresh, params2)
    assert all(torch.equal(x, y) for x, y in zip(got, expected))
    # negative control: without the moments the same parameters take other steps
    bare, params3 = _stepped(steps=0)
    with torch.no_grad():
        for p, s in zip(params3, start):
            p.copy_(s)
    assert not all(torch.equal(x, y) for x, y in zip(_run_on(bare, params3), expected))


def test_names_must_match_the_parameters():
    opt, _ = _stepped(steps=1)
    with pytest.raises(ValueError, match="2 names for 3 parameters"):
        optimizer_tensors(opt, ["a", "b"])
