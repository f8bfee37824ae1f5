"""Every matcher behind one interface, and dispatch only: its name, the data it needs, the matcher it
starts from, its options class and its run function, returning one result type (`Alignment`).
`symmerge align`, `merge` and `demo` dispatch through `MATCHERS`; the options classes (`match.options`)
hold every default, help text and parser, from which the command line builds its flags.

A matcher is registered with
- `needs_data`: it runs both models on batches (`Data.train`); `validates`: it also needs validation
  batches (`Data.val`, on which learned matching picks its best state); `holds_out(opts)`: whether, with
  these resolved options, it reads as many validation batches as training ones, when given (`Data.val`, on
  which activation matching's `--blocks best` chooses its element; the training batches when there are none);
- `starts_from`: the matcher whose solution it starts from, run first over the same groups: the default of
  its options' `start_from` field, which can name another (learned and dual start from weight matching, or from
  activation matching: its element is their `init`). A start that `casts` runs its forward on the runtime
  `device` (in its --precision); weight matching's products stay on the CPU;
- `options`: its options class (a subclass of the start's where it has one, so that it holds the
  start's options too);
- `run(a, b, families, data, opts, start, **runtime) -> Alignment`, `opts` the resolved options of
  the matcher and its start (`options_for`), `runtime` what does not change the result (`progress`)
  or belongs to one call (`checkpoint`, `resume` of learned matching; `device`, `dtype` of the
  matchers with `forward`: where their forward runs, `devices.Placement`; `device` of the matchers that
  `places`: where their large products run; `device`, `dtype` of those that `cast`: their forward's, None: --precision).

A matcher may also have a many-model form (`many`), run by `align_many` for `symmerge merge`: every model
brought into shared coordinates, its options the matcher's and `options.ManyOptions`.

Adding a matcher: its module under `match/`, its options class in `match/options.py`, a run function
and one `Matcher(...)` entry below; `align --method NAME` and the demo then offer it, with its options
and their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import partial
from typing import Callable

import torch

from ..algebra.elements import identity_element
from ..algebra.families import RESIDUAL_SCALE
from ..errors import SymmergeError
from .options import (
    ActivationOptions,
    DualOptions,
    LearnedOptions,
    ManyOptions,
    Options,
    WeightOptions,
    learn_config,
)
from .weight import weight_match


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
class Matcher:
    name: str
    label: str
    help: str
    needs_data: bool
    run: Callable
    options: type[Options] = Options  # its options class (`match.options`), its start's options among them
    validates: bool = False
    holds_out: Callable[[dict], bool] = lambda opts: False  # a predicate on the resolved options
    streams: bool = False  # reads checkpoints one part at a time (a `model.LazyModel` is enough)
    forward: bool = False  # runs the endpoints' forward where runtime `device` says, in runtime `dtype`
    places: bool = False  # runs its large products where runtime `device` says (weight matching; no `dtype`)
    casts: bool = False  # runs its forward where runtime `device` says, in runtime `dtype` (None: in --precision)
    many: Callable | None = None  # many(sources, weights, families, data, opts, **runtime) -> ManyAlignment
    # families its start runs without though the run learns them (from the identity, or for many models the
    # start's scale gauge); see `start_families`
    start_without: tuple[str, ...] = ()

    @property
    def starts_from(self) -> str | None:
        """The matcher it starts from where its options name none: their `start_from` field's default (None: none)."""
        f = next((f for f in fields(self.options) if f.name == "start_from"), None)
        return None if f is None else f.default

    def start_of(self, opts: dict) -> str | None:
        """The matcher it starts from with resolved options `opts`."""
        return (opts.get("start_from") or self.starts_from) if self.starts_from else None

    def start_families(self, model, families: list[str] | None) -> list[str] | None:
        """The families its start matches for a run over `families` (None: every group): those less
        `start_without`. The learners leave the residual scale out of their start and learn it from there (the
        identity; for many models the start's eps gauge, `many.scale_gauge`): weight matching fits it to B's
        writers, towards zero where the two models' writers are weakly correlated, and a start there gives B's
        writers almost no weight at the midpoint (docs/guides/two-models.md)."""
        every = every_family(model, families)
        return [f for f in every if f not in self.start_without] if set(every) & set(self.start_without) else families


def _from_match(method: str, res, start=None) -> Alignment:
    figures = {"objective": res.history, "iterations": len(res.history) - 1, "seconds": res.seconds,
               "steps": res.steps, "steps_without_improvement": res.rejected, **res.extra}
    return Alignment(method, {"B": res.g}, figures, start)


