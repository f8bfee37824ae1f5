"""The typed options of every matcher: one frozen dataclass per matcher, checked once, when it is made.

Each field holds its one default and, in its metadata (`option`), the help text and the parser of its
command-line text (`parse`, an argparse type: the CLI builds its flags from these fields) and its
`choices`. A field whose default is None with a `recipe` key takes the recipe's value (`learn_config.RECIPES`:
`full` for pairs and many models alike, unless `recipe` names one); None given for any other field
means its default. `resolved()` is what the matcher runs with: every value filled in, as a dict.

Where a check fails: `__post_init__` raises a one-line `SymmergeError` naming the class, the field and the
reason, for a value its parser refuses (a float where a whole number belongs, 0 sweeps), for a value
outside its `choices`, and for learned / dual settings that cannot run together (`LearnConfig.validate`:
both --steps and --epochs, a λ range outside [0, 1], fewer than 3 validation points).
"""

from __future__ import annotations

import argparse
import inspect
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import ClassVar

from ..errors import SymmergeError
from ..runtime.values import argument_type, at_least, seed
from .activation_blocks import BLOCKS
from .blockwise import AUTO_KEEP_BYTES, RECOMPUTE
from .learn_config import (
    BATCH_TOKENS,
    EVALUATIONS,
    LAM_SAMPLING,
    LENGTH,
    RECIPES,
    VAL_SE,
    LearnConfig,
    parse_epochs,
    parse_extend,
    parse_lam_range,
    parse_lr,
    parse_val_batches,
    recipe_value,
)
from .many import ROUND_TOL
from .weight import weight_match
from .weight_products import CHOICES

#: the matchers learned and dual matching can start from (`start_from`, flag `--start-from`): the element they find
#: is the learner's start
STARTS = ("weight", "activation")

#: the recipe of learned / dual matching where none is named, for a pair (`align`) and for many models (`merge`)
DEFAULT_RECIPE = "full"


def option(default, help: str, parse=None, choices: tuple | None = None, recipe: str | None = None):
    """A field of an options class: its default (None with `recipe`: the recipe's value under that key),
    its help text, the parser of its command-line text and its choices."""
    return field(default=default, metadata={"help": help, "parse": parse, "choices": choices, "recipe": recipe})


def _signature_default(fn, name: str):
    return inspect.signature(fn).parameters[name].default


