"""Checkpoints of a learned-matching run: `state.safetensors` (tensors) + `state.json` (everything else).

No pickles. The tensors are the trainable group parameters, the fixed ones (sign matrices), the best
parameters seen so far, the Adam moments and step counts and the base elements the run started from;
the JSON holds the step, the early-stopping bookkeeping, the history and the settings that must not
change on resume. Randomness is derived from (seed, step), so no generator state is needed: a resumed
run takes the same batches and the same lambdas as an uninterrupted one, bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import SymmergeError
from ..runtime import distributed
from ..runtime.atomic import write_file

FORMAT = 1
TENSORS, META, PLAN = "state.safetensors", "state.json", "plan.json"


def save_state(folder, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Write both files atomically (`atomic.write_file`; the JSON last marks completion). The tensors are written
    from where they lie (`unshared`): a save costs no copy of the run's state (parameters, best state and Adam
    moments: four times the learned parameters), only of a tensor that shares memory with another."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    blob = unshared(tensors)
    write_file(folder / TENSORS, lambda tmp: save_file(blob, str(tmp)))
    write_file(folder / META, lambda tmp: tmp.write_text(json.dumps({"format": FORMAT, **meta}, indent=1)))


def unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` detached and contiguous (a copy only where a tensor is not), each a storage of its own as
    safetensors asks: a tensor whose storage an earlier one holds is copied (the first keeps it)."""
    out, seen = {}, set()
    for k, v in tensors.items():
        v = v.detach().contiguous()
        ptr = v.untyped_storage().data_ptr()
        if v.numel() and ptr in seen:
            v = v.clone()
        seen.add(v.untyped_storage().data_ptr())
        out[k] = v
    return out


def has_state(folder) -> bool:
    """Whether `folder` holds a checkpoint (its tensors and its JSON). A run stopped after its plan was saved
    and before its first checkpoint leaves the folder without one."""
    folder = Path(folder)
    return (folder / META).is_file() and (folder / TENSORS).is_file()


def no_checkpoint(folder) -> SymmergeError:
    """The error of a resume that finds no checkpoint in `folder`."""
    return SymmergeError(f"no learned-matching checkpoint in {folder}; run without --resume to start one")


def resume_point(folder, resume: bool) -> tuple[dict | None, bool]:
    """(the plan a run asked to `resume` saved in `folder`, or None; whether it continues a checkpoint there), the
    same answer on every process. A folder left by a run stopped before its first checkpoint (its plan alone)
    holds none: that run starts again from step 0 with the saved plan, which is the uninterrupted run (batches
    and λ draws depend on (seed, step) alone); so does every process when one of them finds no checkpoint in its
    folder. A folder that does not exist is refused on every process (`outputs.open_checkpoint` refuses it
    before any work)."""
    if not resume:
        return None, False
    group = distributed.current()

    def exists():
        if folder is None:
            raise SymmergeError("--resume needs a checkpoint folder")
        if not Path(folder).is_dir():
            raise no_checkpoint(folder)

    group.agree(exists)
    plan = load_plan(folder)
    if all(bool(t["found"]) for t in group.gather({"found": torch.tensor(has_state(folder))})):
        return plan, True
    if group.main:
        print(f"{folder} holds no checkpoint yet (its run stopped before the first): starting from step 0"
              f"{'' if plan is None else ' with its saved plan'}", flush=True)
    return plan, False


def load_state(folder) -> tuple[dict[str, torch.Tensor], dict]:
    folder = Path(folder)
    if not has_state(folder):
        raise no_checkpoint(folder)
    meta = json.loads((folder / META).read_text())
    if meta.get("format") != FORMAT:
        raise SymmergeError(f"{folder} holds a checkpoint of format {meta.get('format')}, expected {FORMAT}")
    return load_file(folder / TENSORS), meta


def check_settings(saved: dict, current: dict, folder) -> None:
    """Resuming with other settings would not continue the same run: refuse and name the difference."""
    keys = list(current) + [k for k in saved if k not in current]  # a setting only one side names differs too
    diff = {k: (saved.get(k), current.get(k)) for k in keys if saved.get(k) != current.get(k)}
    if diff:
        k, (old, new) = next(iter(diff.items()))
        raise SymmergeError(f"the checkpoint in {folder} was made with {k}={old!r}, not {new!r}; "
                            "resume with the same settings or start a new run")


def save_plan(folder, plan: dict) -> None:
    """The run's plan (`learn_plan.make_plan`: steps, validation size, the learning rate and its search),
    written before the first step so that a resumed run reuses it instead of searching again."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_file(folder / PLAN, lambda tmp: tmp.write_text(json.dumps(plan, indent=1)))


def load_plan(folder) -> dict | None:
    """The plan saved in `folder`, or None (a checkpoint from before plans were saved)."""
    p = Path(folder) / PLAN
    return json.loads(p.read_text()) if p.is_file() else None
