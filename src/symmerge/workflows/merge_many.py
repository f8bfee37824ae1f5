"""Merging many models: every model brought into shared coordinates by a registered matcher's many-model
form (`match.registry.align_many`), then their weighted average exported as a stock checkpoint.

`merge_models(paths, out)` checks everything before any work (at least two models of one architecture,
vocabulary and tokenizer / image processor; mixed widths expanded into the widest config that takes every
other model, `expansion.widest_many`; weights non-negative, one per model, summing to 1; data for the
data-driven methods; OUT and the aligned folder apart from the inputs and each other), then matches
(models read one part at a time, `model.LazyModel`: weight matching streams them; learned and dual matching
keep them frozen in their own dtype and run block by block; activation matching runs one block of each at a
time, its means kept on disk, `match.activation_many`),
writes OUT part by part as the weighted mean of `g_i·M_i` (`stream.write_streaming`), and with `aligned`
each `g_i·M_i` (its input's function exactly, up to storage rounding; a narrow input in the widest config)
to `aligned/<i>` (1-based, in the order given), written as one unit (`atomic.AtomicFolders`: both complete, or neither)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ..algebra.apply import apply
from ..algebra.simplex import check_weights
from ..errors import SymmergeError
from ..match import registry
from ..match.many import MeanParts
from ..runtime import distributed
from ..store.io import AtomicFolders
from ..store.parts import Served


def check_models(models: list, names: list[str]) -> tuple[list, int]:
    """(models, w): every model in one config (`expansion.widest_many`: mixed widths expanded into the widest,
    models[w] one of that config as it was), sharing one group (architecture, sizes, vocabulary) and
    preprocessing; otherwise the first mismatch, with its reason."""
    from ..store.expansion import widest_many

    return widest_many(models, names)


def check_outputs(inputs: list, outputs: list, force: bool) -> None:
    """Each output folder: not an input, not inside or around one, not another output (or inside or
    around it), and empty unless `force`."""
    from ..store.io import prepare_output

    ins = [Path(p).resolve() for p in inputs]
    outs = [Path(p).resolve() for p in outputs if p is not None]
    for i, o in enumerate(outs):
        for kind, others in (("the input", ins), ("the other output", outs[:i])):
            for p in others:
                if o == p:
                    raise SymmergeError(f"output folder {o} is {kind} {p}; choose another folder")
                if p in o.parents:
                    raise SymmergeError(f"output folder {o} lies inside {kind} {p}; choose another folder")
                if o in p.parents:
                    raise SymmergeError(f"output folder {o} holds {kind} {p}; choose another folder")
        prepare_output(o, force)


def merge_models(paths: list, out, weights: list[float] | None = None, method: str = "weight",
                 families: list[str] | str | None = "default", aligned=None, force: bool = False, opts: dict | None = None,
                 progress: bool = False, dtype=None, data=None, start=None, place=None,
                 data_name: str | None = None, resume: bool = False) -> dict | None:
    """Merge the checkpoints `paths` into OUT (see the module docstring); returns the report. `dtype`:
    of the outputs (default: the first input's). The aligned models are written in the norm gauge of the
    first input of the widest config (`gauge.py`; the first input where all have one config), so that their
    plain weighted average (DIR/mergekit.yml) is OUT.

    `method`: a matcher with a many-model form (`registry.many_methods()`); `data`: a `registry.Data` for
    the data-driven ones (activation: `train`; learned and dual: `train` and `val`); `data_name`: where it came from
    (--data), recorded in the outputs' symmerge.json and model cards.
    `families`: "default" for the spec's default families (`Spec.default_families`), None for every
    group; `opts`: the matcher's options (`registry.many_options_for`), e.g. {"max_rounds": 10}.
    `start`: a `registry.ManyAlignment` found already on these models and families: of `method` itself
    (it is the result: nothing is matched again), or of the matcher `method` starts from (learned / dual
    after a weight merge: the rounds are not run again). `place`: where the forward of learned / dual
    matching runs (`devices.Placement`; default: the CPU in the first input's dtype); they keep the models
    frozen in their own dtype and run block by block (`learn_many.ManyLearner`), keep their run's state in
    OUT.learn-state until OUT is written (`resume`: continue it) and, under torchrun, take every process's
    rows of each batch: the first process writes OUT and returns the report, the others None."""
    from ..match.summary import summarize
    from ..store.model import LazyModel
    from ..store.stream import write_streaming

    w = check_weights(weights, len(paths))
    matcher = registry.get(method)
    if matcher.many is None:
        raise SymmergeError(f"merge --method {method}: not built for many models; "
                            f"choose from {', '.join(registry.many_methods())}")
    if matcher.needs_data and data is None:
        raise SymmergeError(f"merge --method {method} needs --data PATH (a data set to run the models on)")
    opts = registry.many_options_for(method, opts)  # checked: `match.options`
    names = [str(p) for p in paths]
    inputs = [LazyModel(p, getattr(torch, opts.get("precision", "float64"))) for p in paths]
    models, ref = check_models(inputs, names)
    families = models[0].spec.default_families() if families == "default" else families
    models[0].spec.select(families)  # unknown or absent families fail here, before any work
    check_outputs(paths, [out, aligned], force)
    first = matcher.start_of(opts)
    if start is not None and (start.method not in (method, first) or len(start.elements) != len(models)):
        raise SymmergeError(f"merge --method {method}: the start given is a {start.method} alignment of "
                            f"{len(start.elements)} models, not one of {method} or {first} of {len(models)}")
    runtime, group, ckpt = {}, distributed.current(), None
    if resume and not matcher.forward:
        raise SymmergeError(f"--resume continues an interrupted merge --method learned or dual run; {method} matching "
                            "keeps no run to resume: run it again without --resume")
    if matcher.forward:
        from ..match.outputs import checkpoint_folder, open_checkpoint
        from ..runtime.devices import Placement

        place = place or Placement(torch.device("cpu"))
        runtime = place.record(place.working(models[0].dtype))
        group.agree(lambda: open_checkpoint(out, force, resume), main_only=True)
        ckpt = checkpoint_folder(out)
        runtime.update(checkpoint=ckpt, resume=resume)
    elif matcher.casts:  # no --dtype: the forward in --precision
        runtime = {"device": place.device, "dtype": place.dtype} if place is not None else {}
    result = (start if start is not None and start.method == method else
              registry.align_many(method, models, w, families, data, opts=opts, start=start,
                                  progress=progress and group.main, **runtime))
    if not group.main:
        return None
    selected = models[0].spec.select(families)
    rep = {"method": result.method, "models": names, "weights": w, "out": str(out),
           "aligned": None if aligned is None else [str(Path(aligned) / str(i + 1)) for i in range(len(paths))],
           "groups_selected": families or models[0].spec.families(),
           "expanded": [i + 1 for i, (m, given) in enumerate(zip(models, inputs)) if m is not given],
           "gauge_of": names[ref], **result.figures,
           "found": [summarize(m.spec, g, selected) for m, g in zip(models, result.elements)]}
    meta = {"merge": {k: rep[k] for k in ("method", "models", "weights", "groups_selected", "objective")}}
    if data is not None and data_name is not None:
        meta["merge"]["data"] = data_name
    with AtomicFolders([out] if aligned is None else [out, aligned]) as tmps:  # OUT and DIR: one unit
        mean = Served(models[0], MeanParts(models[0].spec, models, result.elements, w, list(range(len(models)))))
        write_streaming(mean, lambda part: part, out, extra=meta,
                        progress=progress, dtype=dtype, into=tmps[0])
        if aligned is not None:
            _write_aligned(models, result.elements, aligned, tmps[1], meta, progress, w, dtype, ref)
    if ckpt is not None:
        shutil.rmtree(ckpt, ignore_errors=True)  # OUT is written: the run is done
    return rep


def _write_aligned(models, elements, folder, tmp: Path, meta: dict, progress: bool, weights: list[float],
                   dtype=None, ref: int = 0) -> None:
    """Each `g_i·M_i` as a stock checkpoint of its input's class, in `folder/<i>` (1-based), written into
    `tmp` (the temporary folder that becomes `folder`), in the norm gauge of input `ref` (one of the
    shared config); `folder/mergekit.yml` is their weighted mean."""
    from ..store.gauge import side_files
    from ..store.model import reference_gauge
    from ..store.stream import write_streaming

    gauge = reference_gauge(models[ref].path)
    if gauge is not None:
        outs = [Path(folder).resolve() / str(i) for i in range(1, len(models) + 1)]
        for name, text in side_files(outs, outs[0], dtype or models[0].dtype, weights).items():
            (tmp / name).write_text(text)
    for i, (m, g) in enumerate(zip(models, elements), start=1):
        extra = {"merge_aligned": {**meta["merge"], "index": i, "input": str(m.path)}}
        (tmp / str(i)).mkdir()
        write_streaming(m, lambda part, m=m, g=g: apply(m.spec, g, part), Path(folder) / str(i), extra=extra,
                        progress=progress, gauge=gauge, dtype=dtype, into=tmp / str(i))
