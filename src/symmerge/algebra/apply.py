"""`apply(spec, g, params)`: act with a group element on canonical parameters. Pure: tensors in, tensors out."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..errors import SymmergeError
from . import groups as G
from .spec import Action, Spec


class StraightThrough(NamedTuple):
    """A straight-through permutation element (learned matching): it acts as the hard permutation
    `index`, and gradients go to `latent` as if the dense matrix `latent` had acted (d/dlatent of
    `latent @ x` is `dy x^T`)."""

    index: torch.Tensor  # [*batch, n] int64
    latent: torch.Tensor  # [*batch, n, n] floating, requires grad


class Prepared(NamedTuple):
    """An element of a continuous group with its inverse transpose worked out once (in float64, then cast
    to the dtype and device of the tensors it acts on): acting on many tensors then neither casts nor
    inverts per tensor, and the inverse is never taken in a dtype `torch.linalg` cannot invert in (bf16)."""

    g: torch.Tensor
    inv_t: torch.Tensor

    @classmethod
    def of(cls, group: G.Group, g: torch.Tensor, dtype: torch.dtype, device=None) -> Prepared:
        return cls(g.to(device=device, dtype=dtype), group.structure.inverse_transpose(g).to(device=device, dtype=dtype))


class _StraightThroughPermute(torch.autograd.Function):
    """Rows of `x` gathered by `index` (exact, no matmul); the backward is that of `latent @ x`
    with `latent` valued as the permutation matrix: d/dlatent = dy x^T, d/dx = P^T dy."""

    @staticmethod
    def forward(ctx, latent, index, x):
        ctx.save_for_backward(index, x)
        ctx.latent_dtype = latent.dtype
        return torch.gather(x, -2, index.unsqueeze(-1).expand(x.shape))

    @staticmethod
    def backward(ctx, dy):
        index, x = ctx.saved_tensors
        dlatent = (dy @ x.transpose(-1, -2)).to(ctx.latent_dtype) if ctx.needs_input_grad[0] else None
        dx = torch.gather(dy, -2, torch.argsort(index, -1).unsqueeze(-1).expand(dy.shape)) if ctx.needs_input_grad[2] else None
        return dlatent, None, dx


def act(group: G.Group, g: torch.Tensor, t: torch.Tensor, action: Action) -> torch.Tensor:
    """Transform one axis of `t` by `g` (or `g^{-T}`, or `g^2`) as the action says (`g` may be `Prepared`)."""
    if isinstance(g, Prepared):
        g, inv_t = g
    else:
        inv_t = None
    if action.how == "sq":
        return t * g.to(t.dtype) ** 2
    kind = group.structure
    if action.how == "abs":  # |G| entrywise: a signed permutation's permutation (a permutation is its own)
        m = g if isinstance(g, StraightThrough) else g.abs()
    else:
        m = g if action.how == "g" else (kind.inverse_transpose(g) if inv_t is None else inv_t)
    if not kind.acts_on_axis:  # a scalar scales the whole tensor
        return kind.act_leading(m, t, 0)
    lead = (*action.batch_axes, action.axis)
    x = torch.movedim(t, lead, tuple(range(len(lead))))  # (*batch, n, *rest)
    nb = len(action.batch_axes)
    if tuple(x.shape[: nb + 1]) != (*group.batch, group.size):
        raise SymmergeError(
            f"group {group.name} of size {group.size} and batch {group.batch} cannot act on axes {lead} "
            f"of a tensor of shape {tuple(t.shape)}"
        )
    if kind.matrix and not isinstance(m, StraightThrough) and action.batch_axes == tuple(range(nb)):
        return kind.act_in_place(m, t, nb, action.axis)  # no copy of t, the result in t's layout
    if isinstance(m, StraightThrough):
        flat = x.reshape(*x.shape[: nb + 1], -1)
        y = _StraightThroughPermute.apply(m.latent, m.index, flat).reshape(x.shape)
    else:
        y = kind.act_leading(m, x, nb)
    return torch.movedim(y, tuple(range(len(lead))), lead)


def apply(spec: Spec, g: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Return g·θ. Groups missing from `g` act as the identity; every tensor must be in the spec."""
    unknown = [k for k in params if k not in spec.actions]
    if unknown:
        raise SymmergeError(f"canonical tensors {unknown[:3]} have no entry in the {spec.shape.arch} symmetry spec")
    order = {n: i for i, n in enumerate(spec.application_order())}
    out = {}
    for name, t in params.items():
        for a in sorted(spec.actions[name], key=lambda a: order[a.group]):
            if a.group in g:
                t = act(spec.groups[a.group], g[a.group], t, a)
        out[name] = t
    return out
