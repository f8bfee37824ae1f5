"""Block-at-a-time access to checkpoints, for models that do not fit in memory twice over.

`model.LazyModel` reads the canonical tensors of one block (or of the embeddings and head) on demand
from the safetensors files; `write_streaming` exports a model block by block, writing a shard whenever
`max_shard_bytes` have accumulated. Peak memory is one block in float64 plus one shard, whatever
the depth.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from .io import INDEX, WEIGHTS, AtomicFolder, copy_side_files, prepare_output
from .model import LazyModel, keep_expected

Params = dict[str, torch.Tensor]


class _ShardWriter:
    def __init__(self, folder: Path, max_shard_bytes: int):
        self.folder, self.max = folder, max_shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.size = 0
        self.files: list[tuple[str, list[str]]] = []

    def add(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            if self.pending and self.size + nbytes > self.max:
                self.flush()
            self.pending[name] = t.contiguous()
            self.size += nbytes

    def flush(self) -> None:
        if not self.pending:
            return
        fname = f"model-{len(self.files) + 1:05d}.safetensors"
        save_file(self.pending, str(self.folder / fname), metadata={"format": "pt"})
        self.files.append((fname, list(self.pending)))
        self.pending, self.size = {}, 0

    def finish(self) -> None:
        self.flush()
        if len(self.files) == 1:
            (self.folder / self.files[0][0]).rename(self.folder / WEIGHTS)
            return
        n, weight_map, total = len(self.files), {}, 0
        for k, (fname, names) in enumerate(self.files):
            final = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
            (self.folder / fname).rename(self.folder / final)
            weight_map.update({name: final for name in names})
        total = sum((self.folder / f).stat().st_size for f in set(weight_map.values()))
        (self.folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def write_streaming(model: LazyModel, transform: Callable[[Params], Params], out, force: bool = False,
                    dtype: torch.dtype | None = None, extra: dict | None = None,
                    max_shard_bytes: int = 2 * 1024**3, progress: bool = True) -> Path:
    """Export `transform(part)` for each part of `model` (ends, then each block) as a stock checkpoint."""
    out = prepare_output(out, force)
    dtype = dtype or model.dtype
    ends = transform(model.ends())
    config = model.adapter.export_config(model.config, model.shape, {**ends, **_bias_probe(model, ends)})
    cls = model.shape.hf_class

    def cast(sd):
        return {k: v.to(dtype=dtype, copy=True) for k, v in sd.items()}

    with AtomicFolder(out) as tmp:
        writer = _ShardWriter(tmp, max_shard_bytes)
        writer.add(cast(keep_expected(model.adapter.ends_from_canonical(ends, model.shape), config, cls, partial=True)))
        for i in tqdm(range(model.shape.n_layers), desc="writing", unit="block", disable=not progress):
            block = transform(model.block(i))
            writer.add(cast(keep_expected(model.adapter.block_from_canonical(block, model.shape, i), config, cls, partial=True)))
        writer.finish()
        config.architectures = [cls]
        config.save_pretrained(tmp)
        copy_side_files(model.path, tmp)
        if extra is not None:
            (tmp / "symmerge.json").write_text(json.dumps(extra, indent=2))
    return out


def _bias_probe(model: LazyModel, ends: Params) -> Params:
    """What `export_config` reads of the blocks: whether any attention bias is non-zero.

    Group elements map zero biases to zero and non-zero ones to non-zero, so the source decides.
    Only LayerNorm models can gain biases (by folding the norm's bias), so only they are scanned."""
    probe = {f"blocks.{i}.attn.{n}": torch.zeros(1, dtype=torch.float64)
             for i in range(model.shape.n_layers) for n in ("b_Q", "b_K", "b_V", "b_O")}
    if model.shape.centred:
        for i in range(model.shape.n_layers):
            block = model.block(i)
            hits = [k for k in probe if k.startswith(f"blocks.{i}.") and bool(block[k].ne(0).any())]
            if hits:
                probe[hits[0]] = torch.ones(1, dtype=torch.float64)
                break
    return probe
