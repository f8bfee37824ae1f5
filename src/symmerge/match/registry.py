"""Every matcher behind one interface: what it needs, its options with their one set of defaults, and
a run function returning one result type (`Alignment`). `symmerge align` and `symmerge demo` dispatch
through `MATCHERS`; the CLI reads its defaults and choices from here.

A matcher is registered with
- `needs_data`: it runs both models on batches (`Data.train`); `validates`: it also needs validation
  batches (`Data.val`, on which learned matching picks its best state);
- `starts_from`: the matcher whose solution it starts from, run first over the same groups
  (learned and dual start from weight matching: its element is their `init`);
- `options`: the names of the `OPTIONS` it reads (the starting matcher's options are read too);
- `run(a, b, families, data, opts, start, **runtime) -> Alignment`, `opts` holding every option of
  the matcher and its start (`options_for`), `runtime` what does not change the result (`progress`)
  or belongs to one call (`checkpoint`, `resume` of learned matching; `device`, `dtype` of the
  matchers with `forward`: where their forward runs, `devices.Placement`; `device` of the matchers that
  `places`: where their large products run).

A matcher may also have a many-model form (`many`), run by `align_many` for `symmerge merge`: every model
brought into shared coordinates, its options the matcher's and `MANY_OPTIONS`.

Adding a matcher: its module under `match/`, a run function and one `Matcher(...)` entry below;
`align --method NAME` and the demo then offer it, with its options and their defaults.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch

from .. import SymmergeError
from ..model import Model
from ..values import argument_type, at_least, seed
from .blockwise import RECOMPUTE
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
from .weight import weight_match
from .weight_products import CHOICES


@dataclass
class Alignment:
    """What every matcher returns.

    `elements[side]` is the element whose action on that input gives its output: "B" always, "A" too
    when both endpoints move (dual matching). `figures`: the method's JSON-able report (weight and
    activation matching: the objective per iteration, steps and timings; learned and dual: the
    validation barriers, the history and the settings). `start`: the alignment it started from."""

    method: str
    elements: dict[str, dict[str, torch.Tensor]]
    figures: dict
    start: Alignment | None = None


@dataclass
class Data:
    """Batches for the data-driven matchers: `train` to fit on, `val` to choose the best state on."""

    train: list[dict]
    val: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class FromRecipe:
    """An option's default that the recipe (`--recipe`, `learn_config.RECIPES`) gives, under `key`."""

    key: str


@dataclass(frozen=True)
class Option:
    """One option: `default` is the value, or {method: value} where it differs by method, a value
    being `FromRecipe` where the recipe gives it; `type` parses the command line's text (the default
    is given already parsed)."""

    name: str
    default: object
    help: str
    type: Callable | None = None
    choices: tuple | None = None

    def default_for(self, method: str, recipe: str = "full"):
        value = self.default.get(method) if isinstance(self.default, dict) else self.default
        return recipe_value(recipe, value.key, method) if isinstance(value, FromRecipe) else value

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _signature_default(fn, name: str):
    return inspect.signature(fn).parameters[name].default


def _learn_default(name: str):
    return LearnConfig.__dataclass_fields__[name].default


def _recipe(key: str, activation=None) -> FromRecipe | dict:
    """learned and dual take the recipe's value; activation matching, where given, its own."""
    return FromRecipe(key) if activation is None else {"activation": activation, "learned": FromRecipe(key),
                                                       "dual": FromRecipe(key)}


