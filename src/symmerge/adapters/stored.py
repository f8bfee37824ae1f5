"""Stock tensor names -> what a checkpoint's files hold.

A stock name is found in the files under itself or a legacy name (`Adapter.rename`), or, for the fused
expert tensors of a mixture of experts (`[n_experts, rows, cols]`, e.g. Mixtral's `mlp.experts.gate_up_proj`),
as one tensor per expert and part (`mlp.experts.{j}.w1.weight`, `...w3.weight`), which is how stock
`save_pretrained` writes them (`Adapter.expert_parts` names the parts; `Adapter.saved` splits them again on
writing). Fused on reading: expert j's parts concatenated along rows, the experts stacked.
"""

from __future__ import annotations

import re

import torch

from ..errors import SymmergeError

#: a per-expert part, under its current (renamed) stock name
_PART = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<j>\d+)\.(?P<part>[^.]+)\.weight$")


def fused_sources(adapter, names) -> dict[str, list[list[str]]]:
    """{fused stock name: for each expert, the stock names of its parts in order} for every fused tensor of
    `adapter` that `names` (stock names in the files) holds one expert at a time."""
    if not adapter.expert_parts:
        return {}
    experts: dict[str, set[int]] = {}
    for name in names:
        m = _PART.match(name)
        if m and any(m["part"] in parts for parts in adapter.expert_parts.values()):
            experts.setdefault(m["prefix"], set()).add(int(m["j"]))
    out = {}
    for prefix, js in experts.items():
        for fused, parts in adapter.expert_parts.items():
            rows = [[f"{prefix}.{j}.{part}.weight" for part in parts] for j in range(max(js) + 1)]
            missing = [n for row in rows for n in row if n not in names]
            if missing:
                raise SymmergeError(f"tensor {missing[0]} is missing (the checkpoint stores {prefix} one expert at a "
                                    "time, and lacks this one); re-save or re-copy the checkpoint")
            out[f"{prefix}.{fused}"] = rows
    return out


class StoredNames:
    """The tensors of checkpoint `ckpt` under the stock names of `adapter`'s class."""

    def __init__(self, adapter, ckpt):
        self.ckpt = ckpt
        self.files = {adapter.rename(k): k for k in ckpt.names()}  # stock name -> name in the files
        self.fused = fused_sources(adapter, self.files)

    def __contains__(self, name: str) -> bool:
        return name in self.files or name in self.fused

    def get(self, name: str) -> torch.Tensor:
        """The stock tensor `name`, as stored (a fused one assembled from its experts' parts)."""
        if name in self.fused:
            return torch.stack([torch.cat([self.ckpt.get(self.files[n]) for n in row]) for row in self.fused[name]])
        return self.ckpt.get(self.files[name])

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every stock tensor's shape, from the file headers."""
        stored = self.ckpt.shapes()
        out = {k: stored[f] for k, f in self.files.items()}
        for name, rows in self.fused.items():
            first = [stored[self.files[n]] for n in rows[0]]
            out[name] = (len(rows), sum(s[0] for s in first), *first[0][1:])
        return out


def split_experts(adapter, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`sd` with each fused expert tensor split into its experts' parts, as stock `save_pretrained` writes them
    (each part an equal share of the rows, in `Adapter.expert_parts` order)."""
    out = {}
    for key, t in sd.items():
        prefix, _, suffix = key.rpartition(".")
        parts = adapter.expert_parts.get(suffix) if prefix.endswith(".experts") else None
        if parts is None:
            out[key] = t
            continue
        for j in range(t.shape[0]):
            for part, piece in zip(parts, t[j].chunk(len(parts), 0)):
                out[f"{prefix}.{j}.{part}.weight"] = piece.contiguous()
    return out
