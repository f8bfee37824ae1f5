"""The symmetry specification: which groups a model has and how each acts on each canonical tensor.

Built from a `ModelShape` alone. Canonical tensors (see `canonical.py`) name the residual axis, the
head axes and the hidden axis explicitly, so an action is just (group, tensor axis, how):

- how = "g":     the axis is transformed by the element `G` (writers, and the side of a head-internal
                 or hidden-unit map that produces the intermediate vector);
- how = "inv_t": by `G^{-T}` (readers, and the side that consumes the intermediate vector), so that
                 every product reader·writer is unchanged: `(W G^{-1})(G x) = W x`;
- how = "sq":    by `a^2` (the normalisation epsilon under the residual scale `a`);
- how = "abs":   by `|G|` entrywise (a post-norm's weights under a signed permutation `P S` of the
                 residual: `P S (γ ⊙ z) = (P γ) ⊙ (P S z)`, the signs pass through the weights).

Batched groups (one map per KV group) name the tensor axes that run along their batch.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field, replace

from ..errors import SymmergeError
from . import groups as G
from .families import (  # noqa: F401 (the spec's vocabulary, read through this module)
    EXPERT_PERM,
    FAMILIES,
    FFN_PERM,
    GLU_SCALE,
    HEAD_CIRCUIT,
    HEAD_PERM,
    OV_MAP,
    QK_MAP,
    RESIDUAL_PERM,
    RESIDUAL_ROTATION,
    RESIDUAL_SCALE,
    ROTATION,
    SCALE,
    Action,
)
from .rotary import LAYOUTS
from .shape import ModelShape


@dataclass(frozen=True)
class LayerRoles:
    """The names of one block's groups by the role each plays; None where the model has no such group.

    heads:       the head permutation: KV groups (every head, without GQA) move as units;
    query_heads: the permutation of the query heads inside each KV group (GQA only), indexed by `heads`;
    qk:          the per-head QK map (queries by G, keys by G^{-T}), indexed by `heads`;
    ov:          the per-head OV map (values by G, the output projection by G^{-T}), indexed by `heads`;
    ffn:         the permutation of the FFN hidden units (one per expert in a mixture of experts, indexed by `experts`);
    glu:         the GLU scale of the hidden units (gated MLPs only), indexed by `ffn`;
    experts:     the permutation of a mixture of experts' experts and the router's rows;
    shared:      the permutation of a mixture's shared expert's hidden units (Qwen2-MoE);
    shared_glu:  the GLU scale of the shared expert's hidden units, indexed by `shared`.

    The names are the spec's whether or not a selection chose the groups (`Spec.select` says which were)."""

    heads: str | None = None
    query_heads: str | None = None
    qk: str | None = None
    ov: str | None = None
    ffn: str | None = None
    glu: str | None = None
    experts: str | None = None
    shared: str | None = None
    shared_glu: str | None = None

    @property
    def head_maps(self) -> tuple[str, ...]:
        """The head-internal maps the layer has, QK before OV."""
        return tuple(n for n in (self.qk, self.ov) if n is not None)

    @property
    def head_permutations(self) -> tuple[str, ...]:
        """The layer's head permutations: `heads`, then `query_heads` when the model has GQA."""
        return tuple(n for n in (self.heads, self.query_heads) if n is not None)