OPTIONS = {o.name: o for o in (
    Option("max_iters", _signature_default(weight_match, "max_iters"), "most sweeps over the groups", at_least(1)),
    Option("precision", str(_signature_default(weight_match, "dtype")).replace("torch.", ""),
           "precision of the algebra and of activation statistics; float32 for large models (less memory, faster)",
           choices=("float64", "float32")),
    Option("cost_products", CHOICES[0], "products behind the assignment costs: exact, or bfloat16 operands with float32 "
           "accumulation (faster on CPUs with AMX; every candidate still judged exactly)", choices=CHOICES),
    Option("sweep_workers", _signature_default(weight_match, "workers"), "blocks solved at once, one thread each (the same "
           "result at any count; memory holds that many blocks); 0: the CPU threads, at most 4", at_least(0)),
    Option("batch_size", _recipe("batch_size", 8), "sequences (images) per batch (full recipe: as many as make "
           f"{BATCH_TOKENS} tokens)", at_least(1)),
    Option("max_batches", _recipe("max_batches", 8), "batches used (learned/dual: training batches; none: all "
           "of the split)", at_least(1)),
    Option("recipe", "full", "the settings every learned/dual option starts from: full (epochs of every training batch, "
           "--lr auto) or quick (a smoke test: 200 steps on 8 batches of 8)", choices=tuple(RECIPES)),
    Option("param", _learn_default("param"), "cayley|cayley-signs|expm|polar|direct, or family=method,... (auto: "
           "cayley for orthogonal, polar for invertible groups)"),
    Option("steps", FromRecipe("steps"), "optimiser steps (instead of --epochs)", at_least(0)),
    Option("epochs", FromRecipe("epochs"), "passes over the training batches (instead of --steps)",
           argument_type(parse_epochs)),
    Option("lr", FromRecipe("lr"), "Adam rate, cosine decay; auto: the best of a few short runs on the "
           "validation barrier (a tenth of the cost at most)", argument_type(parse_lr)),
    Option("lam_range", FromRecipe("lam_range"), "λ drawn uniformly from LOW,HIGH per batch",
           argument_type(parse_lam_range)),
    Option("lam_sampling", _learn_default("lam_sampling"), "uniform, or peak: half the λ draws near the grid points "
           "where the path stands highest above the straight line", choices=LAM_SAMPLING),
    Option("seed", _learn_default("seed"), "seed of the batch order and λ draws", seed),
    Option("eval_every", FromRecipe("eval_every"), f"steps between validation barriers (none: {EVALUATIONS} in the run)",
           at_least(1)),
    Option("extend", FromRecipe("extend"), "while the last evaluation is the best, learn on by quarters of the run "
           "up to this multiple of its steps (1: never; --steps/--epochs alone: 1)",
           argument_type(parse_extend)),
    Option("patience", _learn_default("patience"), "stop after this many evaluations without improvement "
           "(0: never)", at_least(0)),
    Option("val_batches", FromRecipe("val_batches"), "validation batches for choosing the best state; auto: enough "
           f"for a standard error of at most {VAL_SE:g} nats (all of the split at most)",
           argument_type(parse_val_batches)),
    Option("recompute", _learn_default("recompute"), "what the backward recomputes per block: block (least memory: "
           "about a block beyond the endpoints), weights (activations kept: a forward less per step) or none; the "
           "same result", choices=RECOMPUTE),
    Option("val_points", FromRecipe("grid_points"), "λ grid of the validation barrier, endpoints included", at_least(3)),
)}


@dataclass(frozen=True)
class Matcher:
    name: str
    label: str
    help: str
    needs_data: bool
    run: Callable
    options: tuple[str, ...] = ()
    validates: bool = False
    starts_from: str | None = None
    streams: bool = False  # reads checkpoints one part at a time (a `model.LazyModel` is enough)
    forward: bool = False  # runs the endpoints' forward where runtime `device` says, in runtime `dtype`
    places: bool = False  # runs its large products where runtime `device` says (weight matching; no `dtype`)
    check: Callable | None = None  # check(families, opts): refuse bad options before any work
    many: Callable | None = None  # many(sources, weights, families, data, opts, **runtime) -> ManyAlignment


def _parts(model):
    """What `weight_match` reads: an in-memory model's parameters, or a `LazyModel` itself (part by part)."""
    return model.params if isinstance(model, Model) else model


