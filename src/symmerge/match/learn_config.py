"""The settings of learned and dual matching (`learned.py`): one home for their defaults and checks.

`LearnConfig` is what a run is made with; its defaults are the `full` recipe. `settings()` is the part
a resumed run must share with the run it continues (stored in the checkpoint, see `learn_state.py`).

Recipes (`RECIPES`, `align --recipe`), each a full set of defaults that explicit options override:

- `full` (the default): every training batch given, `EPOCHS` passes over them with cosine decay,
  λ drawn from (0.2, 0.8) (for a pair, half the draws near the path's highest points: `objectives.PathObjective`)
  and an 11-point validation grid (the whole path, as the reported barrier sees it),
  `EVALUATIONS` validation barriers in the run, the validation data sized from the standard error of
  the validation barrier (`VAL_SE`: as many batches as that needs, all given ones at most), and the
  learning rate chosen for the pair by a short search on the validation split (`lr="auto"`,
  `lr_search.py`), with no learning past the plan unless `extend` is raised (`EXTEND`). These are the
  settings that took dual matching to zero on the MNIST ViT pair (benchmarks/README.md, "The reproduction
  table", 8000 steps), with the data, steps and rate made relative to the pair.
- `quick`: a smoke test (200 steps on 8 batches of 8, λ from (0.4, 0.6), 5 grid points, the method's
  fixed learning rate): what `align --method learned|dual` did before it had a recipe.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

import torch

from ..errors import SymmergeError
from ..evaluation.forward import grid
from .blockwise import RECOMPUTE

METHODS = ("learned", "dual")
LAM_SAMPLING = ("uniform", "peak")
#: the working precision of the endpoints' forward (`--dtype`); group parameters, their optimiser state
#: and the group algebra stay float32/float64 whatever this says
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: Adam's learning rate per method: dual at half, since at the start its two sides take opposite copies
#: of the one-sided step (tests/test_learned.py::test_dual_gradients_at_the_start_are_the_one_sided_gradient_twice)
DEFAULT_LR = {"learned": 1e-2, "dual": 5e-3}
#: `lr="auto"`: the rates tried, as fractions of the method's DEFAULT_LR (half-decades down to 1/100:
#: the rates chosen on validation by hand for the recorded pairs, 5e-5 to 5e-3 for dual, lie in it)
LR_FACTORS = (0.01, 0.03, 0.1, 0.3, 1.0)
#: the full recipe: passes over the training batches, validation barriers per run, and the standard
#: error (nats) the validation barrier is sized for. Twelve passes under one cosine decay left a test barrier at or
#: below that of eight on every pair measured both ways on one training (benchmarks/results/default_dual.json, the
#: records NAME and NAME-epochs8), and took 1.7 times as long as the recipe before eight passes (four learning on up
#: to eight, recomputing every block) on the GPT-2 demo pair
EPOCHS = 12.0
EVALUATIONS = 10
VAL_SE = 0.002
#: nats: below this a change of the validation barrier is called "within" whatever its standard error, and
#: a run's last gain too small to learn on for
FLAT = 1e-3
#: the full recipe's cap on a run that is still improving at its planned end: this multiple of its planned steps
#: (1: the planned length is the run's; `--extend` raises it)
EXTEND = 1.0
#: data per training batch of the full recipe, in tokens (an image counts its patches and CLS token):
#: 16 windows of 64 characters, 4 of 256, 60 MNIST images of 16 patches, as the recorded recipes used
BATCH_TOKENS = 1024
#: settings a checkpoint may lack, with the value a run had before they were written (`learn_loop.Run.load`
#: reads a checkpoint without one as holding this value)
IMPLIED = {"lam_sampling": "uniform", "extend": 1, "lr_scale": None}

RECIPES = {
    "full": {"steps": None, "epochs": EPOCHS, "lr": "auto", "lam_range": (0.2, 0.8), "grid_points": 11,
             "eval_every": None, "val_batches": "auto", "batch_size": None, "max_batches": None, "extend": EXTEND},
    "quick": {"steps": 200, "epochs": None, "lr": DEFAULT_LR, "lam_range": (0.4, 0.6), "grid_points": 5,
              "eval_every": 25, "val_batches": 16, "batch_size": 8, "max_batches": 8, "extend": 1.0},
}
#: a run's length is given by one of these; giving one explicitly drops the recipe's other, and fixes the
#: length (`extend` 1 unless given too)
LENGTH = ("steps", "epochs")


def recipe_value(recipe: str, name: str, method: str):
    """The recipe's default for option `name` of `method` (a per-method default is a dict)."""
    if recipe not in RECIPES:
        raise SymmergeError(f"--recipe must be one of {', '.join(RECIPES)}, not {recipe!r}")
    value = RECIPES[recipe][name]
    return value[method] if isinstance(value, dict) else value


