"""The symmetry of a mixture of experts (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE): the groups of one layer's experts and
their actions.

A sparse MoE layer computes, for a normalised stream x,

    y = sum_{e in top_k(p)} w_e · W_out[e] (act(W_gate[e] x) * (W_in[e] x)),   p = softmax(W_router x),

with w_e the selected probabilities, renormalised over the top k or not (`norm_topk_prob`). Exact symmetries, each derived from this form:

- expert permutation (per layer): relabel the experts, moving each expert's three matrices and the router's
  row together. The softmax is equivariant under a permutation of its logits, top-k selects the same experts
  (now under their new labels; exact ties, a measure-zero event, may be broken differently), the renormalised
  weights are those of the same experts, and the sum over them does not depend on their order;
- FFN permutation (one per expert: a batch of E permutations): inside each expert, as in a dense gated MLP;
  it acts before the expert permutation, so it is indexed by B's experts (`indexed_by` the expert permutation);
- GLU scale (one diagonal per expert): `act(gate) * up` is linear in up, so up's rows scale by d and down's
  columns by 1/d; indexed by the expert's FFN permutation, hence (through it) by the expert permutation;
- the residual rotation reaches the router as a reader (`W_router -> W_router O^T`: the logits are unchanged),
  the experts' up and gate as readers and their down projections as writers; the residual scale scales the
  down projections (the router reads the normalised stream, untouched by it).

A shared expert (Qwen2-MoE: `y += sigmoid(w_s . x) · W_out_s (act(W_gate_s x) * (W_in_s x))`, taken by every token)
is a dense gated MLP beside the experts: its own unit permutation and GLU scale (families `ffn_perm` and
`glu_scale`, not indexed by the expert permutation, which does not touch it); its gate `w_s` is one more reader
(the sigmoid's argument is unchanged under `w_s -> w_s O^T`), its down projection a writer.

Canonical tensors (no biases: the stock classes have none):
    blocks.i.moe.W_router [E, d_model]
    blocks.i.moe.W_in [E, d_mlp, d_model] (up)   W_gate [E, d_mlp, d_model]   W_out [E, d_model, d_mlp] (down)
    blocks.i.moe.W_shared_router [1, d_model]   W_shared_in, W_shared_gate [d_shared, d_model]
    blocks.i.moe.W_shared_out [d_model, d_shared]   (a shared expert only)
"""

from __future__ import annotations

from . import groups as G
from .families import EXPERT_PERM, FFN_PERM, GLU_SCALE, Action

EXPERT_NOTE = ("the experts' outputs are summed with the router's weights: relabelling the experts together "
               "with the router's rows permutes the router's logits, and softmax, top-k selection and the "
               "renormalised weights follow the relabelling")


def expert_groups(s, i: int, r) -> dict[str, G.Group]:
    """Layer i's expert permutation and, inside each expert, the FFN permutation and GLU scale (`r`: the names)."""

    e = s.n_experts
    out = {
        r.experts: G.Group(r.experts, EXPERT_PERM, "permutation", e, layer=i,
                           note=EXPERT_NOTE + f" (top {s.experts_per_token} of {e})"),
        r.ffn: G.Group(r.ffn, FFN_PERM, "permutation", s.d_mlp, batch=(e,), layer=i, indexed_by=r.experts,
                       note="the activation acts elementwise (one permutation per expert)"),
    }
    if s.gated:
        out[r.glu] = G.Group(r.glu, GLU_SCALE, "diagonal", s.d_mlp, batch=(e,), layer=i, indexed_by=r.ffn,
                             note="act(gate) * up is linear in up (one scale per expert)")
    if s.d_shared:
        out[r.shared] = G.Group(r.shared, FFN_PERM, "permutation", s.d_shared, layer=i,
                                note="the shared expert's activation acts elementwise")
        out[r.shared_glu] = G.Group(r.shared_glu, GLU_SCALE, "diagonal", s.d_shared, layer=i, indexed_by=r.shared,
                                    note="the shared expert's act(gate) * up is linear in up")
    return out


def expert_actions(s, i: int, r, residual) -> dict:
    """The actions on layer i's expert tensors (`residual(s, axis, reader)`: the residual groups' actions)."""

    p = f"blocks.{i}.moe"
    ex, ffn = [Action(r.experts, 0)], Action(r.ffn, 1, "g", (0,))
    glu = [Action(r.glu, 1, "g", (0,))] if s.gated else []
    shared = {
        # W_shared_router: [1, d_model], the shared expert's sigmoid gate: a reader
        f"{p}.W_shared_router": residual(s, 1, True),
        # W_shared_in (up), W_shared_gate: [d_shared, d_model]   W_shared_out (down): [d_model, d_shared]
        f"{p}.W_shared_in": residual(s, 1, True) + [Action(r.shared, 0), Action(r.shared_glu, 0)],
        f"{p}.W_shared_gate": residual(s, 1, True) + [Action(r.shared, 0)],
        f"{p}.W_shared_out": residual(s, 0, False) + [Action(r.shared, 1, "inv_t"), Action(r.shared_glu, 1, "inv_t")],
    } if s.d_shared else {}
    return shared | {
        # W_router: [E, d_model]: a reader, one row per expert
        f"{p}.W_router": residual(s, 1, True) + ex,
        # W_in (up), W_gate: [E, d_mlp, d_model]
        f"{p}.W_in": residual(s, 2, True) + ex + [ffn] + glu,
        f"{p}.W_gate": residual(s, 2, True) + ex + [ffn],
        # W_out (down): [E, d_model, d_mlp]
        f"{p}.W_out": residual(s, 1, False) + ex + [Action(r.ffn, 2, "inv_t", (0,))]
        + ([Action(r.glu, 2, "inv_t", (0,))] if s.gated else []),
    }
