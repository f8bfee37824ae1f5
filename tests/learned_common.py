"""What the learned- and dual-matching tests share (their pair of tiny GPT-2s is conftest's `pair`
fixture): a quick configuration, and the stock forward of canonical parameters."""

from __future__ import annotations

import torch

from symmerge.match.learn_config import LearnConfig
from symmerge.model import build_hf_model, export_state_dict

#: the continuous families (what dual matching learns)
CONTINUOUS = ["residual_rotation", "qk_map", "ov_map"]


def quick(**kw) -> LearnConfig:
    """A few steps, validation every three: enough to exercise the loop in well under a second."""
    base = dict(steps=6, lr=0.05, eval_every=3, grid_points=3, progress=False)
    return LearnConfig(**{**base, **kw})


def logits_of(model, params, batch):
    """The stock HF forward of `model`'s class on canonical `params` (float64)."""
    config, sd = export_state_dict(model, params, dtype=torch.float64)
    with torch.no_grad():
        return build_hf_model(config, sd, model.shape.hf_class)(input_ids=batch["input_ids"]).logits
