"""Sharded endpoints for learned / dual matching under torchrun: each rank keeps 1/N of every part of
the frozen endpoints, and a part is all-gathered when the block-wise forward asks for it.

`Sharded` stands in for `blockwise.Frozen` (same `part(key)`): at construction every rank reads each
part (embeddings, one block, final norm and head; `model.part_keys`) one at a time, moves it by the
fixed element if asked (dual: the absorbed weight-matching solution), flattens its tensors in the
checkpoint's dtype into one vector padded to a multiple of N, and keeps only its own contiguous 1/N
of it on its device. `part(key)` all-gathers that one vector (one collective per part, the layout of
FSDP2's `fully_shard` per block: parameters sharded on a 1-D mesh, gathered for one block's forward
and again for its recomputation in the backward) and returns views of the full tensors. 0-dim tensors
(`norm.eps`) are kept whole on every rank.

The endpoints are frozen, so nothing flows back through the gather; the group parameters are outside
the sharding, replicated, and their gradients summed by `distributed.Group.sync` like data-parallel
ones (FSDP would not synchronise parameters it does not own). Every rank must ask for the same parts in
the same order: the forward, the checkpointed recomputation in the backward and the validation curve
do, since every rank runs the same steps on the same model (only the rows differ).

Invariant: `part(key)` equals `Frozen.part(key)` bit for bit (a gather moves bytes), so a sharded run
takes exactly the data-parallel run's steps (tests/test_distributed.py). Memory per rank: 1/N of the
endpoints plus the parts in flight; time: one all-gather per part and pass.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import distributed
from ..model import part_keys
from .blockwise import Frozen, reader_of


def frozen(source, device=None, transform=None):
    """An endpoint's frozen store, nothing read yet (`read(keys)`, `blockwise.fill`): `Sharded` over the
    ranks when the run shards its endpoints (`align --shard-endpoints` under torchrun), else
    `blockwise.Frozen` (whole on every rank)."""
    group = distributed.current()
    if group.world > 1 and group.shard:
        return Sharded(source, group, device, transform, keys=())
    return Frozen(source, device, transform, keys=())


class Sharded:
    """One endpoint's frozen tensors split over the ranks of `group` (see the module docstring)."""

    def __init__(self, source, group, device=None, transform=None, dtype=None, keys=None):
        self.shape, self.spec, self.group = source.shape, source.spec, group
        self.dtype = dtype or source.dtype
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.reader = reader_of(source, self.dtype)
        self.transform = transform
        self.shards, self.layouts, self.scalars = {}, {}, {}
        self.read(part_keys(self.shape) if keys is None else keys)

    def read(self, keys) -> None:
        group = self.group
        for key in keys:
            part = self.reader.part(key)
            if self.transform is not None:
                part = self.transform(part)
            self.scalars[key] = {k: v.detach().to(torch.float64) for k, v in part.items() if v.dim() == 0}
            tensors = {k: v.detach() for k, v in part.items() if v.dim() > 0}
            self.layouts[key] = [(k, v.shape) for k, v in tensors.items()]
            flat = torch.cat([v.reshape(-1).to(self.dtype) for v in tensors.values()])
            flat = F.pad(flat, (0, (-flat.numel()) % group.world))
            n = flat.numel() // group.world
            self.shards[key] = flat[group.rank * n:(group.rank + 1) * n].clone().to(self.device)
            del part, tensors, flat

    def part(self, key) -> dict[str, torch.Tensor]:
        shard = self.shards[key]
        full = torch.empty(shard.numel() * self.group.world, dtype=shard.dtype, device=self.group.device)
        local = shard.to(self.group.device)
        self.group.collective(f"the all-gather of part {key}", lambda: dist.all_gather_into_tensor(full, local))
        full = full.to(self.device)
        out, at = {}, 0
        for k, shape in self.layouts[key]:
            n = shape.numel()
            out[k] = full[at:at + n].view(shape)
            at += n
        out.update(self.scalars[key])
        return out

    def params(self) -> dict[str, torch.Tensor]:
        """Every part whole (gathered; for checks)."""
        return {k: v for key in self.shards for k, v in self.part(key).items()}

    def nbytes(self) -> int:
        """The bytes this rank keeps."""
        return sum(s.numel() * s.element_size() for s in self.shards.values())