def _layer_names(i: int) -> LayerRoles:
    """The names the builder gives block i's groups, by role (the one place they are spelt)."""
    p = f"blocks.{i}"
    return LayerRoles(f"{p}.heads", f"{p}.qheads", f"{p}.qk", f"{p}.ov", f"{p}.ffn", f"{p}.glu", f"{p}.experts",
                      f"{p}.shared", f"{p}.shared_glu")


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
        weakly correlated, and the shrunk endpoint raises the barrier; learned, the scale
        lets the interpolation collapse onto one endpoint (the midpoint of A and c·B computes B's
        function as c grows, by scale invariance), which lowers the measured barrier without merging
        anything. Name it (`--groups all`) to undo a planted scale in `align`; `merge` undoes one without it,
        by bringing the models to one eps first (`match.many.scale_gauge`)."""
        return [f for f in self.families() if f != RESIDUAL_SCALE]

    # --- role queries: what a group is for, asked instead of testing family names -----------------------

    def layer_roles(self, i: int) -> LayerRoles:
        """Block i's groups by role (see `LayerRoles`); roles the model lacks are None."""
        return LayerRoles(*(n if n in self.groups else None for n in astuple(_layer_names(i))))

    def is_residual_scale(self, name: str) -> bool:
        """Whether group `name` is the residual scale: one positive number multiplying every writer of the
        stream (and the normalisation eps by its square), invisible to every normalised activation."""
        return self.groups[name].family == RESIDUAL_SCALE

    def residual_scales(self, names) -> list[str]:
        """The residual-scale groups among the group names `names`, in their order (empty when none)."""
        return [n for n in names if self.is_residual_scale(n)]

    def includes_residual_scale(self, names) -> bool:
        """Whether a selection (group names, e.g. `select`'s) includes the residual scale."""
        return bool(self.residual_scales(n for n in names if n in self.groups))

    def in_head_circuit(self, name: str) -> bool:
        """Whether group `name` belongs to its layer's head circuit (`HEAD_CIRCUIT`): a head permutation or a
        per-head QK or OV map."""
        return self.groups[name].family in HEAD_CIRCUIT

    def is_head_permutation(self, name: str) -> bool:
        """Whether group `name` permutes attention heads: a layer's KV groups or the query heads inside them."""
        return self.groups[name].family == HEAD_PERM

    def is_expert_permutation(self, name: str) -> bool:
        """Whether group `name` relabels a mixture of experts' experts (with the router's rows)."""
        return self.groups[name].family == EXPERT_PERM

    def restricted(self, families: list[str] | None) -> Spec:
        """This spec, with the residual rotation restricted to permutation matrices when `families` names
        residual_perm. Permutations fix the all-ones vector, so LayerNorm models admit them too; the group
        keeps its name, so elements of the restricted spec act through the same actions."""
        rot = self.groups.get(ROTATION)
        if not families or RESIDUAL_PERM not in families or rot is None or rot.family == RESIDUAL_PERM:
            return self
        if RESIDUAL_ROTATION in families:
            raise SymmergeError(f"{RESIDUAL_PERM} is the residual rotation restricted to permutations: "
                                f"choose {RESIDUAL_ROTATION} or {RESIDUAL_PERM}, not both")
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
        """Groups that re-index others (head and FFN permutations) act after them: by height, the length of
        the longest chain of groups a group re-index (a GLU scale 0, the FFN permutation 1, in a mixture of
        experts the expert permutation 2), so that each acts on what it re-indexes already moved."""
        height: dict[str, int] = {}
        for n in self.groups:  # walk up each chain of re-indexing from n
            k, h = self.groups[n].indexed_by, 1
            while k is not None:
                height[k] = max(height.get(k, 0), h)
                k, h = self.groups[k].indexed_by, h + 1
        return sorted(self.groups, key=lambda n: height.get(n, 0))


# --- building the specification ------------------------------------------------------------------


