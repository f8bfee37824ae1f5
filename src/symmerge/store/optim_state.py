"""An optimiser's per-parameter state as named tensors, and back: the one saver of Adam's moments and step
counts, for `symmerge train` and for learned matching's checkpoints.

`optimizer_tensors(opt, names, prefix)` holds, for the i-th parameter over all parameter groups in order,
each state entry k as `{prefix}{names[i]}.{k}`; `restore_optimizer` puts exactly those entries back (a
parameter with no saved entries keeps an empty state, as before its first step). The round trip is exact:
entries come back as copies on their parameter's device, floating moments in its dtype (a checkpoint written
on one device resumes on another), and `step` as it was saved, as `Optimizer.load_state_dict` places them.
It does not carry the groups' hyperparameters (learning rates, betas), which their owners save and restore
themselves. A name must not end in an entry's name after a dot of its own.
"""

from __future__ import annotations

import torch


def _named(opt: torch.optim.Optimizer, names: list[str]) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) over all parameter groups in order; one name per parameter."""
    params = [p for group in opt.param_groups for p in group["params"]]
    if len(names) != len(params):
        raise ValueError(f"{len(names)} names for {len(params)} parameters")
    return list(zip(names, params))


def optimizer_tensors(opt: torch.optim.Optimizer, names: list[str], prefix: str = "") -> dict[str, torch.Tensor]:
    """The optimiser's state under `{prefix}{name}.{entry}`, one name per parameter in group order."""
    return {f"{prefix}{name}.{k}": v for name, p in _named(opt, names) for k, v in opt.state.get(p, {}).items()}


def restore_optimizer(opt: torch.optim.Optimizer, names: list[str], tensors: dict[str, torch.Tensor],
                      prefix: str = "") -> None:
    """Put back the state `optimizer_tensors` wrote (entries of other prefixes in `tensors` are ignored)."""
    for name, p in _named(opt, names):
        head = f"{prefix}{name}."
        state = {k[len(head):]: _placed(k[len(head):], v, p) for k, v in tensors.items()
                 if k.startswith(head) and "." not in k[len(head):]}
        if state:
            opt.state[p] = state


def _placed(entry: str, value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    if entry == "step":
        return value.clone()
    dtype = param.dtype if value.is_floating_point() and param.is_floating_point() else value.dtype
    return value.to(device=param.device, dtype=dtype, copy=True)
