"""Write the outputs of learned / dual matching and measure that each computes its input's function
(`symmerge align --method learned|dual` runs these pieces around the matcher registry: `open_checkpoint`,
the run, `finish_learned`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ..algebra.apply import apply
from ..errors import SymmergeError
from ..evaluation.forward import max_abs_diff
from ..runtime.threads import one_thread
from ..store.io import AtomicFolder, prepare_output
from ..store.model import Model, in_memory, save_model
from .file_forward import FileForward
from .learn_loop import Result
from .learn_state import no_checkpoint


def write_element(model, g: dict, out, force: bool = False, extra: dict | None = None, gauge=None, side=None,
                  dtype=None) -> None:
    """g·model as a stock checkpoint in OUT: a `Model` in memory through `save_model`, a `LazyModel` (or an
    expanded one) part by part through `stream.write_streaming` (one part in the algebra's precision at a time).
    Both compute on one thread (`threads.one_thread`), so the written bytes are the same by either path and at
    any thread count."""
    if in_memory(model):
        with one_thread():
            params = apply(model.spec, g, model.params)
            save_model(model, params, out, force=force, extra=extra, gauge=gauge, side=side, dtype=dtype)
        return
    from ..store.stream import write_streaming

    write_streaming(model, lambda part: apply(model.spec, g, part), out, force=force, dtype=dtype,
                    extra=extra, progress=False, gauge=gauge, side=side)


def save_outputs(result: Result, a, b, out, force: bool = False, dtype=None) -> list[tuple[Path, Path]]:
    """learned: OUT = g·B. dual: OUT/A = gA·A and OUT/B = gB·B. Returns (input, output) folder pairs.

    `a`, `b`: `Model`s, or `LazyModel`s (written part by part: no whole copy of either model). Every output is
    written in the norm gauge of the stock A (`gauge.py`), so that a plain average of A and OUT (learned) or of
    OUT/A and OUT/B (dual) is the interpolation; a mergekit config of that midpoint lies beside
    (OUT/mergekit.yml). `dtype`: of the outputs (default: each input's)."""
    from ..store.gauge import pair_side_files, side_files
    from ..store.model import reference_gauge

    meta = {"align": {"a": str(a.path), "b": str(b.path), **{k: v for k, v in result.report.items() if k != "history"}}}
    out = prepare_output(out, force)
    gauge = reference_gauge(a.path, a) if a.path is not None else None
    if result.report["method"] == "learned":
        side = pair_side_files(a.path, out, dtype or b.dtype) if gauge else {}
        write_element(b, result.elements["B"], out, force=force, extra=meta, gauge=gauge, side=side, dtype=dtype)
        return [(b.path, out)]
    with AtomicFolder(out) as tmp:
        write_element(a, result.elements["A"], tmp / "A", extra=meta, gauge=gauge, dtype=dtype)
        write_element(b, result.elements["B"], tmp / "B", extra=meta, gauge=gauge, dtype=dtype)
        if gauge is not None:
            for name, text in side_files([out / "A", out / "B"], (out / "A").resolve(), dtype or b.dtype).items():
                (tmp / name).write_text(text)
    return [(a.path, out / "A"), (b.path, out / "B")]


#: the check of an output runs on the first rows of a batch, at most this many tokens (images: rows)
PROBE_TOKENS = 256


def probe(batch: dict) -> dict:
    """The first rows of `batch` holding at most `PROBE_TOKENS` tokens (at least one row; images: at most
    `PROBE_TOKENS // 16` of them): enough to see a wrong weight in every logit, at a cost that does not grow with
    the batch (at Pythia-1.4B shape each float64 forward of the check costs about 3e9 multiply-adds a token)."""
    first = next(v for v in batch.values() if torch.is_tensor(v))
    per_row = first.shape[1] if "input_ids" in batch and first.dim() > 1 else 16
    rows = max(1, PROBE_TOKENS // per_row)
    return {k: (v[:rows] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in batch.items()}


@torch.no_grad()
def logit_gap(source, output, class_name: str, batch: dict) -> float:
    """Largest |logit difference| between two checkpoint folders run by the stock forward of `class_name` in
    float64 (so that it measures the stored weights, not the arithmetic) on `probe(batch)`. The files are what is
    checked: each is read block by block from its safetensors (`file_forward.FileForward`, what
    `from_pretrained(dtype=float64)` computes), so the check holds one block and the ends in float64, never a
    whole model; canonical parameters are not used."""
    small = probe(batch)
    ref = FileForward(source).logits(small)
    forward = FileForward(output)
    if type(forward.hf).__name__ != class_name:
        raise SymmergeError(f"internal: {output} holds a {type(forward.hf).__name__}, expected {class_name}")
    return max_abs_diff(ref, forward.logits(small))


def output_report(pairs: list[tuple[Path, Path]], class_name: str, batch: dict) -> list[dict]:
    """For every output, its input and the largest logit difference from it (`logit_gap`)."""
    return [{"input": str(i), "output": str(o), "max_logit_diff": logit_gap(i, o, class_name, batch)} for i, o in pairs]


def checkpoint_folder(out) -> Path:
    """Where a run writing OUT keeps its resumable state: the sibling folder OUT.learn-state."""
    out = Path(out)
    return out.with_name(out.name + ".learn-state")


def open_checkpoint(out, force: bool = False, resume: bool = False) -> Path:
    """Check OUT can be written and give the run's checkpoint folder (`checkpoint_folder(out)`): an
    unfinished run there is continued (`resume`), replaced (`force`) or refused."""
    prepare_output(out, force)  # fail before any work
    ckpt = checkpoint_folder(out)
    if resume and not ckpt.is_dir():
        raise no_checkpoint(ckpt)
    if not resume and ckpt.exists():
        if not force:
            raise SymmergeError(f"{ckpt} holds an unfinished run; pass --resume to continue it or --force to start over")
        shutil.rmtree(ckpt)
    return ckpt


def finish_learned(result: Result, a: Model, b: Model, out, force: bool, batch: dict, ckpt: Path,
                   keep_checkpoint: bool = False, dtype=None) -> dict:
    """Write OUT (g·B, or A/ and B/ for dual) and return the report with, for every output, the largest
    logit difference from its input on `batch`; then remove the checkpoint unless `keep_checkpoint`."""
    pairs = save_outputs(result, a, b, out, force, dtype)
    report = dict(result.report, outputs=output_report(pairs, a.shape.hf_class, batch))
    if not keep_checkpoint:
        shutil.rmtree(ckpt, ignore_errors=True)
    return report
