"""The library a researcher imports: one function per operation, each the library call its command makes.

    from symmerge import api
    result = api.align("runs/a", "runs/b", "runs/b-aligned", options=api.WeightOptions(max_iters=20))
    print(result["objective"][-1]); result.save("align.json")

Every function takes checkpoint folders or Hub ids `ORG/NAME[@REVISION]` (`hub.resolve`; ids resolved are
recorded in the reports, `hub.resolved`, until `hub.forget()`); `load`, `align` without `out`,
`barrier` and `evaluate` take loaded models (`model.Model`) too. Options are typed per matcher
(`WeightOptions`, `ActivationOptions`, `LearnedOptions`, `DualOptions`; `ManyOptions` for merge's rounds),
checked when made. Every function checks its inputs before any work and returns a `Result`: the report
(`result.report`, the command's `--json` payload; `result.save(path)`), the folder written and what was found.
`report=PATH` writes the JSON report too, the path checked first. Data: a data set name as `--data`
takes (`data.load_batches`), or, for the matchers, a `registry.Data` of batches.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .match.options import ActivationOptions, DualOptions, LearnedOptions, ManyOptions, Options, WeightOptions
from .store.results import Result

__all__ = ["load", "align", "merge", "barrier", "interpolate", "expand", "transform", "evaluate", "Result",
           "Options", "WeightOptions", "ActivationOptions", "LearnedOptions", "DualOptions", "ManyOptions"]


def _path(model):
    """A checkpoint folder for a folder or a Hub id (a loaded model as it is)."""
    from .store.hub import resolve

    return resolve(model) if isinstance(model, (str, Path)) else model


def load(model, lazy: bool = False, dtype=None):
    """A checkpoint in canonical form: in memory (`model.Model`), or read one part at a time (`LazyModel`,
    in `dtype`, default float64) with `lazy`."""
    import torch

    from .store.model import LazyModel, load_model

    model = _path(model)
    if not isinstance(model, (str, Path)):
        return model
    return LazyModel(model, dtype or torch.float64) if lazy else load_model(model)


def align(a, b, out=None, method: str = "weight", options: Options | dict | None = None, *, groups="default",
          data=None, split: str = "train", seq_len: int | None = None, force: bool = False, out_dtype=None,
          device: str | None = None, dtype: str | None = None, resume: bool = False, shard_endpoints: int | None = None,
          report=None, progress: bool = False) -> Result | None:
    """Find the group element that brings B closest to A (`method`: weight, activation, learned, dual).

    With `out`: OUT is B re-parameterised (dual: OUT/A and OUT/B), written as `symmerge align` writes it
    (`pair.align_checkpoints`; None on the torchrun processes but the first). Without: the models (folders,
    ids or `Model`s) are aligned in memory and `result.models` holds each side re-parameterised.
    `groups`: families, None for every group, "default" for the spec's default; `out_dtype`: a torch dtype."""
    from .workflows import pair

    a, b = _path(a), _path(b)
    if out is not None:
        rep = pair.align_checkpoints(a, b, out, method, options, groups, data, split, seq_len, force, out_dtype, device,
                                     dtype, resume, shard_endpoints, report, progress)
        return None if rep is None else Result("align", rep, Path(out))
    return _align_in_memory(a, b, method, options, groups, data, split, seq_len, device, dtype, report, progress)


def _align_in_memory(a, b, method, options, groups, data, split, seq_len, device, dtype, report, progress) -> Result:
    from .match import registry
    from .runtime import devices
    from .runtime.checks import check_report_file
    from .workflows import pair

    check_report_file(report, "report")
    matcher, opts = registry.get(method), registry.options_for(method, options)
    place = devices.placement(device, dtype)
    ma, mb = load(a), load(b)
    families = mb.spec.default_families() if groups == "default" else groups
    mb.spec.select(families)  # unknown or absent families fail here, before any work
    batches = pair.batches_for(matcher, opts, data, ma.path, split, seq_len)
    runtime = place.record(place.working(ma.dtype)) if matcher.forward else {"device": place.device} if matcher.places else {}
    found = registry.align(method, ma, mb, families, batches, opts, progress=progress, **runtime)
    rep = pair.summary(ma.path, mb.path, None, mb, found, families)
    sides = {"A": ma, "B": mb}
    models = {s: sides[s].moved(g) for s, g in found.elements.items()}
    result = Result("align", rep, None, found.elements, models)
    if report:
        result.save(report)
    return result


