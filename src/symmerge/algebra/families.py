"""The vocabulary of the symmetry specification (`spec.py`): the families `--groups` selects, the names of the
residual groups, and `Action`, one group acting on one axis of one canonical tensor.

It imports nothing of the package, so that the spec and its parts (`spec_experts.py`) share it without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

# The families: what `--groups` selects. These constants are the one place their names are written;
# code outside the spec and the adapters asks the spec's role queries (`Spec.layer_roles`, ...).
RESIDUAL_ROTATION = "residual_rotation"
#: the residual rotation restricted to permutation matrices: the residual group of permutation-only matching
#: (the "permutations only" rows of Theus et al. 2025); selecting it restricts the spec (`Spec.restricted`)
RESIDUAL_PERM = "residual_perm"
RESIDUAL_SCALE = "residual_scale"
HEAD_PERM, QK_MAP, OV_MAP = "head_perm", "qk_map", "ov_map"
FFN_PERM, GLU_SCALE = "ffn_perm", "glu_scale"
#: mixtures of experts: the permutation of a layer's experts, together with the router's rows (`spec_experts.py`)
EXPERT_PERM = "expert_perm"
FAMILIES = (RESIDUAL_ROTATION, RESIDUAL_PERM, RESIDUAL_SCALE, HEAD_PERM, QK_MAP, OV_MAP, FFN_PERM, GLU_SCALE, EXPERT_PERM)
#: a layer's head circuit: the head permutations (KV groups, query heads inside them) and the per-head QK
#: and OV maps they re-index. The maps are only defined relative to a matching of heads, so weight matching
#: solves the circuit as one step, heads first (`match/weight_steps.py`).
HEAD_CIRCUIT = (HEAD_PERM, QK_MAP, OV_MAP)
#: the names of the residual groups (the residual rotation keeps its name when restricted to permutations)
ROTATION, SCALE = "residual.rotation", "residual.scale"


@dataclass(frozen=True)
class Action:
    group: str
    axis: int
    how: str = "g"  # "g" | "inv_t" | "sq" | "abs"
    batch_axes: tuple[int, ...] = ()