def parse_lam_range(text: str) -> tuple[float, float]:
    """"0.4,0.6" -> (0.4, 0.6); a single number means a fixed lambda. Checked by LearnConfig.validate."""
    try:
        parts = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise SymmergeError(f"--lam-range {text!r} is not 'LOW,HIGH' (two numbers in [0, 1])") from None
    if len(parts) not in (1, 2):
        raise SymmergeError(f"--lam-range {text!r} is not 'LOW,HIGH' (two numbers in [0, 1])")
    return (parts[0], parts[-1])


def _auto_or(text: str, flag: str, kind, what: str):
    """'auto', or `kind(text)`; SymmergeError naming `flag` when it is neither."""
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        return kind(text)
    except ValueError:
        raise SymmergeError(f"{flag} {text!r} is neither 'auto' nor {what}") from None


def parse_lr(text: str) -> float | str:
    """`--lr`: 'auto' (a search on the validation split) or a finite rate above 0."""
    x = _auto_or(text, "--lr", float, "a number")
    if x != "auto" and not math.isfinite(x):
        raise SymmergeError(f"--lr {text} is not a finite number; give a rate above 0 or 'auto'")
    if x != "auto" and x <= 0:
        raise SymmergeError(f"--lr {text} must be above 0 (or 'auto')")
    return x


def _finite(flag: str, text: str, ok, need: str) -> float:
    """`text` as a finite float for which `ok` holds; else one line naming the flag and what it needs."""
    try:
        x = float(text)
    except ValueError:
        raise SymmergeError(f"{flag} {text!r} is not a number") from None
    if not (math.isfinite(x) and ok(x)):
        raise SymmergeError(f"{flag} {text} must be {need}")
    return x


def parse_epochs(text: str) -> float:
    """`--epochs`: a finite number above 0."""
    return _finite("--epochs", text, lambda x: x > 0, "a finite number above 0")


def parse_extend(text: str) -> float:
    """`--extend`: a finite number of at least 1."""
    return _finite("--extend", text, lambda x: x >= 1,
                   "a finite number of at least 1 (1: never learn past the planned steps)")


def parse_lr_scale(text: str | None) -> dict[str, float]:
    """`--lr-scale`: "FAMILY=FACTOR,..." -> {family: factor}, each factor a finite number above 0 (a family
    not named keeps factor 1). Whether the families are learned is checked by the learner (`learner.rate_groups`)."""
    out: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in str(text or "").split(","))):
        fam, eq, factor = (x.strip() for x in item.partition("="))
        if not eq or not fam:
            raise SymmergeError(f"--lr-scale {text!r} is not 'FAMILY=FACTOR,...' (e.g. residual_rotation=3)")
        if fam in out:
            raise SymmergeError(f"--lr-scale names {fam} twice")
        out[fam] = _finite(f"--lr-scale {fam}=", factor, lambda x: x > 0, "a finite number above 0")
    return out


def parse_val_batches(text: str) -> int | str:
    """`--val-batches`: 'auto' (sized from the standard error) or a whole number of at least 1."""
    n = _auto_or(text, "--val-batches", int, "a whole number")
    if n != "auto" and n < 1:
        raise SymmergeError(f"--val-batches {text} must be at least 1 (or 'auto')")
    return n


_FULL = RECIPES["full"]