def merge(models: list, out, method: str = "weight", options: Options | dict | None = None,
          rounds: ManyOptions | dict | None = None, *, weights: list[float] | None = None, groups="default", data=None,
          batch_size: int | None = None, max_batches: int | None = None, seq_len: int | None = None, aligned=None,
          force: bool = False, out_dtype=None, device: str | None = None, dtype: str | None = None, resume: bool = False,
          report=None, progress: bool = False) -> Result | None:
    """Bring every model (folders or ids, one architecture; mixed widths expanded into the widest) into
    shared coordinates and write their weighted average to OUT (`merge_many.merge_models`); with `aligned`,
    every aligned model to `aligned/1 ... n`. `data` (activation, learned, dual): `batch_size` and
    `max_batches` are the training batches' (None: the options', for learned and dual the recipe's; validation:
    `options.val_batches`); the recipe's `--lr auto` on a run too short for its search takes the method's
    fixed rate (`lr_search.affordable_rate`, the report's `lr_note`). Learned and dual: `resume`
    continues an interrupted run of OUT; under torchrun every process takes its rows of each batch and the
    first writes OUT (the others return None)."""
    from .algebra.simplex import check_weights
    from .data.batches import load_batches
    from .errors import SymmergeError
    from .match import registry
    from .match.lr_search import affordable_rate
    from .match.options import learn_config
    from .runtime import devices, distributed
    from .runtime.checks import check_report_file
    from .workflows.merge_many import merge_models
    from .workflows.pair import batch_size as recipe_batch_size
    from .workflows.pair import validation_batches

    paths = [_path(m) for m in models]
    check_report_file(report, "--json", [out, aligned])
    matcher = registry.get(method)
    place = devices.placement(device, dtype)
    if not (matcher.forward or matcher.casts) and (device or dtype):
        raise SymmergeError(f"--device and --dtype are for merge --method activation, learned or dual; {method} "
                            "matching runs on the CPU, in --precision")
    if matcher.needs_data and not data:
        raise SymmergeError(f"merge --method {method} needs --data PATH (a data set to run the models on)")
    opts = registry.many_options_for(method, options, rounds)
    check_weights(weights, len(paths))  # before the data is read

    def batches():
        if not matcher.needs_data or isinstance(data, registry.Data):
            return data if matcher.needs_data else None
        size = batch_size if batch_size is not None else recipe_batch_size(opts, paths[0], seq_len)
        count = max_batches if max_batches is not None else opts["max_batches"]
        train = load_batches(paths[0], data, "train", size, seq_len, count)
        val = validation_batches(opts, data, paths[0], size, seq_len, method) if matcher.validates else \
            load_batches(paths[0], data, "validation", size, seq_len, count) if matcher.holds_out(opts) else []
        return registry.Data(train, val)

    group = distributed.init(device) if matcher.validates else distributed.current()  # torchrun: learned/dual
    batched, note = group.agree(batches), None
    if matcher.validates:
        lr_given = registry.options(method, options).lr is not None
        opts["lr"], note = affordable_rate(learn_config(method, None, opts, progress=False), batched.train,
                                           batched.val, lr_given)
    rep = merge_models(paths, out, weights, method, groups, aligned, force, opts, progress=progress, dtype=out_dtype,
                       data=batched, place=place, data_name=data if isinstance(data, str) else None,
                       resume=resume)
    if rep is None:
        return None
    if note:
        rep["lr_note"] = note
    result = Result("merge", rep, Path(out))
    if report:
        result.save(report)
    return result