def _run_weight(a, b, families, data, opts, start, progress: bool = False, device=None) -> Alignment:
    res = weight_match(b.spec, a, b, families, opts["max_iters"], progress=progress,
                       dtype=getattr(torch, opts["precision"]), products=opts["cost_products"], device=device,
                       workers=opts["sweep_workers"])
    return _from_match("weight", res)


def _run_activation(a, b, families, data, opts, start, progress: bool = False, device=None, dtype=None) -> Alignment:
    from .activation_blocks import per_block
    from .activation_many import average_loss
    from .activation_stream import activation_match_streaming

    precision = getattr(torch, opts["precision"])
    res = activation_match_streaming(a, b, data.train, families, dtype=precision, progress=progress, device=device,
                                     forward=dtype)
    identity = identity_element(b.spec)

    def midpoint_loss(g):  # on batches the element was not fitted on, where there are some
        return average_loss([a, b], [identity, g], [0.5, 0.5], data.val or data.train, dtype=dtype, device=device)

    res = per_block(a, b, families, res, opts["blocks"], midpoint_loss, dtype=precision, progress=progress)
    return _from_match("activation", res)


def _activation_holds_out(opts: dict) -> bool:
    from .activation_blocks import reads_held_out

    return reads_held_out(opts["blocks"])


def every_family(model, families: list[str] | None) -> list[str]:
    """The families a learner learns for `families` as every matcher reads them here: None is every group of the
    model (`--groups all`, the residual scale included), where `LearnConfig.groups` None means the spec's
    default families."""
    return model.spec.families() if families is None else families


def _run_learned(method: str, a, b, families, data, opts, start, progress: bool = True, checkpoint=None,
                 resume: bool = False, device: str = "cpu", dtype: str = "float32") -> Alignment:
    from .learned import learn

    cfg = learn_config(method, every_family(a, families), opts, progress, device, dtype)
    res = learn(a, b, data.train, data.val, cfg, init=start.elements["B"], checkpoint=checkpoint, resume=resume)
    res.report["time"]["start_s"] = round(start.figures["seconds"], 3)
    return Alignment(method, res.elements, res.report, start)


@dataclass
class ManyAlignment:
    """What a many-model matcher returns: `elements[i]` acts on model i; `figures` its JSON-able report
    (weight matching: the objective per round, the rounds, the visiting orders, timings)."""

    method: str
    elements: list[dict[str, torch.Tensor]]
    figures: dict


def _many_figures(res, name: str) -> dict:
    return {"objective_name": name, "objective": res.history, "rounds": len(res.history) - 1, "orders": res.orders,
            "converged": res.converged, "round_tol": res.tol, "updates_not_kept": res.rejected, "seconds": res.seconds,
            "pairwise_seconds": res.pairwise_seconds, "round_seconds": res.round_seconds,
            "round_sweeps": res.round_sweeps, **{k: res.extra[k] for k in ("scale_gauge",) if k in res.extra}}


def _run_weight_many(sources, weights, families, data, opts, start=None, progress: bool = False) -> ManyAlignment:
    from .many import weight_match_many

    spec = sources[0].spec
    res = weight_match_many(spec, sources, weights, families, opts["max_rounds"], opts["max_iters"],
                            opts["order_seed"], opts["round_tol"], dtype=getattr(torch, opts["precision"]), progress=progress,
                            products=opts["cost_products"])
    name = ("similarity to the mean = 1 - sum_i w_i ||g_i.M_i - mean||^2 / sum_i w_i ||M_i||^2 over canonical "
            "tensors")
    return ManyAlignment("weight", res.elements, _many_figures(res, name))


def _run_activation_many(sources, weights, families, data, opts, start=None, progress: bool = False, device=None,
                         dtype=None) -> ManyAlignment:
    from .activation_many import activation_match_many

    res = activation_match_many(list(sources), weights, data.train, families, opts["max_rounds"],
                                opts["order_seed"], opts["round_tol"], progress=progress, device=device, dtype=dtype,
                                blocks=opts["blocks"], held_out=data.val or None)
    on = "held-out (validation) batches" if data.val else "--data batches"
    figures = _many_figures(res, f"minus the loss of the weighted average on the {on} (higher is better)")
    figures["average_loss"] = [-v for v in res.history]
    figures["device"], figures["dtype"] = str(device or "cpu"), str(dtype or torch.float64).replace("torch.", "")
    return ManyAlignment("activation", res.elements, figures)


