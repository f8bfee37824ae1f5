"""Block-at-a-time access to checkpoints, for models that do not fit in memory twice over.

`model.LazyModel` reads the canonical tensors of one block (or of the embeddings and head) on demand
from the safetensors files; `write_streaming` exports a model block by block, writing a shard whenever
`max_shard_bytes` have accumulated. Peak memory is one block in float64 plus one shard, whatever
the depth.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

import torch

from ..runtime.progress import tqdm
from ..runtime.threads import one_thread
from .gauge import export_part, tied_scale
from .io import AtomicFolder, ShardWriter, copy_side_files, prepare_output
from .model import keep_expected
from .parts import ModelParts, Params
from .provenance import write_metadata


def write_streaming(model: ModelParts, transform: Callable[[Params], Params], out, force: bool = False,
                    dtype: torch.dtype | None = None, extra: dict | None = None,
                    max_shard_bytes: int = 2 * 1024**3, progress: bool = True, gauge=None,
                    side: dict[str, str] | None = None, into: Path | None = None) -> Path:
    """Export `transform(part)` for each part of `model` (ends, then each block) as a stock checkpoint,
    in the norm gauge of a reference if `gauge` is given (`gauge.py`), else in canonical form; `extra`:
    this operation's record for symmerge.json (`provenance.write_metadata`, over the model's own); `side`:
    more files (name -> text) written into OUT. `into`: an empty folder the caller made (the temporary
    folder of a write it commits, `io.AtomicFolders`), written directly, `out` then only named.
    The parts are transformed and exported on one thread (`threads.one_thread`): the written bytes do not
    depend on the thread count. `transform` acts on each tensor alone (a group element's `apply`, the
    identity): the ends are given to it one tensor at a time, each read tensor let go once transformed, so
    the vocabulary-sized inputs and outputs are not all held at once."""
    with one_thread():
        return _write_streaming(model, transform, out, force, dtype, extra, max_shard_bytes, progress, gauge, side, into)


def _write_streaming(model, transform, out, force, dtype, extra, max_shard_bytes, progress, gauge, side, into) -> Path:
    out = prepare_output(out, force) if into is None else Path(out)
    dtype = dtype or model.dtype
    ends = _transformed(model.ends(), transform)
    probe = _bias_probe(model, ends, None if gauge is None else lambda block: gauge.canonical(transform(block), model.shape)[0])
    config = model.adapter.export_config(model.config, model.shape, {**ends, **probe})
    config.tie_word_embeddings = tied_scale(ends, model.shape, gauge) is not None
    cls = model.shape.hf_class

    def exported(part: Params, key) -> Params:
        """HF tensors of one part under their saved names, cast to `dtype`."""
        sd = keep_expected(export_part(model.adapter, model.shape, part, gauge, key), config, cls, partial=True)
        return {k: v.to(dtype=dtype, copy=True) for k, v in model.adapter.saved(sd).items()}

    with AtomicFolder(out) if into is None else contextlib.nullcontext(Path(into)) as tmp:
        writer = ShardWriter(tmp, max_shard_bytes)
        writer.add(exported(ends, "ends"))
        for i in tqdm(range(model.shape.n_layers), desc="writing", unit="block", disable=not progress):
            block = transform(model.part(i))
            writer.add(exported(block, i))
        writer.finish()
        config.architectures = [cls]
        config.save_pretrained(tmp)
        copy_side_files(model.path, tmp)
        if extra is not None:
            write_metadata(tmp, extra, getattr(model, "meta", None))
        for name, text in (side or {}).items():
            (tmp / name).write_text(text)
    return out


def _transformed(part: Params, transform: Callable[[Params], Params]) -> Params:
    """`transform(part)` for a transform that acts tensor by tensor, given one tensor at a time and emptying `part`
    as it goes (its tensors are freed as they are transformed where nothing else holds them)."""
    out = {}
    for name in list(part):
        out.update(transform({name: part.pop(name)}))
    return out


def _bias_probe(model, ends: Params, exported: Callable[[Params], Params] | None = None) -> Params:
    """What `export_config` reads of the blocks: whether any attention bias is non-zero.

    Group elements map zero biases to zero and non-zero ones to non-zero, so the source decides; a
    gauge can make a zero bias non-zero (b - W beta), so with one the blocks are read as `exported`
    gives them. Only LayerNorm models can gain biases (by folding the norm's bias), so only they are scanned."""
    probe = {f"blocks.{i}.attn.{n}": torch.zeros(1, dtype=torch.float64)
             for i in range(model.shape.n_layers) for n in ("b_Q", "b_K", "b_V", "b_O")}
    if model.shape.centred:
        for i in range(model.shape.n_layers):
            block = model.part(i) if exported is None else exported(model.part(i))
            hits = [k for k in probe if k.startswith(f"blocks.{i}.") and bool(block[k].ne(0).any())]
            if hits:
                probe[hits[0]] = torch.ones(1, dtype=torch.float64)
                break
    return probe