def _residual_groups(s: ModelShape, groups: dict, notes: list) -> None:
    fixes = ("fixes_ones",) if s.centred else ("signed_permutation",) if s.post_norm else ()
    why = (
        "LayerNorm centres its input: the stream is kept mean-free, so the rotation must fix the all-ones vector"
        if s.centred
        else "post-norms add γ ⊙ rms(y) to the stream: O must satisfy O diag(γ) = diag(γ') O' (O' orthogonal, on y), "
        "which for generic γ leaves signed permutations, the norm weights permuted along (equal weights in every "
        "post-norm would admit all of O(d): a property of the weights, not used)"
        if s.post_norm
        else "RMS normalisation commutes with every orthogonal map"
    )
    groups[ROTATION] = G.Group(ROTATION, RESIDUAL_ROTATION, "orthogonal", s.d_model, constraints=fixes, note=why)
    if s.post_norm and s.pre_norms:
        notes.append("post-norms: a residual scale a is exact only with the writers (embeddings, attention output and "
                     "down projections), the post-norm weights" + (" and q and k (QK-norm)" if s.qk_norm else "")
                     + " scaled by a and the eps by a^2; it is left out of the group (the matchers scale writers alone)")
    elif s.post_norm:
        notes.append("post-norms: a residual scale a is exact only with the embeddings, the post-norm weights and every "
                     "bias but the gate's scaled by a, the gate's weights by 1/a and the eps by a^2 (the other weights "
                     "unchanged); it is left out of the group")
    elif s.eps_in_config:
        groups[SCALE] = G.Group(
            SCALE, RESIDUAL_SCALE, "scalar", 1, constraints=("positive",),
            note="normalisation is scale invariant; exact because the config's eps becomes a^2 eps",
        )
    else:
        notes.append(f"{s.hf_class} hard-codes its normalisation eps, so the residual scale is not an exact symmetry")


def _block_groups(s: ModelShape, i: int, groups: dict) -> None:
    r = _layer_names(i)
    nkv, dh = s.n_kv_heads, s.d_head
    # clip_qkv clamps q, k, v elementwise (OLMo, OLMoE): only signed permutations commute with the clamp; under
    # QK-norm the QK maps are signs already, which commute with it, and the OV maps are restricted alike
    clip = ("signed_permutation",) if s.clip_qkv is not None else ()
    qk_clip = () if s.qk_norm else clip
    clip_note = " (clip_qkv clamps q, k, v elementwise: only signed permutations commute with it)" if clip else ""
    groups[r.heads] = G.Group(r.heads, HEAD_PERM, "permutation", nkv, layer=i,
                                   note="attention heads are summed" + (" (KV groups move as units)" if s.q_per_kv > 1 else ""))
    if s.q_per_kv > 1:
        groups[r.query_heads] = G.Group(r.query_heads, HEAD_PERM, "permutation", s.q_per_kv, batch=(nkv,), layer=i,
                                        indexed_by=r.heads, note="query heads sharing a KV head")
    rope = ("rope",) if s.rotary_dims else ()
    groups[r.qk] = G.Group(
        r.qk, QK_MAP, "invertible", dh, batch=(nkv,), constraints=rope + qk_clip + (("qk_norm",) if s.qk_norm else ()),
        layer=i, rotary_dims=s.rotary_dims, rotary_layout=s.rotary_layout, indexed_by=r.heads,
        note=_qk_note(s) + (", shared by a GQA group" if s.q_per_kv > 1 else "") + (clip_note if qk_clip else ""),
    )
    groups[r.ov] = G.Group(
        r.ov, OV_MAP, "invertible", dh, batch=(nkv,), constraints=clip, layer=i, indexed_by=r.heads,
        note="values are mixed linearly" + (", shared by a GQA group" if s.q_per_kv > 1 else "") + clip_note,
    )
    if s.experts_in(i):
        from .spec_experts import expert_groups

        groups.update(expert_groups(s, i, r))
        return
    groups[r.ffn] = G.Group(r.ffn, FFN_PERM, "permutation", s.ffn_width(i), layer=i,
                                 note="the activation acts elementwise")
    if s.gated:
        groups[r.glu] = G.Group(r.glu, GLU_SCALE, "diagonal", s.ffn_width(i), layer=i, indexed_by=r.ffn,
                                     note="act(gate) * up is linear in up")