def barrier(models: list, data, *, split: str = "test", batch_size: int = 8, max_batches: int | None = None,
            seq_len: int | None = None, points: int = 11, refine: bool = False, weights: list[float] | None = None,
            simplex_points: int | None = None, seed: int | None = None, device: str | None = None,
            dtype: str | None = None, report=None, plot=None, progress: bool = False) -> Result:
    """Loss and accuracy along the straight line between two models (`barrier_pair.barrier`: the first's data
    preparation, λ = 0 at the first), or the barrier of three or more (`barrier_many.many_barrier`:
    `weights` of the average, `simplex_points` Dirichlet points drawn from `seed`; `plot`: the triangle
    of three models). Models: folders, ids or `Model`s."""
    from .algebra.simplex import check_weights, parse_weights
    from .data.batches import load_batches
    from .errors import SymmergeError
    from .runtime import devices
    from .runtime.checks import check_plot_file, check_report_file

    if len(models) < 2:
        raise SymmergeError(f"a barrier needs at least two models, got {len(models)}")
    place = devices.placement(device, dtype)
    models = [_path(m) for m in models]
    if len(models) > 2:
        w = check_weights(parse_weights(weights) if isinstance(weights, str) else weights, len(models))
        if refine:
            raise SymmergeError("--refine is for two models")
        if plot and len(models) != 3:
            raise SymmergeError(f"--plot draws the triangle of three models; got {len(models)}")
    elif weights is not None or simplex_points is not None or seed is not None:
        raise SymmergeError("--weights, --simplex-points and --seed are for three or more models")
    check_report_file(report, "--json")
    check_plot_file(plot, report)
    loaded = [load(m) for m in models]
    if len(models) > 2:
        from .workflows.merge_many import check_models

        loaded, _ = check_models(loaded, [str(p) for p in models])  # mixed widths: the widest
    else:
        from .store.expansion import widest

        loaded = list(widest(*loaded))  # mixed widths: the narrower expanded into the wider
    first = models[0] if isinstance(models[0], (str, Path)) else loaded[0].path
    batches = data if isinstance(data, list) else load_batches(first, data, split, batch_size, seq_len, max_batches)
    where = {"data": str(data), "split": split} if isinstance(data, str) else {}
    if len(models) > 2:
        rep = _simplex(models, loaded, batches, w, points, simplex_points, seed, place, where, plot, progress)
    else:
        rep = _line(models, loaded, batches, points, refine, place, where, plot, progress)
    result = Result("barrier", rep)
    if report:
        result.save(report)
    return result


def _line(names, models, batches, points, refine, place, where, plot, progress) -> dict:
    from .evaluation.barrier_pair import barrier as line
    from .evaluation.barrier_pair import plot as draw

    a, b = models
    dtype = place.working(a.dtype)
    rep = line(a, b, batches, points, refine, progress=progress, dtype=dtype, device=place.device)
    rep.update({"a": str(names[0]), "b": str(names[1]), **where, **place.record(dtype)})
    if plot:
        draw(rep, plot, f"{Path(str(names[0])).name} → {Path(str(names[1])).name}")
    return rep


def _simplex(names, models, batches, weights, points, simplex_points, seed, place, where, plot, progress) -> dict:
    from .evaluation.barrier_many import many_barrier, plot_triangle, triangle

    k = 16 if simplex_points is None else simplex_points
    dtype = place.working(models[0].dtype)
    rep = many_barrier(models, batches, weights, points, k, 0 if seed is None else seed, progress=progress,
                       dtype=dtype, device=place.device)
    rep.update({"models": [str(p) for p in names], **where, **place.record(dtype)})
    if plot:
        rep["triangle"] = triangle(models, batches, progress=progress, dtype=dtype, device=place.device)
        plot_triangle(rep["triangle"], plot, [Path(str(p)).name for p in names])
    return rep


def interpolate(a, b, lam: float, out, *, extrapolate: bool = False, force: bool = False, out_dtype=None) -> Result:
    """Write (1 − λ)·A + λ·B (canonical form; mixed widths expanded into the wider) as a stock checkpoint
    of A's class to OUT; λ outside [0, 1] only with `extrapolate`."""
    from .evaluation.forward import interpolate as mix
    from .store.compatible import check_lambda
    from .store.expansion import widest
    from .store.io import prepare_output
    from .store.model import load_model, save_model

    a, b = _path(a), _path(b)
    check_lambda(lam, extrapolate)
    prepare_output(out, force, [a, b])
    ma, mb = widest(load_model(a), load_model(b))
    record = {"a": str(a), "b": str(b), "lambda": lam}
    save_model(ma, mix(ma.params, mb.params, lam), out, force=force, dtype=out_dtype, extra={"interpolate": record})
    return Result("interpolate", record, Path(out))


