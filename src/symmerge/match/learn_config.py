"""The settings of learned and dual matching (`learned.py`): one home for their defaults and checks.

`LearnConfig` is what a run is made with; `settings()` is the part a resumed run must share with the
run it continues (stored in the checkpoint, see `learn_state.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import torch

from .. import SymmergeError
from ..evaluate import grid

METHODS = ("learned", "dual")
LAM_SAMPLING = ("uniform", "peak")
#: the working precision of the endpoints' forward (`--dtype`); group parameters, their optimiser state
#: and the group algebra stay float32/float64 whatever this says
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: Adam's learning rate per method: dual at half, since at the start its two sides take opposite copies
#: of the one-sided step (tests/test_learned.py::test_dual_gradients_at_the_start_are_the_one_sided_gradient_twice)
DEFAULT_LR = {"learned": 1e-2, "dual": 5e-3}


def parse_lam_range(text: str) -> tuple[float, float]:
    """"0.4,0.6" -> (0.4, 0.6); a single number means a fixed lambda. Checked by LearnConfig.validate."""
    try:
        parts = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise SymmergeError(f"--lam-range {text!r} is not 'LOW,HIGH' (two numbers in [0, 1])") from None
    if len(parts) not in (1, 2):
        raise SymmergeError(f"--lam-range {text!r} is not 'LOW,HIGH' (two numbers in [0, 1])")
    return (parts[0], parts[-1])


@dataclass
class LearnConfig:
    method: str = "learned"
    groups: list[str] | None = None  # families to learn (default: Spec.default_families)
    param: str = "auto"  # see parametrize.resolve_methods
    steps: int = 200
    lr: float | None = None  # None: the method's DEFAULT_LR
    lam_range: tuple[float, float] = (0.4, 0.6)
    lam_sampling: str = "uniform"  # or "peak": half the steps near the validation curve's highest points
    seed: int = 0
    eval_every: int = 25
    patience: int = 0  # evaluations without improvement before stopping; 0: never stop early
    grid_points: int = 5  # lambdas of the validation barrier (endpoints included)
    anchor: str = "residual"  # "residual" (g = h∘g0, h from the identity) or "absolute"
    dtype: str = "float32"  # of the HF forward (a DTYPES key); group algebra is always float64
    device: str = "cpu"  # where the forward runs: "cpu", "cuda" or "cuda:N" (checked by symmerge.devices)
    checkpoint_every: int = 50
    progress: bool = True

    def __post_init__(self):
        if self.lr is None and self.method in DEFAULT_LR:
            self.lr = DEFAULT_LR[self.method]

    def validate(self) -> None:
        lo, hi = self.lam_range
        if not (0.0 <= lo <= hi <= 1.0):
            raise SymmergeError(f"--lam-range {lo},{hi} must satisfy 0 <= low <= high <= 1")
        if self.lam_sampling not in LAM_SAMPLING:
            raise SymmergeError(f"--lam-sampling must be one of {', '.join(LAM_SAMPLING)}, not {self.lam_sampling!r}")
        if self.method not in METHODS:
            raise SymmergeError(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")
        if self.anchor not in ("residual", "absolute"):
            raise SymmergeError(f"anchor must be residual or absolute, not {self.anchor!r}")
        if self.dtype not in DTYPES:
            raise SymmergeError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", str(self.device)):
            raise SymmergeError(f"device must be cpu, cuda or cuda:N, not {self.device!r}")
        if self.steps < 0 or self.eval_every < 1 or self.lr is None or self.lr <= 0:
            raise SymmergeError("--steps must be >= 0, eval_every >= 1 and the learning rate > 0")
        grid(self.grid_points, interior=True)

    def settings(self) -> dict:
        """What must be equal to resume a run (everything but the progress bar, checkpoint cadence and device)."""
        skip = {"progress", "checkpoint_every", "device"}  # a run may resume on another device
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        out["lam_range"] = list(out["lam_range"])
        if out["lam_sampling"] == "uniform":  # checkpoints written before the option existed still resume
            del out["lam_sampling"]
        return out
