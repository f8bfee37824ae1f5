"""`ModelShape`: everything about an architecture that its symmetry group depends on.

The symmetry specification (`spec.build_spec`) is a function of this record alone, so two checkpoints
with equal shapes have the same group and can be aligned, merged and compared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelShape:
    arch: str  # adapter name: "gpt2", "gpt_neox", "llama", "olmo", "vit"
    hf_class: str  # e.g. "GPT2LMHeadModel"
    d_model: int
    n_layers: int
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (== n_heads without GQA)
    d_head: int
    d_mlp: int
    vocab: int  # vocabulary size (LMs) or number of classes (ViT)
    norm: str  # "layernorm" (centres: residual maps must fix the all-ones vector) or "rmsnorm"
    gated: bool  # SwiGLU MLP (gate and up projections)
    parallel: bool  # attention and MLP read the same residual (GPT-NeoX parallel residual)
    rotary_dims: int  # per-head dimensions rotated by RoPE (0: no RoPE)
    rotary_layout: str  # "half": rotate_half pairs i with i + rotary_dims/2; "interleaved": 2i with 2i+1; "none" (rotary.py)
    tied: bool  # input embedding and LM head shared in the source checkpoint
    eps: float  # the normalisation epsilon of the source checkpoint
    eps_in_config: bool  # False when the architecture hard-codes eps (then no residual scale)
    activation: str
    clip_qkv: float | None = None  # OLMo: q, k and v are clamped elementwise
    n_positions: int = 0  # learned absolute positions (GPT-2, ViT); 0 if none
    #: an RMSNorm with weights on q and on k before RoPE: "head" (per head over d_head, weights shared by the
    #: heads: Qwen3), "projection" (over all heads at once, a weight per entry: OLMo-2), "" (none)
    qk_norm: str = ""
    #: a norm sits on each sublayer's output before the residual add (`x + γ ⊙ rms(y)`: OLMo-2, Gemma 2 and 3);
    #: the final norm still reads the stream
    post_norm: bool = False
    #: the readers read the stream through a norm (False: OLMo-2, whose only norms are the post-norms and the final)
    pre_norms: bool = True
    #: a mixture of experts in place of the MLP (0: a dense MLP): `n_experts` gated MLPs of width `d_mlp` each,
    #: of which a router (a reader of the stream, one logit per expert) picks `experts_per_token` per token
    n_experts: int = 0
    experts_per_token: int = 0
    #: a mixture of experts' layers that keep a dense gated MLP, of width `d_mlp_dense` (Qwen3-MoE's
    #: `mlp_only_layers` and `decoder_sparse_step`); the other layers are mixtures
    dense_layers: tuple[int, ...] = ()
    d_mlp_dense: int = 0
    #: a shared expert beside the experts of every mixture layer (Qwen2-MoE; 0: none): a gated MLP of this width
    #: that every token takes, its output multiplied by the sigmoid of one more reader of the stream
    d_shared: int = 0

    def experts_in(self, i: int) -> bool:
        """Whether layer i's FFN is a mixture of experts."""
        return self.n_experts > 0 and i not in self.dense_layers

    def ffn_width(self, i: int) -> int:
        """Layer i's FFN width: each expert's in a mixture, the dense MLP's otherwise."""
        return self.d_mlp_dense if self.n_experts and i in self.dense_layers else self.d_mlp

    @property
    def q_per_kv(self) -> int:
        """Query heads per key/value head (1 without GQA)."""
        return self.n_heads // self.n_kv_heads

    @property
    def residual_scale(self) -> bool:
        """Whether multiplying the stream by a > 0 (writers by a, the config's eps by a^2) is in the group: the eps
        must be a config value, and no post-norm may sit between a writer and the stream (the exact scale of a
        post-norm model moves the post-norm weights and other tensors besides the writers: `spec` states it in a
        note and leaves it out)."""
        return self.eps_in_config and not self.post_norm

    @property
    def centred(self) -> bool:
        """True for LayerNorm models: their residual maps must fix the all-ones vector."""
        return self.norm == "layernorm"

    def to_dict(self) -> dict:
        return asdict(self)
