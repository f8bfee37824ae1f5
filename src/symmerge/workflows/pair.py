"""Aligning one pair of checkpoint folders into an output folder: the library behind `symmerge align`.

`align_checkpoints(a, b, out, method, options)` checks every input before any work (the placement, the
options the method reads, OUT apart from the inputs, data for the data-driven methods, the report path,
the groups), then runs the matcher and writes OUT:

- weight / activation (they stream): A and B read one part at a time (`model.LazyModel`, in the options'
  precision), OUT = g·B written block by block (`stream.write_streaming`) in A's norm gauge where A's
  gauge can be used (`in_gauge_of`), with a mergekit config of the midpoint beside it;
- learned / dual (they validate): under torchrun every process runs it and shares every check
  (`distributed.Group.agree`); the first writes OUT (g·B, or OUT/A and OUT/B for dual) and the report.

The report is the `align` JSON payload (`report.py`); `report=PATH` also writes it there (checked first).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import SymmergeError
from ..match import registry
from ..match.learn_config import BATCH_TOKENS
from ..match.options import Options, learn_config
from ..runtime import devices, distributed


def load_data(data: str, model_dir, split: str, batch_size: int, seq_len: int | None, max_batches: int | None,
              method: str) -> list[dict]:
    """Batches for the data-driven methods, through the project's data API."""
    from ..data.batches import load_batches

    if not data:
        raise SymmergeError(f"--method {method} needs --data PATH (a data set to run both models on)")
    return load_batches(model_dir, data, split, batch_size, seq_len, max_batches)


def validation_batches(opts: dict, data, model_dir, size: int, seq_len: int | None, method: str) -> list[dict]:
    """The batches that choose the best state: every item of `val_data` when the options name one, else the
    validation split of `data`; `val_batches` of them when it is a number (auto: sized from all)."""
    val = opts["val_batches"] if isinstance(opts["val_batches"], int) else None
    if opts.get("val_data"):
        return load_data(opts["val_data"], model_dir, "all", size, seq_len, val, method)
    return load_data(data, model_dir, "validation", size, seq_len, val, method)