def _text(value) -> str:
    """A value as it would be typed on the command line (floats exactly, tuples comma-separated)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return ",".join(_text(v) for v in value)
    return str(value)


def _same(x, y) -> bool:
    """x == y, elementwise for sequences, NaN equal to NaN (the range checks that follow refuse it)."""
    if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
        return len(x) == len(y) and all(map(_same, x, y))
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


@dataclass(frozen=True)
class Options:
    """The checks every options class shares (see the module docstring)."""

    #: the matcher the class belongs to (a recipe's per-method values are looked up under it)
    METHOD: ClassVar[str] = ""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is not None and f.default is not MISSING:
                object.__setattr__(self, f.name, f.default)  # None given: the default
            elif value is not None:
                self._check(f, value)

    def _check(self, f, value) -> None:
        where = f"{type(self).__name__}({f.name}={value!r})"
        choices, parse = f.metadata.get("choices"), f.metadata.get("parse")
        if isinstance(value, bool):
            raise SymmergeError(f"{where}: not a {f.type}")
        if choices is not None and value not in choices:
            raise SymmergeError(f"{where}: choose from {', '.join(map(str, choices))}")
        if parse is not None:
            try:
                parsed = parse(_text(value))
            except (argparse.ArgumentTypeError, SymmergeError) as e:
                raise SymmergeError(f"{where}: {e}") from None
            if isinstance(value, list) and _same(parsed, value):
                object.__setattr__(self, f.name, parsed)  # a list where a tuple belongs
            elif isinstance(parsed, tuple) != isinstance(value, tuple) or not _same(parsed, value):
                raise SymmergeError(f"{where}: not a {f.type}")

    @classmethod
    def of(cls, given=None):
        """Options of this class from a dict (its keys that name fields; None values: defaults) or from
        options of another class (the fields both have, e.g. learned's weight-matching options)."""
        if isinstance(given, cls):
            return given
        values = given.__dict__ if isinstance(given, Options) else dict(given or {})
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    def default_for(self, name: str, recipe: str):
        """Field `name`'s value when it is not given, under `recipe`."""
        f = next(f for f in fields(self) if f.name == name)
        key = f.metadata.get("recipe")
        return recipe_value(recipe, key, self.METHOD) if key is not None and f.default is None else f.default

    def resolved(self, recipe: str = DEFAULT_RECIPE) -> dict:
        """Every option's value (the recipe's where none is given), by field name. A run's length is one of
        `LENGTH`: the one given explicitly drops the recipe's other, and fixes the length (`extend` 1 unless
        given too)."""
        recipe = getattr(self, "recipe", None) or recipe
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value if value is not None else self.default_for(f.name, recipe)
        if "recipe" in out:
            out["recipe"] = recipe
        explicit = [k for k in LENGTH if k in out and getattr(self, k) is not None]
        for k in LENGTH:
            if explicit and k in out and k not in explicit:
                out[k] = None
        if explicit and "extend" in out and self.extend is None:
            out["extend"] = 1.0  # a length given is the length taken
        return out


_MAX_ITERS = dict(default=_signature_default(weight_match, "max_iters"), help="most sweeps over the groups",
                  parse=at_least(1))
_PRECISION = dict(default=str(_signature_default(weight_match, "dtype")).replace("torch.", ""),
                  help="precision of the algebra and activation statistics (float32: less memory, faster)",
                  choices=("float64", "float32"))


@dataclass(frozen=True)
class WeightOptions(Options):
    """Weight matching (`match.weight.weight_match`): data-free, from the weights."""

    METHOD: ClassVar[str] = "weight"
    max_iters: int = option(**_MAX_ITERS)
    precision: str = option(**_PRECISION)
    cost_products: str = option(CHOICES[0], "assignment-cost products: exact, or bfloat16 operands (faster with AMX; "
                                "candidates judged exactly)", choices=CHOICES)
    sweep_workers: int = option(_signature_default(weight_match, "workers"), "blocks solved at once, one thread each "
                                "(the same result); 0: the CPU threads, at most 4", at_least(0))


_BATCH_SIZE = ("sequences (images) per batch (full recipe: as many as make "
               f"{BATCH_TOKENS} tokens)", at_least(1))
_MAX_BATCHES = ("batches used (learned/dual: training batches; none: all of the split)", at_least(1))


@dataclass(frozen=True)
class ActivationOptions(Options):
    """Activation matching (`match.activation_stream`): from activations on batches of data."""

    METHOD: ClassVar[str] = "activation"
    precision: str = option(**_PRECISION)
    batch_size: int = option(8, *_BATCH_SIZE)
    max_batches: int = option(8, *_MAX_BATCHES)
    blocks: str = option(BLOCKS[0], "per-block groups: best weight matching by the merge's loss, weight, activation",
                         choices=BLOCKS)


@dataclass(frozen=True)
class LearnedOptions(WeightOptions):
    """Learned matching (`match.learned`): B's element learned on the loss along the path, from the solution
    of weight matching (whose options come first) or, with `start_from`, of activation matching (with its default
    options besides the precision; its batches are the learner's training batches)."""

    METHOD: ClassVar[str] = "learned"
    start_from: str = option(STARTS[0], "the element learning starts from: weight matching's or activation "
                             "matching's (on --data)", choices=STARTS)
    batch_size: int | None = option(None, *_BATCH_SIZE, recipe="batch_size")
    max_batches: int | None = option(None, *_MAX_BATCHES, recipe="max_batches")
    recipe: str | None = option(None, "the settings every learned/dual option starts from: full (epochs, --lr auto) "
                                "or quick (a smoke test)", choices=tuple(RECIPES))
    param: str = option(LearnConfig.param, "cayley|cayley-signs|expm|polar|direct, or family=method,... (auto: by "
                        "group kind)")
    steps: int | None = option(None, "optimiser steps (instead of --epochs)", at_least(0), recipe="steps")
    epochs: float | None = option(None, "passes over the training batches (instead of --steps)",
                                  argument_type(parse_epochs), recipe="epochs")
    lr: float | str | None = option(None, "Adam rate, cosine decay; auto: the best of short runs on the validation "
                                    "barrier", argument_type(parse_lr), recipe="lr")
    lr_scale: str | None = option(None, "FAMILY=FACTOR,...: those families' rate is FACTOR x --lr (others: 1), "
                                  "e.g. ov_map=3")
    lam_range: tuple[float, float] | None = option(None, "λ drawn from LOW,HIGH per batch (--lam-sampling)",
                                                   argument_type(parse_lam_range), recipe="lam_range")
    lam_sampling: str | None = option(None, "peak: half the λ draws where the path stands highest, or uniform "
                                      "(default: peak for a pair; many models draw the simplex uniformly)",
                                      choices=LAM_SAMPLING)
    seed: int = option(LearnConfig.seed, "seed of the batch order and λ draws", seed)
    eval_every: int | None = option(None, f"steps between validation barriers (none: {EVALUATIONS} in the run)",
                                    at_least(1), recipe="eval_every")
    extend: float | None = option(None, "while the last evaluation is the best, learn on up to this multiple of the "
                                 "steps (1: never)", argument_type(parse_extend), recipe="extend")
    patience: int = option(LearnConfig.patience, "stop after this many evaluations without improvement (0: never)",
                           at_least(0))
    val_batches: int | str | None = option(None, "validation batches that choose the best state; auto: a standard "
                                           f"error of at most {VAL_SE:g} nats", argument_type(parse_val_batches),
                                           recipe="val_batches")
    val_data: str | None = option(None, "a data set that chooses the best state, all of it (default: the validation "
                                  "split of --data)")
    recompute: str = option(LearnConfig.recompute, "what the backward recomputes: block, weights, none, or auto "
                            f"(none if that keeps <= {AUTO_KEEP_BYTES >> 20} MiB more)", choices=RECOMPUTE)
    val_points: int | None = option(None, "λ grid of the validation barrier, endpoints included", at_least(3),
                                    recipe="grid_points")

    def __post_init__(self):
        super().__post_init__()
        if self.steps is not None and self.epochs is not None:
            raise SymmergeError("--steps and --epochs both set the run's length; give one of them")
        learn_config(self.METHOD, None, self.resolved())  # LearnConfig.validate's checks


@dataclass(frozen=True)
class DualOptions(LearnedOptions):
    """Dual learned matching: both endpoints' continuous elements learned (its fixed rates are half of
    learned's: `learn_config.DEFAULT_LR`)."""

    METHOD: ClassVar[str] = "dual"


@dataclass(frozen=True)
class ManyOptions(Options):
    """The rounds of many-model matching (`symmerge merge`), beside the matcher's own options."""

    max_rounds: int = option(10, "most rounds (a round matches every model once to the mean of the others)", at_least(1))
    round_tol: float = option(ROUND_TOL, "weight/activation: stop after a round that gains at most this much, relative",
                              at_least(0.0, float))
    order_seed: int = option(0, "seed of the order the models are visited in, each round", seed)
    val_simplex_points: int = option(4, "learned/dual: Dirichlet points of the validation objective, besides the merge "
                                     "weights", at_least(1))


def learn_config(method: str, families, opts: dict, progress: bool = True, device: str = "cpu",
                 dtype: str = "float32") -> LearnConfig:
    """The `LearnConfig` of learned / dual matching for resolved options `opts`, checked."""
    cfg = LearnConfig(method=method, groups=families, param=opts["param"], steps=opts["steps"],
                      epochs=opts["epochs"], lr=opts["lr"], lr_scale=opts["lr_scale"], lam_range=opts["lam_range"],
                      lam_sampling=opts["lam_sampling"], seed=opts["seed"], eval_every=opts["eval_every"],
                      patience=opts["patience"], extend=opts["extend"], grid_points=opts["val_points"],
                      val_batches=opts["val_batches"],
                      progress=progress, device=device, dtype=dtype, recompute=opts.get("recompute") or LearnConfig.recompute)
    cfg.validate()
    return cfg
