"""Human- and machine-readable descriptions of models and results, and the one JSON report schema.

Every command that writes a JSON report (`align --json`, `barrier --json`, `eval --json`,
`inspect --json`, `demo`'s demo-report.json) writes it through `dumps` / `write`: one JSON object,

    {"schema_version": 1, "command": "align", "symmerge_version": "0.x.y", ...payload}

with the command's own keys (its payload) at the top level after the three stamps, so that readers
of a key find it where it always was:

- align: method, a, b, out, groups_selected, objective_name, objective (similarity per iteration),
  iterations, seconds, steps, steps_without_improvement, the method's extras (restarted and
  seconds_by_step_kind; activation: fit) and the groups found (`match.summary.summarize`); learned /
  dual instead: method, steps, time_s, barrier_before, barrier_after, best_step, stopped_early,
  diverged, lambdas, losses_before, losses_after, parameterisation, fixed_groups, settings, history,
  outputs (input, output, max_logit_diff each) and weight_matching (objective, seconds);
- barrier: lambdas, loss, accuracy, barrier, barrier_lambda, accuracy_barrier and the rest of
  `barrier_pair.barrier`'s result, then a, b, data, split;
- eval: `evaluation.evaluate`'s figures (loss, loss_se, accuracy, accuracy_se, n_items, n_scored,
  n_batches, ...), then model, data, split;
- inspect: `describe` below;
- demo: data, arch, a, b, results (one row per method: method, label, max_endpoint_logit_change, the
  barrier curve, the method's figure, barrier_seconds, seconds).

Where the command read checkpoints by Hub id, the last key is `hub`: for each id its given spelling,
repo_id, revision, the commit it resolved to and the local snapshot folder (`hub.resolved`).

`schema_version` grows when a key changes its meaning or goes away; new keys do not bump it.
Checkpoints' own symmerge.json (training and alignment provenance, read back by `model.LazyModel`)
is metadata, not a report, and is not stamped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..algebra.spec import ROTATION
from ..errors import SymmergeError
from ..version import __version__
from .model import LazyModel

SCHEMA_VERSION = 1
STAMPS = ("schema_version", "command", "symmerge_version")


def stamped(command: str, payload: dict) -> dict:
    """The report of `command`: the schema's stamps, then the payload's keys unchanged."""
    clash = [k for k in STAMPS if k in payload]
    if clash:
        raise SymmergeError(f"the {command} report already has the schema's keys {clash}")
    from .hub import resolved

    hubs = {"hub": resolved()} if resolved() and "hub" not in payload else {}
    return {"schema_version": SCHEMA_VERSION, "command": command, "symmerge_version": __version__, **payload, **hubs}


def dumps(command: str, payload: dict) -> str:
    """The report as JSON text (indented; objects JSON does not know, such as paths, as strings)."""
    return json.dumps(stamped(command, payload), indent=2, default=str)


def write(path, command: str, payload: dict) -> None:
    """The report as JSON at `path`, complete or absent (`atomic.write_file`)."""
    from ..runtime.atomic import write_file

    text = dumps(command, payload) + "\n"
    write_file(path, lambda tmp: Path(tmp).write_text(text))


def describe(model: LazyModel) -> dict:
    """What `symmerge inspect` prints: shape, groups by family, dimensions, parameter count. A family whose groups
    differ in kind, size, constraints or reason (a mixture's experts and its shared expert or dense layers) gets one
    row per kind of group, in the spec's order.

    Reads only the checkpoint's headers (tensor shapes), never its weights."""
    n_params = sum(math.prod(shape) for shape in model.ckpt.shapes().values())
    families = []
    for fam in model.spec.families():
        rows: dict[tuple, list] = {}
        for g in model.spec.groups.values():
            if g.family == fam:
                rows.setdefault((g.kind, g.size, g.constraints, g.note), []).append(g)
        for (kind, size, constraints, note), members in rows.items():
            families.append({
                "family": fam, "kind": kind, "size": size,
                "copies": sum(math.prod(g.batch) for g in members),
                "dimension": sum(g.dimension for g in members),
                "constraints": list(constraints), "note": note,
                "groups": [g.name for g in members],
            })
    return {
        "path": str(model.path), "arch": model.shape.arch, "hf_class": model.shape.hf_class,
        "shape": model.shape.to_dict(), "parameters": n_params, "families": families,
        "group_dimension": sum(f["dimension"] for f in families), "notes": model.spec.notes + _subgroup_notes(model) + _nope_notes(model),
        "dtype": str(model.dtype).replace("torch.", ""),
    }


def _nope_notes(model: LazyModel) -> list[str]:
    """Where the spec's group is a proper subgroup of the exact one: layers without RoPE (`Adapter.nope_layers`)
    in a rotary model get the RoPE layers' QK group."""
    nope = model.adapter.nope_layers(model.config)
    if not nope or not model.shape.rotary_dims:
        return []
    # a QK-norm keeps only maps that preserve its RMS and its unmoved weights: generically a sign per dimension
    exact = "a sign per dimension (QK-norm)" if model.shape.qk_norm else "every invertible map of the head"
    which = f"layer {nope[0]} applies" if len(nope) == 1 else f"layers {', '.join(map(str, nope))} apply"
    return [f"{which} no RoPE: there the exact QK group is {exact}; symmerge uses the RoPE layers' QK group there "
            "too, a subgroup (every element keeps the function)"]


def _subgroup_notes(model: LazyModel) -> list[str]:
    """The selectable subgroups that are not families of their own in the spec."""
    if ROTATION not in model.spec.groups:
        return []
    return ["--groups residual_perm (instead of residual_rotation) restricts the residual rotation to permutation "
            "matrices: permutation-only matching"]