def _from_match(method: str, res, start=None) -> Alignment:
    figures = {"objective": res.history, "iterations": len(res.history) - 1, "seconds": res.seconds,
               "steps": res.steps, "steps_without_improvement": res.rejected, **res.extra}
    return Alignment(method, {"B": res.g}, figures, start)


def _run_weight(a, b, families, data, opts, start, progress: bool = False, device=None) -> Alignment:
    res = weight_match(b.spec, _parts(a), _parts(b), families, opts["max_iters"], progress=progress,
                       dtype=getattr(torch, opts["precision"]), products=opts["cost_products"], device=device,
                       workers=opts["sweep_workers"])
    return _from_match("weight", res)


def _run_activation(a, b, families, data, opts, start, progress: bool = False) -> Alignment:
    from .activation_stream import activation_match_streaming

    res = activation_match_streaming(a, b, data.train, families, dtype=getattr(torch, opts["precision"]),
                                     progress=progress)
    return _from_match("activation", res)


def learn_config(method: str, families, opts, progress: bool = True, device: str = "cpu",
                 dtype: str = "float32") -> LearnConfig:
    """The `LearnConfig` of learned / dual matching for `opts` (`options_for`), checked."""
    cfg = LearnConfig(method=method, groups=families, param=opts["param"], steps=opts["steps"],
                      epochs=opts["epochs"], lr=opts["lr"], lam_range=opts["lam_range"],
                      lam_sampling=opts["lam_sampling"], seed=opts["seed"], eval_every=opts["eval_every"],
                      patience=opts["patience"], extend=opts["extend"], grid_points=opts["val_points"], val_batches=opts["val_batches"],
                      progress=progress, device=device, dtype=dtype, recompute=opts.get("recompute") or "block")
    cfg.validate()
    return cfg


def _check_learned(method: str, families, opts) -> None:
    if opts.get("steps") is not None and opts.get("epochs") is not None:
        raise SymmergeError("--steps and --epochs both set the run's length; give one of them")
    learn_config(method, families, opts)


def _run_learned(method: str, a, b, families, data, opts, start, progress: bool = True, checkpoint=None,
                 resume: bool = False, device: str = "cpu", dtype: str = "float32") -> Alignment:
    from .learned import learn

    cfg = learn_config(method, families, opts, progress, device, dtype)
    res = learn(a, b, data.train, data.val, cfg, init=start.elements["B"], checkpoint=checkpoint, resume=resume)
    return Alignment(method, res.elements, res.report, start)


_DATA_OPTIONS = ("batch_size", "max_batches")
_LEARN_OPTIONS = (*_DATA_OPTIONS, "recipe", "param", "steps", "epochs", "lr", "lam_range", "lam_sampling", "seed",
                  "eval_every", "extend", "patience", "val_batches", "val_points", "recompute")


@dataclass
class ManyAlignment:
    """What a many-model matcher returns: `elements[i]` acts on model i; `figures` its JSON-able report
    (weight matching: the objective per round, the rounds, the visiting orders, timings)."""

    method: str
    elements: list[dict[str, torch.Tensor]]
    figures: dict


def _many_signature_default(name: str):
    from .many import weight_match_many

    return _signature_default(weight_match_many, name)


MANY_OPTIONS = {o.name: o for o in (
    Option("max_rounds", 10, "most rounds (a round matches every model once to the mean of the others)", at_least(1)),
    Option("round_tol", _many_signature_default("tol"), "weight/activation: stop after a round that gains at most "
           "this much, relative", at_least(0.0, float)),
    Option("order_seed", 0, "seed of the order the models are visited in, each round", seed),
    Option("val_simplex_points", 4, "learned/dual: Dirichlet points of the validation objective, "
           "besides the merge weights", at_least(1)),
)}


def _in_memory(source) -> Model:
    """A `LazyModel` (or an expanded one) read into memory; a `Model` as it is."""
    return source if isinstance(source, Model) else source.as_model()


