"""Human- and machine-readable descriptions of models and results."""

from __future__ import annotations

import math

from .model import LazyModel


def describe(model: LazyModel) -> dict:
    """What `symmerge inspect` prints: shape, groups by family, dimensions, parameter count.

    Reads only the checkpoint's headers (tensor shapes), never its weights."""
    n_params = sum(math.prod(shape) for shape in model.ckpt.shapes().values())
    families = []
    for fam in model.spec.families():
        members = [g for g in model.spec.groups.values() if g.family == fam]
        g0 = members[0]
        families.append({
            "family": fam, "kind": g0.kind, "size": g0.size,
            "copies": sum(math.prod(g.batch) for g in members),
            "dimension": sum(g.dimension for g in members),
            "constraints": list(g0.constraints), "note": g0.note,
            "groups": [g.name for g in members],
        })
    return {
        "path": str(model.path), "arch": model.shape.arch, "hf_class": model.shape.hf_class,
        "shape": model.shape.to_dict(), "parameters": n_params, "families": families,
        "group_dimension": sum(f["dimension"] for f in families), "notes": model.spec.notes + _subgroup_notes(model),
        "dtype": str(model.dtype).replace("torch.", ""),
    }


def _subgroup_notes(model: LazyModel) -> list[str]:
    """The selectable subgroups that are not families of their own in the spec."""
    if "residual.rotation" not in model.spec.groups:
        return []
    return ["--groups residual_perm (instead of residual_rotation) restricts the residual rotation to permutation "
            "matrices: permutation-only matching"]
