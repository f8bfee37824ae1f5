"""The symmetry specification: which groups a model has and how each acts on each canonical tensor.

Built from a `ModelShape` alone. Canonical tensors (see `canonical.py`) name the residual axis, the
head axes and the hidden axis explicitly, so an action is just (group, tensor axis, how):

- how = "g":     the axis is transformed by the element `G` (writers, and the side of a head-internal
                 or hidden-unit map that produces the intermediate vector);
- how = "inv_t": by `G^{-T}` (readers, and the side that consumes the intermediate vector), so that
                 every product reader·writer is unchanged: `(W G^{-1})(G x) = W x`;
- how = "sq":    by `a^2` (the normalisation epsilon under the residual scale `a`).

Batched groups (one map per KV group) name the tensor axes that run along their batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from . import SymmergeError
from . import groups as G
from .rotary import LAYOUTS
from .shape import ModelShape

FAMILIES = ("residual_rotation", "residual_perm", "residual_scale", "head_perm", "qk_map", "ov_map", "ffn_perm",
            "glu_scale")
#: the residual rotation restricted to permutation matrices: the residual group of permutation-only matching
#: (the "permutations only" rows of Theus et al. 2025); selecting it restricts the spec (`Spec.restricted`)
RESIDUAL_PERM = "residual_perm"


@dataclass(frozen=True)
class Action:
    group: str
    axis: int
    how: str = "g"  # "g" | "inv_t" | "sq"
    batch_axes: tuple[int, ...] = ()


@dataclass
class Spec:
    shape: ModelShape
    groups: dict[str, G.Group]
    actions: dict[str, list[Action]]
    notes: list[str] = field(default_factory=list)

    def families(self) -> list[str]:
        return [f for f in FAMILIES if any(g.family == f for g in self.groups.values())]

    def default_families(self) -> list[str]:
        """The families matched when none are named (`align`, `demo`, learned matching, the benchmarks):
        every family but the residual scale.

        Weight matching's best scale for B's writers shrinks towards 0 when the two models' writers are
        weakly correlated (0.24 on the demo's ViT pair), and the shrunk endpoint raises the barrier
        (0.157 -> 0.396 there); learned, the scale lets the interpolation collapse onto one endpoint (the
        midpoint of A and c·B computes B's function as c grows, by scale invariance), which lowers the
        measured barrier without merging anything. Name it (`--groups all`) to undo a planted scale."""
        return [f for f in self.families() if f != "residual_scale"]

    def restricted(self, families: list[str] | None) -> Spec:
        """This spec, with the residual rotation restricted to permutation matrices when `families` names
        residual_perm. Permutations fix the all-ones vector, so LayerNorm models admit them too; the group
        keeps its name, so elements of the restricted spec act through the same actions."""
        rot = self.groups.get("residual.rotation")
        if not families or RESIDUAL_PERM not in families or rot is None or rot.family == RESIDUAL_PERM:
            return self
        if "residual_rotation" in families:
            raise SymmergeError("residual_perm is the residual rotation restricted to permutations: "
                                "choose residual_rotation or residual_perm, not both")
        perm = replace(rot, family=RESIDUAL_PERM, constraints=("permutation_matrix",),
                       note="the residual rotation restricted to permutation matrices (permutation-only matching)")
        return Spec(self.shape, {**self.groups, perm.name: perm}, self.actions, self.notes)

    def select(self, families: list[str] | None) -> list[str]:
        """Names of the groups in the given families (all when None); unknown families are an error."""
        if families is None:
            return list(self.groups)
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise SymmergeError(f"unknown group family {unknown}; choose from {', '.join(FAMILIES)}")
        spec = self.restricted(families)
        missing = [f for f in families if f not in spec.families()]
        if missing:
            raise SymmergeError(
                f"{self.shape.arch} has no {', '.join(missing)} symmetry; it has {', '.join(self.families())}"
            )
        return [n for n, g in spec.groups.items() if g.family in families]

    def application_order(self) -> list[str]:
        """Groups that re-index others (head and FFN permutations) act last."""
        outer = {g.indexed_by for g in self.groups.values() if g.indexed_by}
        return sorted(self.groups, key=lambda n: n in outer)


# --- building the specification ------------------------------------------------------------------


def _residual_groups(s: ModelShape, groups: dict, notes: list) -> None:
    fixes = ("fixes_ones",) if s.centred else ()
    why = (
        "LayerNorm centres its input: the stream is kept mean-free, so the rotation must fix the all-ones vector"
        if s.centred
        else "RMS normalisation commutes with every orthogonal map"
    )
    groups["residual.rotation"] = G.Group("residual.rotation", "residual_rotation", "orthogonal", s.d_model,
                                          constraints=fixes, note=why)
    if s.eps_in_config:
        groups["residual.scale"] = G.Group(
            "residual.scale", "residual_scale", "scalar", 1, constraints=("positive",),
            note="normalisation is scale invariant; exact because the config's eps becomes a^2 eps",
        )
    else:
        notes.append(f"{s.hf_class} hard-codes its normalisation eps, so the residual scale is not an exact symmetry")


def _block_groups(s: ModelShape, i: int, groups: dict) -> None:
    p = f"blocks.{i}"
    nkv, dh = s.n_kv_heads, s.d_head
    clip = ("signed_permutation",) if s.clip_qkv is not None else ()
    clip_note = " (clip_qkv clamps q, k, v elementwise: only signed permutations commute with it)" if clip else ""
    groups[f"{p}.heads"] = G.Group(f"{p}.heads", "head_perm", "permutation", nkv, layer=i,
                                   note="attention heads are summed" + (" (KV groups move as units)" if s.q_per_kv > 1 else ""))
    if s.q_per_kv > 1:
        groups[f"{p}.qheads"] = G.Group(f"{p}.qheads", "head_perm", "permutation", s.q_per_kv, batch=(nkv,), layer=i,
                                        indexed_by=f"{p}.heads", note="query heads sharing a KV head")
    rope = ("rope",) if s.rotary_dims else ()
    groups[f"{p}.qk"] = G.Group(
        f"{p}.qk", "qk_map", "invertible", dh, batch=(nkv,), constraints=rope + clip, layer=i,
        rotary_dims=s.rotary_dims, rotary_layout=s.rotary_layout, indexed_by=f"{p}.heads",
        note=("q k^T is unchanged; commutes with RoPE: scaled rotations on rotary pairs" if rope else "q k^T is unchanged")
        + (", full on the other dims" if rope and s.rotary_dims < dh else "")
        + (", shared by a GQA group" if s.q_per_kv > 1 else "") + clip_note,
    )
    groups[f"{p}.ov"] = G.Group(
        f"{p}.ov", "ov_map", "invertible", dh, batch=(nkv,), constraints=clip, layer=i, indexed_by=f"{p}.heads",
        note="values are mixed linearly" + (", shared by a GQA group" if s.q_per_kv > 1 else "") + clip_note,
    )
    groups[f"{p}.ffn"] = G.Group(f"{p}.ffn", "ffn_perm", "permutation", s.d_mlp, layer=i,
                                 note="the activation acts elementwise")
    if s.gated:
        groups[f"{p}.glu"] = G.Group(f"{p}.glu", "glu_scale", "diagonal", s.d_mlp, layer=i, indexed_by=f"{p}.ffn",
                                     note="act(gate) * up is linear in up")


def _residual_actions(s: ModelShape, axis: int, reader: bool, scaled: bool = True) -> list[Action]:
    if reader:
        return [Action("residual.rotation", axis, "inv_t")]
    acts = [Action("residual.rotation", axis, "g")]
    if scaled and s.eps_in_config:
        acts.append(Action("residual.scale", axis, "g"))
    return acts


def _block_actions(s: ModelShape, i: int) -> dict[str, list[Action]]:
    p = f"blocks.{i}"
    H, QH, QK, OV, FFN, GLU = (f"{p}.{x}" for x in ("heads", "qheads", "qk", "ov", "ffn", "glu"))
    qh = [Action(QH, 1, "g", (0,))] if s.q_per_kv > 1 else []
    glu = [Action(GLU, 0, "g")] if s.gated else []
    a = {
        # W_Q: [n_kv, q_per_kv, d_head, d_model]   b_Q: [n_kv, q_per_kv, d_head]
        f"{p}.attn.W_Q": _residual_actions(s, 3, True) + [Action(H, 0), Action(QK, 2, "g", (0,))] + qh,
        f"{p}.attn.b_Q": [Action(H, 0), Action(QK, 2, "g", (0,))] + qh,
        # W_K, W_V: [n_kv, d_head, d_model]   b_K, b_V: [n_kv, d_head]
        f"{p}.attn.W_K": _residual_actions(s, 2, True) + [Action(H, 0), Action(QK, 1, "inv_t", (0,))],
        f"{p}.attn.b_K": [Action(H, 0), Action(QK, 1, "inv_t", (0,))],
        f"{p}.attn.W_V": _residual_actions(s, 2, True) + [Action(H, 0), Action(OV, 1, "g", (0,))],
        f"{p}.attn.b_V": [Action(H, 0), Action(OV, 1, "g", (0,))],
        # W_O: [n_kv, q_per_kv, d_model, d_head]   b_O: [d_model]
        f"{p}.attn.W_O": _residual_actions(s, 2, False) + [Action(H, 0), Action(OV, 3, "inv_t", (0,))] + qh,
        f"{p}.attn.b_O": _residual_actions(s, 0, False),
        # W_in (up), W_gate: [d_mlp, d_model]   W_out (down): [d_model, d_mlp]
        f"{p}.mlp.W_in": _residual_actions(s, 1, True) + [Action(FFN, 0)] + glu,
        f"{p}.mlp.b_in": [Action(FFN, 0)] + glu,
        f"{p}.mlp.W_gate": _residual_actions(s, 1, True) + [Action(FFN, 0)],
        f"{p}.mlp.b_gate": [Action(FFN, 0)],
        f"{p}.mlp.W_out": _residual_actions(s, 0, False)
        + [Action(FFN, 1, "inv_t")]
        + ([Action(GLU, 1, "inv_t")] if s.gated else []),
        f"{p}.mlp.b_out": _residual_actions(s, 0, False),
    }
    return a


def _check_rotary(s: ModelShape) -> None:
    """Refuse a rotary layout without a pairing in `rotary.py`: QK maps built for the wrong pairs would not
    commute with the model's rotation, and every aligned or merged model would silently compute another function."""
    if s.rotary_dims and s.rotary_layout not in LAYOUTS:
        raise SymmergeError(
            f"{s.hf_class}: rotary layout {s.rotary_layout!r} is not implemented (symmerge pairs rotary dimensions "
            f"as {' or '.join(LAYOUTS)}); its QK maps would not commute with the model's RoPE"
        )


def build_spec(s: ModelShape) -> Spec:
    """The symmetry group of a model of shape `s` and its action on every canonical tensor."""
    _check_rotary(s)
    groups: dict[str, G.Group] = {}
    notes: list[str] = []
    _residual_groups(s, groups, notes)
    for i in range(s.n_layers):
        _block_groups(s, i, groups)
    if s.clip_qkv is not None:
        notes.append(f"clip_qkv={s.clip_qkv}: QK and OV maps restricted to signed permutations (quarter turns on rotary pairs)")
    if s.centred:
        notes.append("LayerNorm model: every writer is made mean-free and the rotation fixes the all-ones vector")
    if s.tied:
        notes.append("tied embeddings: folding the final norm unties the LM head (exported with tie_word_embeddings=false)")

    actions: dict[str, list[Action]] = {
        "embed.W_E": _residual_actions(s, 1, False),  # [vocab, d_model]: rows are residual vectors
        "embed.W_pos": _residual_actions(s, 1, False),  # [n_positions, d_model]
        "embed.W_patch": _residual_actions(s, 0, False),  # [d_model, channels, patch, patch]
        "embed.b_patch": _residual_actions(s, 0, False),  # [d_model]
        "embed.cls": _residual_actions(s, 0, False),  # [d_model]
        # the final norm's bias when the head has no bias to take it (GPT-2, GPT-NeoX): it is added
        # after normalisation, so it turns with the stream but ignores the scale
        "final.b_norm": _residual_actions(s, 0, False, scaled=False),
        "head.W_U": _residual_actions(s, 1, True),  # [vocab | classes, d_model]
        "head.b_U": [],
        "norm.eps": [Action("residual.scale", 0, "sq")] if s.eps_in_config else [],
    }
    for i in range(s.n_layers):
        actions.update(_block_actions(s, i))
    return Spec(s, groups, actions, notes)


# --- group elements: dicts {group name: tensor} over a whole spec -------------------------------------


def identity_element(spec: Spec) -> dict[str, torch.Tensor]:
    return {n: G.identity(g) for n, g in spec.groups.items()}


def random_element(spec: Spec, gen: torch.Generator, families: list[str] | None = None, spread: float = 2.0):
    """A random element of the selected families (identity elsewhere)."""
    spec = spec.restricted(families)
    chosen = set(spec.select(families))
    return {n: (G.random_element(g, gen, spread) if n in chosen else G.identity(g)) for n, g in spec.groups.items()}


def _reindex(spec: Spec, name: str, x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """`(P X P^{-1})`: entry i of the batch takes entry perm[i] (X is indexed by the permuted axis)."""
    group = spec.groups[name]
    dim = 0 if group.batch else x.dim() - 1  # a diagonal's own entries, else its batch axis
    return x.index_select(dim, perm)


def inverse(spec: Spec, g: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The element h with apply(h, apply(g, θ)) = θ.

    The action is θ -> P(C(θ)), with the permutations P acting after the maps C they re-index, so
    (P C)^{-1} = P^{-1} (P C^{-1} P^{-1}): each re-indexed map is inverted, then re-indexed by P.
    """
    out = {n: G.inverse(spec.groups[n], x) for n, x in g.items()}
    for n, grp in spec.groups.items():
        if grp.indexed_by and n in g:
            out[n] = _reindex(spec, n, out[n], g[grp.indexed_by])
    return out


def compose(spec: Spec, g2: dict, g1: dict) -> dict[str, torch.Tensor]:
    """First g1, then g2: P2 C2 P1 C1 = (P2 P1)((P1^{-1} C2 P1) C1)."""
    out = {}
    for n, grp in spec.groups.items():
        x2 = g2[n]
        if grp.indexed_by:
            x2 = _reindex(spec, n, x2, torch.argsort(g1[grp.indexed_by], dim=-1))
        out[n] = G.compose(grp, x2, g1[n])
    return out