def _many_figures(res, name: str) -> dict:
    return {"objective_name": name, "objective": res.history, "rounds": len(res.history) - 1, "orders": res.orders,
            "converged": res.converged, "round_tol": res.tol, "updates_not_kept": res.rejected, "seconds": res.seconds,
            "pairwise_seconds": res.pairwise_seconds, "round_seconds": res.round_seconds,
            "round_sweeps": res.round_sweeps, **{k: res.extra[k] for k in ("scale_gauge",) if k in res.extra}}


def _run_weight_many(sources, weights, families, data, opts, start=None, progress: bool = False) -> ManyAlignment:
    from .many import weight_match_many

    spec = sources[0].spec
    sources = [s.params if isinstance(s, Model) else s for s in sources]  # in memory, or read part by part
    res = weight_match_many(spec, sources, weights, families, opts["max_rounds"], opts["max_iters"],
                            opts["order_seed"], opts["round_tol"], dtype=getattr(torch, opts["precision"]), progress=progress,
                            products=opts["cost_products"])
    name = ("similarity to the mean = 1 - sum_i w_i ||g_i.M_i - mean||^2 / sum_i w_i ||M_i||^2 over canonical "
            "tensors")
    return ManyAlignment("weight", res.elements, _many_figures(res, name))


def _run_activation_many(sources, weights, families, data, opts, start=None, progress: bool = False) -> ManyAlignment:
    from .many import activation_match_many

    res = activation_match_many([_in_memory(s) for s in sources], weights, data.train, families, opts["max_rounds"],
                                opts["order_seed"], opts["round_tol"], progress=progress)
    figures = _many_figures(res, "minus the loss of the weighted average on the --data batches (higher is better)")
    figures["average_loss"] = [-v for v in res.history]
    return ManyAlignment("activation", res.elements, figures)


def _run_learned_many(method: str, sources, weights, families, data, opts, start=None,
                      progress: bool = False, device: str = "cpu", dtype: str = "float32", checkpoint=None,
                      resume: bool = False) -> ManyAlignment:
    from .learn_many import learn_many

    cfg = learn_config(method, families, opts, progress, device, dtype)
    # the sources as they are (LazyModels: read part by part into frozen stores, never whole)
    res = learn_many(list(sources), weights, data.train, data.val, cfg, init=start.elements,
                     val_points=opts["val_simplex_points"], checkpoint=checkpoint, resume=resume)
    figures = {**res.report, "objective": start.figures["objective"], "rounds": start.figures["rounds"],
               "converged": start.figures["converged"], "round_tol": start.figures["round_tol"],
               "seconds": start.figures["seconds"] + res.report["time_s"], "weight_matching": start.figures}
    return ManyAlignment(method, res.elements, figures)


MATCHERS = {m.name: m for m in (
    Matcher("weight", "weight matching", "data-free, from the weights", False, _run_weight,
            ("max_iters", "precision", "cost_products", "sweep_workers"), streams=True, places=True, many=_run_weight_many),
    Matcher("activation", "activation matching", "from activations on --data", True, _run_activation,
            ("precision", *_DATA_OPTIONS), streams=True, many=_run_activation_many),
    Matcher("learned", "learned matching", "B's element learned on the path's loss", True,
            partial(_run_learned, "learned"), _LEARN_OPTIONS,
            validates=True, starts_from="weight", check=partial(_check_learned, "learned"), forward=True,
            many=partial(_run_learned_many, "learned")),
    Matcher("dual", "dual learned matching", "both endpoints' continuous elements learned", True,
            partial(_run_learned, "dual"), _LEARN_OPTIONS,
            validates=True, starts_from="weight", check=partial(_check_learned, "dual"), forward=True,
            many=partial(_run_learned_many, "dual")),
)}


#: what every comparison (demo, barrier tables) measures the matchers against: averaging without alignment
PLAIN = "plain"
#: the rows of a comparison, plain averaging first
COMPARED = (PLAIN, *MATCHERS)


def get(name: str) -> Matcher:
    if name not in MATCHERS:
        raise SymmergeError(f"unknown method {name!r}; choose from {', '.join(MATCHERS)}")
    return MATCHERS[name]