@dataclass
class LearnConfig:
    method: str = "learned"
    groups: list[str] | None = None  # families to learn (default: Spec.default_families)
    param: str = "auto"  # see parametrize.resolve_methods
    steps: int | None = _FULL["steps"]  # given: the run's length; None: `epochs` passes over the batches
    epochs: float | None = _FULL["epochs"]  # read only when `steps` is None
    lr: float | str | None = _FULL["lr"]  # "auto": lr_search.py; None: the method's DEFAULT_LR
    lr_scale: str | None = None  # "FAMILY=FACTOR,...": those families' rate is FACTOR x lr (parse_lr_scale)
    lam_range: tuple[float, float] = _FULL["lam_range"]
    lam_sampling: str | None = None  # "uniform", "peak"; None: the objective's own (objectives.SAMPLINGS)
    seed: int = 0
    eval_every: int | None = _FULL["eval_every"]  # None: steps / `evaluations`
    evaluations: int = EVALUATIONS
    patience: int = 0  # evaluations without improvement before stopping; 0: never stop early
    extend: float = _FULL["extend"]  # learn on while the best state is the last evaluation, up to this x steps
    grid_points: int = _FULL["grid_points"]  # lambdas of the validation barrier (endpoints included)
    val_batches: int | str | None = _FULL["val_batches"]  # "auto": sized for VAL_SE; None: all given
    anchor: str = "residual"  # "residual" (g = h∘g0, h from the identity) or "absolute"
    dtype: str = "float32"  # of the HF forward (a DTYPES key); group algebra is always float64
    device: str = "cpu"  # where the forward runs: "cpu", "cuda" or "cuda:N" (checked by symmerge.runtime.devices)
    recompute: str = "auto"  # what the backward recomputes per block (blockwise.RECOMPUTE); never changes a result
    checkpoint_every: int = 50
    progress: bool = True

    def __post_init__(self):
        if self.lr is None and self.method in DEFAULT_LR:
            self.lr = DEFAULT_LR[self.method]

    def validate(self) -> None:
        lo, hi = self.lam_range
        if not (0.0 <= lo <= hi <= 1.0):
            raise SymmergeError(f"--lam-range {lo},{hi} must satisfy 0 <= low <= high <= 1")
        if self.lam_sampling is not None and self.lam_sampling not in LAM_SAMPLING:
            raise SymmergeError(f"--lam-sampling must be one of {', '.join(LAM_SAMPLING)}, not {self.lam_sampling!r}")
        if self.method not in METHODS:
            raise SymmergeError(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")
        if self.anchor not in ("residual", "absolute"):
            raise SymmergeError(f"anchor must be residual or absolute, not {self.anchor!r}")
        if self.dtype not in DTYPES:
            raise SymmergeError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.recompute not in RECOMPUTE:
            raise SymmergeError(f"recompute must be one of {', '.join(RECOMPUTE)}, not {self.recompute!r}")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", str(self.device)):
            raise SymmergeError(f"device must be cpu, cuda or cuda:N, not {self.device!r}")
        self._validate_length()
        parse_lr_scale(self.lr_scale)
        if self.lr != "auto" and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise SymmergeError(f"the learning rate must be a finite number above 0 or 'auto', not {self.lr!r}")
        if self.val_batches not in (None, "auto") and not (isinstance(self.val_batches, int) and self.val_batches >= 1):
            raise SymmergeError(f"--val-batches must be at least 1 or 'auto', not {self.val_batches!r}")
        grid(self.grid_points, interior=True)

    def _validate_length(self) -> None:
        if self.steps is None and self.epochs is None:
            raise SymmergeError("give the run's length: --steps N or --epochs E")
        if self.steps is not None and self.steps < 0:
            raise SymmergeError(f"--steps must be >= 0, got {self.steps}")
        if self.epochs is not None and not (math.isfinite(self.epochs) and self.epochs > 0):
            raise SymmergeError(f"--epochs must be a finite number above 0, got {self.epochs}")
        if not (isinstance(self.extend, (int, float)) and math.isfinite(self.extend) and self.extend >= 1):
            raise SymmergeError(f"--extend must be a number of at least 1 (1: never learn past the planned steps), "
                                f"not {self.extend!r}")
        if (self.eval_every is not None and self.eval_every < 1) or self.evaluations < 1:
            raise SymmergeError("--eval-every and the number of evaluations must be at least 1")

    def run_steps(self, n_batches: int) -> int:
        """The run's optimiser steps: `steps`, or `epochs` passes over `n_batches` training batches."""
        return self.steps if self.steps is not None else max(1, math.ceil(self.epochs * n_batches))

    def run_eval_every(self, steps: int) -> int:
        return self.eval_every if self.eval_every is not None else max(1, math.ceil(steps / self.evaluations))

    def settings(self) -> dict:
        """What must be equal to resume a run (everything but the progress bar, checkpoint cadence, device and
        what the backward recomputes)."""
        # a run may resume on another device, or recompute otherwise (the same figures: tests/test_blockwise.py)
        skip = {"progress", "checkpoint_every", "device", "recompute"}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        out["lam_range"] = list(out["lam_range"])
        return out