def tokens_per_item(model_dir, seq_len: int | None) -> int:
    """Tokens one sequence (--seq-len, or the context) or one image (its patches and CLS token) holds."""
    from ..data.batches import context_length, is_vision
    from ..store.io import load_config

    config = load_config(Path(model_dir))
    if is_vision(config):
        return (int(config.image_size) // int(config.patch_size)) ** 2 + 1
    return seq_len or context_length(config)


def batch_size(opts: dict, model_dir, seq_len: int | None) -> int:
    """The options' batch size, or for the full recipe as many items as make BATCH_TOKENS tokens."""
    if opts["batch_size"] is not None:
        return opts["batch_size"]
    return max(1, round(BATCH_TOKENS / tokens_per_item(model_dir, seq_len)))


def batches_for(matcher, opts: dict, data, model_dir, split: str = "train",
                seq_len: int | None = None) -> registry.Data | None:
    """learned/dual: training batches and validation batches; activation: batches of `split`, and as many of the
    validation split to choose its element on where its options read them (`Matcher.holds_out`); a
    `registry.Data` given as `data` as it is."""
    if not matcher.needs_data or isinstance(data, registry.Data):
        return data if matcher.needs_data else None
    size = batch_size(opts, model_dir, seq_len)
    if matcher.validates:
        return registry.Data(load_data(data, model_dir, "train", size, seq_len, opts["max_batches"], matcher.name),
                             validation_batches(opts, data, model_dir, size, seq_len, matcher.name))
    train = load_data(data, model_dir, split, size, seq_len, opts["max_batches"], matcher.name)
    held = load_data(data, model_dir, "validation", size, seq_len, opts["max_batches"], matcher.name) \
        if matcher.holds_out(opts) else []
    return registry.Data(train, held)


def load_pair(a, b, families, lazy_dtype=None):
    """Both checkpoints (in memory, or lazily for a streaming matcher), checked to share a group."""
    from ..store.expansion import widest
    from ..store.model import LazyModel, load_model

    if lazy_dtype is None:
        ma, mb = load_model(a), load_model(b)
    else:
        ma, mb = LazyModel(a, lazy_dtype), LazyModel(b, lazy_dtype)
    ma, mb = widest(ma, mb, str(a), str(b))  # mixed widths: the narrower expanded into the wider
    mb.spec.select(families)  # unknown or absent families fail here, before any work
    return ma, mb


def summary(a, b, out, model, result, families) -> dict:
    """The report of an alignment of B (`model`) to A: the method's figures and the groups found."""
    from ..match.summary import summarize

    found = summarize(model.spec, result.elements["B"], model.spec.select(families))
    return {
        "method": result.method, "a": str(a), "b": str(b), "out": str(out),
        "groups_selected": families or model.spec.families(),
        "objective_name": "similarity = 1 - ||A - g.B||^2 / ||A||^2 over canonical tensors"
        + (" (activation matching: before and after; it optimises the activations' fit)" if result.method == "activation" else ""),
        **result.figures, **found,
    }


def _meta(rep: dict, data) -> dict:
    """The output's record of the alignment (symmerge.json, and its model card)."""
    source = {"data": data} if isinstance(data, str) and data else {}
    return {"align": {**{k: rep[k] for k in ("method", "a", "b", "groups_selected", "objective")}, **source}}


def in_gauge_of(a, out, dtype, like, rep: dict):
    """(gauge of A, side files) for an aligned output OUT: written in A's norm gauge, with a mergekit
    config of the midpoint beside it; (None, {}) where A's gauge cannot be used (see `gauge.Gauge.of`), or
    where A was expanded into B's wider config (`like`, A as matched, is not of A's shape): OUT is then in
    canonical form, the gauge `symmerge expand A --like B` writes A in. `rep["gauge"]` says which."""
    from ..store.gauge import pair_side_files
    from ..store.model import reference_gauge

    gauge = reference_gauge(a, like)
    if gauge is None:
        rep["gauge"] = "canonical"
        return None, {}
    rep["gauge"] = str(a)
    return gauge, pair_side_files(a, out, dtype)


def default_families(groups, b) -> list[str] | None:
    """`groups` as given (None: every group); "default": the spec's default families (`Spec.default_families`)."""
    if groups != "default":
        return groups
    from ..store.model import LazyModel

    return LazyModel(b).spec.default_families()


def _checked(a, b, out, matcher, options: Options, families, data, device, dtype, resume: bool, force: bool,
             report) -> tuple:
    """(placement, the matcher's options, the families), every argument checked before any work."""
    from ..runtime.checks import check_report_file
    from ..store.io import prepare_output

    place = devices.placement(device, dtype)
    forward = [m.name for m in registry.MATCHERS.values() if m.forward or m.casts]  # --dtype: the forward's
    placed = [m.name for m in registry.MATCHERS.values() if m.forward or m.places or m.casts]  # --device
    resumable = [m.name for m in registry.MATCHERS.values() if m.validates]
    if not (matcher.forward or matcher.casts) and dtype:
        raise SymmergeError(f"--dtype is for --method {' or '.join(forward)} (the forward's precision); "
                            f"{matcher.name} matching computes in --precision")
    if matcher.name not in placed and device:
        raise SymmergeError(f"--device is for --method {' or '.join(placed)}; {matcher.name} matching runs on the CPU")
    if resume and not matcher.validates:
        raise SymmergeError(f"--resume continues an interrupted --method {' or '.join(resumable)} run; "
                            f"{matcher.name} matching keeps no run to resume: run it again without --resume")
    if not resume:
        prepare_output(out, force, [a, b])  # fail before any work
    if matcher.needs_data and not data:
        raise SymmergeError(f"--method {matcher.name} needs --data PATH (a data set to run both models on)")
    check_report_file(report, "--json", [out])
    return place, registry.options(matcher.name, options), default_families(families, b)


def align_checkpoints(a, b, out, method: str = "weight", options=None, groups="default", data=None,
                      split: str = "train", seq_len: int | None = None, force: bool = False, out_dtype=None,
                      device: str | None = None, dtype: str | None = None, resume: bool = False,
                      shard_endpoints: int | None = None, report=None, progress: bool = True) -> dict | None:
    """Align checkpoint folder `b` to `a` and write OUT (module docstring); returns the report (None on the
    processes of a torchrun group but the first). `groups`: families, None for every group, "default" for
    the spec's default; `data`: a data set (`data.load_batches`) or a `registry.Data`; `out_dtype`: of
    the written checkpoint (a torch dtype; default: B's); `shard_endpoints`: under torchrun, FSDP2 shards the
    frozen endpoints over all processes (0) or over groups of K (`distributed.shard_size`); None: not sharded."""
    matcher = registry.get(method)
    if matcher.validates:  # under torchrun every process checks, and all share the first error
        group = distributed.init(device, shard=shard_endpoints)
        place, opts, families = group.agree(lambda: _checked(a, b, out, matcher, options, groups, data, device, dtype,
                                                             resume, force, report))
        return _learned(a, b, out, matcher, families, opts, place, data, seq_len, force, out_dtype, resume, report)
    place, opts, families = _checked(a, b, out, matcher, options, groups, data, device, dtype, resume, force, report)
    rep = _streamed(a, b, out, matcher, families, opts.resolved(), place, data, split, seq_len, force, out_dtype,
                    progress)
    if report:
        from ..store.report import write

        write(report, "align", rep)
    return rep


def _streamed(a, b, out, matcher, families, opts, place, data, split, seq_len, force, out_dtype, progress) -> dict:
    """A streaming matcher (weight, activation) from the checkpoints, one block at a time, and OUT written block
    by block."""
    from ..algebra.apply import apply
    from ..store.stream import write_streaming

    batches = batches_for(matcher, opts, data, a, split, seq_len)
    ma, mb = load_pair(a, b, families, getattr(torch, opts["precision"]))
    runtime = {"device": place.device} if matcher.places or matcher.casts else {}
    if matcher.casts:
        runtime["dtype"] = place.dtype  # None: the forward in --precision
    result = registry.align(matcher.name, ma, mb, families, batches, opts=opts, progress=progress, **runtime)
    rep = summary(a, b, out, mb, result, families)
    if matcher.places or matcher.casts:
        rep["device"] = str(place.device)
    if matcher.casts and place.dtype is not None:
        rep["dtype"] = devices.dtype_name(place.dtype)
    g = result.elements["B"]
    dtype = out_dtype or mb.dtype
    gauge, side = in_gauge_of(a, out, dtype, ma, rep)
    write_streaming(mb, lambda part: apply(mb.spec, g, part), out, force=force, extra=_meta(rep, data),
                    gauge=gauge, side=side, dtype=dtype)
    return rep


def _affordable_rate(matcher, families, opts, data, lr_given: bool) -> str | None:
    """`lr_search.affordable_rate` for these options (whose rate it sets); its note."""
    from ..match.lr_search import affordable_rate

    opts["lr"], note = affordable_rate(learn_config(matcher.name, families, opts, progress=False), data.train,
                                       data.val, lr_given)
    return note


def _learned(a, b, out, matcher, families, options, place, data, seq_len, force, out_dtype, resume,
             report) -> dict | None:
    """Learn against the loss on the path, from the solution of the matcher it starts from (weight
    matching, absorbed into B); OUT = g·B, or OUT/A and OUT/B for dual.

    Bounded memory: A and B are `LazyModel`s (safetensors memory-mapped, read one part at a time) from the
    start to the end. Weight matching streams them in the options' precision; the learner keeps them frozen
    in their own dtype (`frozen.Frozen`) and materialises one block (one chunk of the head, the batch's
    rows of the embedding) at a time; OUT is written part by part (`stream.write_streaming`); the output
    check reads the files block by block (`file_forward.FileForward`). No whole float32/float64 copy of
    either model is ever made (tests/test_outputs_bounded.py)."""
    from ..match.learn_loop import Result
    from ..match.outputs import checkpoint_folder, finish_learned, open_checkpoint

    group = distributed.current()  # several processes: each reads the inputs, rank 0 alone writes
    opts = options.resolved()
    precision = getattr(torch, opts["precision"])
    batches, (ma, mb) = group.agree(lambda: (batches_for(matcher, opts, data, a, "train", seq_len),
                                             load_pair(a, b, families, precision)))
    group.agree(lambda: group.check_data(batches.train, batches.val))  # before weight matching, which comes first
    note = group.agree(lambda: _affordable_rate(matcher, families, opts, batches, options.lr is not None))
    group.agree(lambda: open_checkpoint(out, force, resume), main_only=True)
    ckpt = checkpoint_folder(out)
    result = registry.align(matcher.name, ma, mb, families, batches, opts, progress=group.main, checkpoint=ckpt,
                            resume=resume, **place.record(place.working(ma.dtype)))
    if not group.main:
        return None
    name = data if isinstance(data, str) else None
    rep = finish_learned(Result(result.elements, {**result.figures, "data": name}), ma, mb, out, force,
                         batches.val[0], ckpt, dtype=out_dtype)
    start = result.start
    rep["start"] = {"method": start.method, "objective": start.figures["objective"], "seconds": start.figures["seconds"]}
    rep["recipe"] = opts["recipe"]
    if note:
        rep["lr_note"] = note
    if report:
        from ..store.report import write

        write(report, "align", rep)
    return rep
