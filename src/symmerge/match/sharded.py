"""Sharded endpoints for learned / dual matching under torchrun, on PyTorch's FSDP2
(`torch.distributed.fsdp.fully_shard`): each rank keeps 1/N of every part of the frozen endpoints.

`Sharded` stands in for `frozen.Frozen` (same `part(key)`, `read(keys)`, `nbytes()`): at construction
every rank reads each part (embeddings, one block, final norm and head; `parts.part_keys`) one at a time,
moves it by the fixed element if asked (dual: the absorbed weight-matching solution), and hands its
tensors, in the kept dtype, to `fully_shard` as the frozen parameters of one module (`_Part`) over the
run's device mesh (`distributed.Group.mesh`: 1-D over every process, or replicate x shard with
`--shard-endpoints K`). FSDP2 keeps this rank's slice of each tensor (a `DTensor`, on the axis the mesh's
shard size divides, the largest such, else axis 0 padded) and frees the rest. `part(key)` all-gathers that
one module (`FSDPModule.unshard`), copies its tensors out, reshards it, and starts the all-gather of the
part the forward will ask for next (`unshard(async_op=True)`: block i+1 in the forward, i-1 in the
backward's recomputation, block 0 after the embeddings), so a block's gather overlaps the previous block's
compute. The blockwise forward asks for one block in its forward and again in its recomputation (the
checkpointed backward), so a block is gathered twice a step, as FSDP2 gathers a block with
`reshard_after_forward`. 0-dim tensors (`norm.eps`) are kept whole on every rank, in float64.

The copy out is what FSDP2's resharding cannot do: it frees the gathered storage whatever still refers to
it, and autograd may keep a part's tensors past the next part (the ends' materialisation, a block's weights
with recompute="weights"); the copies live as long as something refers to them, as `Frozen`'s tensors do.

The endpoints are frozen, so nothing flows back through the gather and FSDP2's backward machinery (its
reduce-scatter) never runs; the group parameters are outside the sharding, replicated, and their gradients
summed by `distributed.Group.sync` like data-parallel ones. Every rank must ask for the same parts in the
same order (the all-gathers are collectives, and so are the prefetches decided from that order): the
forward, the recomputation and the validation curve do, since every rank runs the same steps on the same
model (only the rows differ).

Invariant: `part(key)` equals `Frozen.part(key)` bit for bit (a gather moves bytes), so a sharded run
takes exactly the data-parallel run's steps (tests/test_distributed.py, tests/test_fsdp.py). Memory per
rank: 1/K of the endpoints (K the shard size; padding: under one row of a tensor per rank) plus the parts
in flight (the one in use, its copy, the one prefetched).
"""

from __future__ import annotations

import torch
from torch import nn

from ..runtime import distributed
from ..store.parts import Parts, part_keys
from .frozen import Frozen, reader_of
from .heap import large_frees_to_the_os


def frozen(source, device=None, transform=None):
    """An endpoint's frozen store, nothing read yet (`read(keys)`, `frozen.fill`): `Sharded` over the
    ranks when the run shards its endpoints (`align --shard-endpoints` under torchrun), else
    `frozen.Frozen` (whole on every rank)."""
    group = distributed.current()
    if group.world > 1 and group.shard:
        return Sharded(source, group, device, transform, keys=())
    return Frozen(source, device, transform, keys=())


class _Part(nn.Module):
    """One part's tensors as frozen parameters: the module FSDP2 shards."""

    def __init__(self, tensors: list[torch.Tensor]):
        super().__init__()
        self.tensors = nn.ParameterList([nn.Parameter(t, requires_grad=False) for t in tensors])


def _placement(size: int):
    """FSDP2's placement of a tensor over `size` shards: its largest axis that `size` divides (FSDP2 pads
    axis 0 only), else axis 0, padded."""
    from torch.distributed.tensor import Shard

    def place(p: torch.Tensor):
        axes = [i for i in range(p.dim()) if i == 0 or p.shape[i] % size == 0]
        return Shard(max(axes, key=lambda i: (p.shape[i], -i)))

    return place


class Sharded(Parts):
    """One endpoint's frozen tensors sharded over the ranks of `group` by FSDP2 (see the module docstring)."""

    collective = True

    def __init__(self, source, group, device=None, transform=None, dtype=None, keys=None):
        large_frees_to_the_os()  # each part's whole transient, freed once sharded, must not stay resident
        self.shape, self.spec, self.group = source.shape, source.spec, group
        self.dtype = dtype or source.dtype
        self.device = group.device if device is None else torch.device(device)
        self.reader = reader_of(source, self.dtype)
        self.transform = transform
        self.modules, self.names, self.scalar = {}, {}, {}
        self.pending: dict = {}  # key -> the handle of its prefetched all-gather
        self.last = None  # the part asked for last (the direction of the next prefetch)
        self.prefetched = 0  # parts served by a prefetch (for checks)
        self.read(part_keys(self.shape) if keys is None else keys)

    def read(self, keys) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.group.mesh()
        for key in keys:
            part = self.reader.part(key)
            if self.transform is not None:
                part = self.transform(part)
            self.scalar[key] = {k: v.detach().to(torch.float64) for k, v in part.items() if v.dim() == 0}
            tensors = {k: v.detach().to(self.dtype).contiguous() for k, v in part.items() if v.dim() > 0}
            del part
            self.names[key] = list(tensors)
            module = _Part(list(tensors.values()))
            del tensors  # FSDP2 keeps this rank's slices; the whole tensors go with the last reference
            self.modules[key] = fully_shard(module, mesh=mesh, shard_placement_fn=_placement(mesh.size(-1)))

    def part(self, key) -> dict[str, torch.Tensor]:
        module = self.modules[key]
        handle = self.pending.pop(key, None)
        if handle is None:
            self.group.collective(f"the all-gather of part {key}", module.unshard)
        else:
            self.group.collective(f"the prefetched all-gather of part {key}", handle.wait)
            self.prefetched += 1
        out = {k: p.detach().to(self.device, copy=True) for k, p in zip(self.names[key], module.tensors)}
        module.reshard()
        self._prefetch(key)
        out.update(self.scalar[key])
        return out

    def _prefetch(self, key) -> None:
        """Start the all-gather of the block after `key` in the direction the parts are being asked for."""
        last, self.last = self.last, key
        if key == "embed":
            nxt = 0
        elif isinstance(key, int):
            backward = last == "final" or last == key + 1
            nxt = key - 1 if backward else key + 1
        else:
            return
        if 0 <= nxt < self.shape.n_layers and nxt not in self.pending and nxt in self.modules:
            module = self.modules[nxt]
            self.group.collective(f"the prefetch of part {nxt}",
                                  lambda: self.pending.__setitem__(nxt, module.unshard(async_op=True)))

    def scalars(self, key) -> dict[str, torch.Tensor]:
        """The 0-dim tensors (`norm.eps`) of part `key`, kept whole on every rank: nothing is gathered."""
        return dict(self.scalar[key])

    def params(self) -> dict[str, torch.Tensor]:
        """Every part whole (gathered; for checks)."""
        return {k: v for key in self.modules for k, v in self.part(key).items()}

    def nbytes(self) -> int:
        """The bytes this rank keeps: its slices (with FSDP2's padding) and the scalars."""
        storages = {}
        for module in self.modules.values():
            for p in module.parameters():
                s = p.to_local().untyped_storage()
                storages[s.data_ptr()] = s.nbytes()
        return sum(storages.values()) + sum(8 * len(s) for s in self.scalar.values())
