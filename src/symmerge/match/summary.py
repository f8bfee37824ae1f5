"""What an alignment found, group by group: for the JSON report of `symmerge align`."""

from __future__ import annotations

import math

import torch

from ..spec import Spec


def describe_element(kind: str, x: torch.Tensor, n: int) -> dict:
    """A few numbers that say how far one group's element is from the identity."""
    if kind == "permutation":
        return {"moved": int((x != torch.arange(n)).sum())}
    if kind == "scalar":
        return {"value": float(x)}
    if kind == "diagonal":
        return {"min_abs": float(x.abs().min()), "max_abs": float(x.abs().max()), "negative": int((x < 0).sum())}
    if kind == "orthogonal":
        angles = torch.linalg.eigvals(x).angle().abs() * (180 / math.pi)
        return {"max_angle_deg": float(angles.max()), "mean_angle_deg": float(angles.mean()),
                "distance_from_identity": float(torch.linalg.matrix_norm(x - torch.eye(n, dtype=x.dtype)).max())}
    svals = torch.linalg.svdvals(x)  # invertible, batched [*batch, n]
    dist = torch.linalg.matrix_norm(x - torch.eye(n, dtype=x.dtype)) / math.sqrt(n)
    return {"max_condition": float((svals[..., 0] / svals[..., -1]).max()),
            "max_relative_distance_from_identity": float(dist.max())}


def summarize(spec: Spec, g: dict[str, torch.Tensor], chosen: list[str]) -> dict:
    """Per group and per family: e.g. FFN units and heads moved, the angles of the residual rotation."""
    per_group = {n: describe_element(spec.groups[n].kind, g[n], spec.groups[n].size) for n in chosen}
    families: dict[str, dict] = {}
    for n in chosen:
        grp = spec.groups[n]
        fam = families.setdefault(grp.family, {"groups": 0})
        fam["groups"] += 1
        if grp.kind == "permutation":
            key = "query_heads_moved" if grp.indexed_by else {"head_perm": "heads_moved"}.get(grp.family, "units_moved")
            fam[key] = fam.get(key, 0) + per_group[n]["moved"]
        elif grp.kind == "orthogonal":
            fam["max_angle_deg"] = max(fam.get("max_angle_deg", 0.0), per_group[n]["max_angle_deg"])
    return {"families": families, "groups": per_group}
