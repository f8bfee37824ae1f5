"""What an alignment found, group by group: for the JSON report of `symmerge align`."""

from __future__ import annotations

import torch

from ..algebra.spec import Spec


def describe_element(group, x: torch.Tensor) -> dict:
    """A few numbers that say how far one group's element is from the identity (its kind says which)."""
    return group.structure.describe(x, group.size)


def summarize(spec: Spec, g: dict[str, torch.Tensor], chosen: list[str]) -> dict:
    """Per group and per family: e.g. FFN units and heads moved, the angles of the residual rotation."""
    per_group = {n: describe_element(spec.groups[n], g[n]) for n in chosen}
    families: dict[str, dict] = {}
    for n in chosen:
        grp = spec.groups[n]
        fam = families.setdefault(grp.family, {"groups": 0})
        fam["groups"] += 1
        if "moved" in per_group[n]:  # permutations
            key = (("query_heads_moved" if grp.indexed_by else "heads_moved") if spec.is_head_permutation(n)
                   else "experts_moved" if spec.is_expert_permutation(n) else "units_moved")
            fam[key] = fam.get(key, 0) + per_group[n]["moved"]
        elif "max_angle_deg" in per_group[n]:  # orthogonal maps
            fam["max_angle_deg"] = max(fam.get("max_angle_deg", 0.0), per_group[n]["max_angle_deg"])
    return {"families": families, "groups": per_group}