def expand(narrow, like, out, *, force: bool = False, out_dtype=None, progress: bool = False) -> Result:
    """Write NARROW in the config of `like` (a wider checkpoint; only its config.json is read), computing
    NARROW's function (`expansion.expand_checkpoint`). The report holds both shapes and the scales used."""
    from .store.expansion import expand_checkpoint

    narrow, like = _path(narrow), _path(like)
    written, e = expand_checkpoint(narrow, like, out, force=force, progress=progress, dtype=out_dtype)
    rep = {"narrow": str(narrow), "like": str(like), "narrow_shape": dataclasses.asdict(e.narrow),
           "wide_shape": dataclasses.asdict(e.wide), "writer_scale": e.writer_scale, "score_scale": e.score_scale}
    return Result("expand", rep, Path(written))


def transform(model, out, seed: int = 0, groups: list[str] | None = None, spread: float = 2.0, *, force: bool = False,
              out_dtype=None) -> Result:
    """Write `model` transformed by a random element of `groups` (None: every group), drawn from `seed` with
    scales and singular values in [1/spread, spread]: the same function in other coordinates."""
    import torch

    from .algebra.apply import apply
    from .algebra.elements import random_element
    from .store.io import prepare_output
    from .store.model import LazyModel
    from .store.stream import write_streaming

    model = _path(model)
    prepare_output(out, force, [model])  # fail before any work
    lazy = LazyModel(model)  # block by block: memory does not grow with depth
    g = random_element(lazy.spec, torch.Generator().manual_seed(seed), groups, spread)
    record = {"source": str(model), "seed": seed, "groups": groups or "all"}
    written = write_streaming(lazy, lambda part: apply(lazy.spec, g, part), out, force=force,
                              extra={"transform": record}, dtype=out_dtype)
    rep = {**record, "hf_class": lazy.shape.hf_class, "families": groups or lazy.spec.families()}
    return Result("transform", rep, Path(written), g)


def evaluate(model, data, *, split: str = "test", batch_size: int = 8, max_batches: int | None = None,
             seq_len: int | None = None, device: str | None = None, dtype: str | None = None,
             report=None) -> Result:
    """Mean loss per token (image) and accuracy of a checkpoint folder (or id), with standard errors,
    through its stock transformers class. NaN (the standard error of a single batch) is reported as None;
    `result.notes["unit"]`: "token" or "image"."""
    import math

    from .data.batches import is_vision, load_batches
    from .errors import SymmergeError
    from .evaluation.forward import evaluate as scores
    from .runtime import devices
    from .runtime.checks import check_report_file
    from .store.io import Checkpoint, load_config
    from .store.model import hf_class, runs_in

    model = _path(model)
    place = devices.placement(device, dtype)
    check_report_file(report, "--json")
    ckpt = Checkpoint(model)  # refuses pickles and folders without safetensors
    dtype = place.working(ckpt.dtype())
    batches = load_batches(model, data, split, batch_size, seq_len, max_batches)
    config = load_config(Path(model))
    names = getattr(config, "architectures", None) or []
    if not names:
        raise SymmergeError(f"{model}/config.json names no architectures; cannot pick the model class")
    try:
        cls = hf_class(names[0])
    except AttributeError:
        raise SymmergeError(f"{model}: transformers has no class {names[0]} (config.json architectures)") from None
    net = cls.from_pretrained(str(ckpt.path), local_files_only=True, use_safetensors=True, dtype=dtype,
                              config=runs_in(config, dtype))
    net.to(place.device)
    res = scores(net, batches) | {"model": str(model), "data": data, "split": split, **place.record(dtype)}
    rep = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in res.items()}  # strict JSON
    result = Result("eval", rep, notes={"unit": "image" if is_vision(config) else "token"})
    if report:
        result.save(report)
    return result