def option_names(name: str) -> list[str]:
    """The options a matcher reads: its own and its start's."""
    m = get(name)
    return [*(option_names(m.starts_from) if m.starts_from else []), *m.options]


def options_for(name: str, given: dict | None = None) -> dict:
    """Every option of the matcher (and of its start), from `given` where it is not None, else the
    default (the recipe's, for `FromRecipe` defaults). A run's length is one of `LENGTH`: the one given
    explicitly drops the recipe's other."""
    given = given or {}
    names = option_names(name)
    recipe = given.get("recipe") or OPTIONS["recipe"].default
    out = {}
    for o in names:
        out[o] = given[o] if given.get(o) is not None else OPTIONS[o].default_for(name, recipe)
    explicit = [k for k in LENGTH if k in names and given.get(k) is not None]
    for k in LENGTH:
        if explicit and k in names and k not in explicit:
            out[k] = None
    if explicit and "extend" in names and given.get("extend") is None:
        out["extend"] = 1.0  # a length given is the length taken
    return out


def check(name: str, families: list[str] | None, opts: dict) -> None:
    """Refuse bad options of matcher `name` (and of its start) before any work."""
    m = get(name)
    if m.starts_from:
        check(m.starts_from, families, opts)
    if m.check is not None:
        m.check(families, opts)


def users(option: str) -> list[str]:
    """The matchers that read `option`, themselves or through the matcher they start from."""
    return [name for name in MATCHERS if option in option_names(name)]


def align(name: str, a, b, families: list[str] | None, data: Data | None = None, opts: dict | None = None,
          start: Alignment | None = None, **runtime) -> Alignment:
    """Run matcher `name` (after the matcher it starts from, unless `start` is given) on B against A."""
    m = get(name)
    opts = options_for(name, opts)
    if m.needs_data and (data is None or not data.train or (m.validates and not data.val)):
        raise SymmergeError(f"{m.label} needs data (--data): training{' and validation' if m.validates else ''} batches")
    if m.starts_from and start is None:
        start = align(m.starts_from, a, b, families, data, opts, progress=runtime.get("progress", False))
    return m.run(a, b, families, data, opts, start, **runtime)


#: the defaults of many-model learning (`learn_many`): the quick recipe's; the full recipe's epochs and
#: --lr auto are built for pairwise matching only
MANY_RECIPE = "quick"


def many_options_for(name: str, given: dict | None = None) -> dict:
    """`options_for(name)` and the many-model options, from `given` where it is not None."""
    given = dict(given or {})
    given["recipe"] = given.get("recipe") or MANY_RECIPE
    out = options_for(name, given)
    for o in MANY_OPTIONS.values():
        out[o.name] = given[o.name] if given.get(o.name) is not None else o.default
    return out


def many_methods() -> list[str]:
    return [name for name, m in MATCHERS.items() if m.many is not None]


def align_many(name: str, sources: list, weights: list[float], families: list[str] | None,
               data: Data | None = None, opts: dict | None = None, start: ManyAlignment | None = None,
               **runtime) -> ManyAlignment:
    """Run the many-model form of matcher `name` (after the one it starts from, unless `start` is given):
    every model of `sources` (`LazyModel`s or `Model`s of one shape) into shared coordinates."""
    m = get(name)
    if m.many is None:
        raise SymmergeError(f"{m.label} has no many-model form yet; merge --method takes {', '.join(many_methods())}")
    opts = many_options_for(name, opts)
    if m.needs_data and (data is None or not data.train or (m.validates and not data.val)):
        raise SymmergeError(f"merge --method {name} needs data (--data): training"
                            f"{' and validation' if m.validates else ''} batches")
    if m.starts_from and start is None:
        start = align_many(m.starts_from, sources, weights, families, data, opts, progress=runtime.get("progress", False))
    return m.many(sources, weights, families, data, opts, start=start, **runtime)