def _run_learned_many(method: str, sources, weights, families, data, opts, start=None,
                      progress: bool = False, device: str = "cpu", dtype: str = "float32", checkpoint=None,
                      resume: bool = False) -> ManyAlignment:
    from .learn_many import learn_many

    cfg = learn_config(method, every_family(sources[0], families), opts, progress, device, dtype)
    # the sources as they are (LazyModels: read part by part into frozen stores, never whole)
    res = learn_many(list(sources), weights, data.train, data.val, cfg, init=start.elements,
                     val_points=opts["val_simplex_points"], checkpoint=checkpoint, resume=resume)
    res.report["time"]["start_s"] = round(start.figures["seconds"], 3)
    figures = {**res.report, "objective": start.figures["objective"], "rounds": start.figures["rounds"],
               "converged": start.figures["converged"], "round_tol": start.figures["round_tol"],
               "seconds": start.figures["seconds"] + res.report["time_s"], "start": {"method": start.method, **start.figures}}
    return ManyAlignment(method, res.elements, figures)


MATCHERS = {m.name: m for m in (
    Matcher("weight", "weight matching", "data-free", False, _run_weight, WeightOptions,
            streams=True, places=True, many=_run_weight_many),
    Matcher("activation", "activation matching", "activations on --data", True, _run_activation,
            ActivationOptions, streams=True, casts=True, holds_out=_activation_holds_out, many=_run_activation_many),
    Matcher("learned", "learned matching", "B learned", True,
            partial(_run_learned, "learned"), LearnedOptions, validates=True, forward=True,
            many=partial(_run_learned_many, "learned"), start_without=(RESIDUAL_SCALE,)),
    Matcher("dual", "dual learned matching", "A and B learned", True,
            partial(_run_learned, "dual"), DualOptions, validates=True, forward=True,
            many=partial(_run_learned_many, "dual"), start_without=(RESIDUAL_SCALE,)),
)}


#: what every comparison (demo, barrier tables) measures the matchers against: averaging without alignment
PLAIN = "plain"
#: the rows of a comparison, plain averaging first
COMPARED = (PLAIN, *MATCHERS)


def get(name: str) -> Matcher:
    if name not in MATCHERS:
        raise SymmergeError(f"unknown method {name!r}; choose from {', '.join(MATCHERS)}")
    return MATCHERS[name]


def options(name: str, given=None) -> Options:
    """Matcher `name`'s options (its class, `match.options`) from `given`: options of any class (the fields
    they share), a dict (None values: defaults) or None (every default); checked."""
    return get(name).options.of(given)


def options_for(name: str, given=None, recipe: str | None = None) -> dict:
    """Every option matcher `name` runs with (`Options.resolved`: the recipe's values where none is given)."""
    return options(name, given).resolved(*([recipe] if recipe else []))


def align(name: str, a, b, families: list[str] | None, data: Data | None = None, opts: dict | None = None,
          start: Alignment | None = None, **runtime) -> Alignment:
    """Run matcher `name` (after the matcher it starts from, unless `start` is given) on B against A."""
    m = get(name)
    opts = options_for(name, opts)
    if m.needs_data and (data is None or not data.train or (m.validates and not data.val)):
        raise SymmergeError(f"{m.label} needs data (--data): training{' and validation' if m.validates else ''} batches")
    first = m.start_of(opts)
    if first and start is None:
        on = {"device": runtime["device"]} if get(first).casts and "device" in runtime else {}
        start = align(first, a, b, m.start_families(b, families), data, opts, progress=runtime.get("progress", False),
                      **on)
    return m.run(a, b, families, data, opts, start, **runtime)


def many_options_for(name: str, given=None, rounds=None) -> dict:
    """`options_for(name)` (the default recipe where none is named), and the rounds' options
    (`ManyOptions`, from `rounds`, else from `given`'s keys that name them)."""
    out = options_for(name, given)
    rounds = ManyOptions.of(given if rounds is None and not isinstance(given, Options) else rounds)
    return {**out, **rounds.resolved()}


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
    first = m.start_of(opts)
    if first and start is None:
        start = align_many(first, sources, weights, m.start_families(sources[0], families), data, opts,
                           progress=runtime.get("progress", False))
    return m.many(sources, weights, families, data, opts, start=start, **runtime)
