"""A learned-matching checkpoint is written from the tensors where they lie: no copy of the run's state (the
parameters, best state and Adam moments are as large as four times the learned parameters), only of a tensor
that shares memory with another (which safetensors refuses), and it reads back equal.

Control: a dict whose tensors share one storage is copied where it must be (the first keeps it), and writing
it without that copy is refused by safetensors, so the copy is needed, not decoration."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from symmerge.match.learn_state import load_state, save_state, unshared


def test_save_state_copies_nothing_it_need_not_and_reads_back(tmp_path):
    flat = torch.arange(12, dtype=torch.float32)
    tensors = {"param.a": torch.randn(4, 3, requires_grad=True), "adam.a.exp_avg": torch.randn(4, 3),
               "adam.a.step": torch.tensor(3.0), "view.0": flat[:6], "view.1": flat[:6], "empty": torch.zeros(0),
               "t": torch.randn(3, 4).T}
    out = unshared(tensors)
    ptr = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    for k in ("param.a", "adam.a.exp_avg", "adam.a.step", "view.0"):
        assert ptr(out[k]) == ptr(tensors[k]), f"{k} was copied"
    assert ptr(out["view.1"]) != ptr(flat), "a tensor sharing an earlier one's storage was not copied"
    assert out["t"].is_contiguous()
    save_state(tmp_path / "s", tensors, {"step": 3})
    back, meta = load_state(tmp_path / "s")
    assert meta["step"] == 3 and set(back) == set(tensors)
    assert all(torch.equal(back[k], tensors[k].detach()) for k in tensors)
    with pytest.raises(RuntimeError, match="share memory"):  # the control: the copy of a shared one is needed
        save_file({"view.0": flat[:6], "view.1": flat[:6]}, str(tmp_path / "shared.safetensors"))