def _qk_note(s: ModelShape) -> str:
    """Why the QK map has its form (`symmerge inspect`)."""
    if s.qk_norm:
        where = "each head's q and k over d_head" if s.qk_norm == "head" else "q and k over all heads at once"
        return (f"q k^T is unchanged; an RMSNorm with weights on {where} (QK-norm) before RoPE: the map must "
                "be orthogonal, and commute with RoPE after conjugation by the norm weights; for generic "
                "weights only a sign on each rotary pair (a half turn) and on each other dim survives "
                "(equal weights on a pair would admit any rotation of it: a property of the weights, not used)")
    if not s.rotary_dims:
        return "q k^T is unchanged"
    return ("q k^T is unchanged; commutes with RoPE: scaled rotations on rotary pairs"
            + (", full on the other dims" if s.rotary_dims < s.d_head else ""))


def _residual_actions(s: ModelShape, axis: int, reader: bool, scaled: bool = True) -> list[Action]:
    if reader:
        return [Action(ROTATION, axis, "inv_t")]
    acts = [Action(ROTATION, axis, "g")]
    if scaled and s.residual_scale:
        acts.append(Action(SCALE, axis, "g"))
    return acts


def _block_actions(s: ModelShape, i: int) -> dict[str, list[Action]]:
    p = f"blocks.{i}"
    r = _layer_names(i)
    H, QH, QK, OV, FFN, GLU = r.heads, r.query_heads, r.qk, r.ov, r.ffn, r.glu
    qh = [Action(QH, 1, "g", (0,))] if s.q_per_kv > 1 else []
    glu = [Action(GLU, 0, "g")] if s.gated else []
    # QK-norm shares the config's eps: under the residual scale (eps -> a^2 eps) q and k must scale by a too
    qk = [Action(SCALE, 0, "g")] if s.qk_norm and s.residual_scale else []
    a = {
        # W_Q: [n_kv, q_per_kv, d_head, d_model]   b_Q: [n_kv, q_per_kv, d_head]
        f"{p}.attn.W_Q": _residual_actions(s, 3, True) + [Action(H, 0), Action(QK, 2, "g", (0,))] + qh + qk,
        f"{p}.attn.b_Q": [Action(H, 0), Action(QK, 2, "g", (0,))] + qh + qk,
        # W_K, W_V: [n_kv, d_head, d_model]   b_K, b_V: [n_kv, d_head]
        f"{p}.attn.W_K": _residual_actions(s, 2, True) + [Action(H, 0), Action(QK, 1, "inv_t", (0,))] + qk,
        f"{p}.attn.b_K": [Action(H, 0), Action(QK, 1, "inv_t", (0,))] + qk,
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
    if s.experts_in(i):
        from .spec_experts import expert_actions

        a = {k: v for k, v in a.items() if ".mlp." not in k}
        a.update(expert_actions(s, i, _layer_names(i), _residual_actions))
    if s.qk_norm == "head":
        # g_Q, g_K: [d_head], the QK-norm weights shared by the heads: the signs and head permutations leave them
        a.update({f"{p}.attn.g_Q": [], f"{p}.attn.g_K": []})
    elif s.qk_norm == "projection":
        # g_Q: [n_kv, q_per_kv, d_head], g_K: [n_kv, d_head], a weight per entry: they move with their heads
        a.update({f"{p}.attn.g_Q": [Action(H, 0)] + qh, f"{p}.attn.g_K": [Action(H, 0)]})
    if s.post_norm:
        # g_attn, g_mlp: [d_model], the post-norm weights: permuted with the stream, not signed
        a.update({f"{p}.attn.g_post": [Action(ROTATION, 0, "abs")], f"{p}.mlp.g_post": [Action(ROTATION, 0, "abs")]})
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
        notes.append(f"clip_qkv={s.clip_qkv}: OV maps restricted to signed permutations, QK maps "
                     + ("to the QK-norm's signs (they commute with the clamp)" if s.qk_norm
                        else "too (quarter turns on rotary pairs)"))
    if s.qk_norm and s.residual_scale:
        notes.append("QK-norm reads the config's eps: the residual scale a (eps -> a^2 eps) scales q and k by a too")
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
        "norm.eps": [Action(SCALE, 0, "sq")] if s.residual_scale else [],
    }
    for i in range(s.n_layers):
        actions.update(_block_actions(s, i))
    return Spec(s, groups, actions, notes)
