"""What an adapter is, and the pieces that several adapters share.

An adapter *translates* and does nothing else: a stock HF state dict <-> canonical tensors (see
`canonical.py`), plus the `ModelShape` read off the config. To add an architecture:

1. write `adapters/<name>.py` with a subclass of `Adapter` (`shape`, `to_canonical`,
   `from_canonical`, and `export_config` if the config must change) and register it in
   `adapters/__init__.py`;
2. fill in its `hooks` (`HookPoints`: the stock model's module names that activation matching
   reads; without them `--method activation` refuses the architecture);
3. add a tiny-model factory to `tests/factories.py`. The property tests then check it against the
   stock `transformers` forward for every group and seed.

The adapters are the only place that knows Hugging Face module and parameter names.

The part functions take `get(name) -> float64 tensor` (current HF names; legacy names are renamed
by `renames`) so that a checkpoint can be read one block at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from ..algebra.canonical import fold_norm, mean_free, merge_o, merge_q, scale_residual, split_kv, split_o, split_q
from ..algebra.shape import ModelShape
from ..errors import SymmergeError

#: get(name) -> the stored tensor in the reading precision, a tensor of the caller's own (it may be changed in
#: place: `final_norm_to_canonical` scales the head so); error if missing. get(name, None) -> None if missing
Getter = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class HookPoints:
    """Module names of the stock HF model (as built from a canonical export) that activation matching hooks.

    `{i}` stands for the layer. Invariants activation matching relies on (it fails silently where they fail):
    - `norms`: every module of layer i whose output is the normalised residual stream (a norm read by
      attention or MLP), `attn_norm` among them: the one whose output the attention's q, k, v read; with
      `reads_inputs`, the modules whose *input* is the stream the readers read (post-norm blocks, where no
      norm precedes the readers: the attention and the MLP themselves; their first positional argument, else
      their first tensor keyword); empty: activation matching refuses the model;
    - `final_norm`: the norm the head reads (its output is a normalised stream too);
    - `ffn_hidden`: the module whose *input* is the FFN hidden vector (the down projection), its
      last axis the canonical `d_mlp` axis;
    - `moe_input`: in a mixture of experts, the sparse block whose *input* `[batch, seq, d]` is the normalised
      stream its router and experts read, hooked in the layers that are mixtures (`ModelShape.experts_in`;
      `ffn_hidden` in the others): the experts' units are computed from it (`match/activation_experts.py`);
    - `block`: layer i's block module, an entry of a module list (learned matching runs it on its own,
      `match/blockwise.py`): the parameters under it are exactly what `Adapter.block_from_canonical(.., i)`
      returns, and the top-level forward calls it once, reading nothing of its parameters itself;
    - `attention`: layer i's attention module, whose output is `(attn_output, attn_weights)` under the
      eager implementation, the weights `[batch, heads, T, T]` (what `output_attentions` reports; streaming
      activation matching hooks it, `match/activation_stream.py`).
    """

    norms: tuple[str, ...]
    attn_norm: str
    final_norm: str
    ffn_hidden: str
    block: str | None = None
    attention: str | None = None
    reads_inputs: bool = False
    moe_input: str | None = None

    def layer(self, i: int) -> HookPoints:
        """The names for layer i."""
        fmt = lambda n: None if n is None else n.format(i=i)  # noqa: E731
        return HookPoints(tuple(n.format(i=i) for n in self.norms), self.attn_norm.format(i=i), self.final_norm,
                          self.ffn_hidden.format(i=i), fmt(self.block), fmt(self.attention), self.reads_inputs,
                          fmt(self.moe_input))


class Adapter:
    name: str = ""
    hf_classes: tuple[str, ...] = ()
    #: (pattern, replacement) pairs renaming legacy checkpoint keys to the current HF names
    renames: tuple[tuple[str, str], ...] = ()
    #: the modules activation matching hooks (None: the architecture has no activation matching)
    hooks: HookPoints | None = None
    #: (pattern, replacement) pairs giving the names stock `save_pretrained` writes, where they differ from
    #: the class's own (other tools, e.g. mergekit, look tensors up by the saved names)
    save_renames: tuple[tuple[str, str], ...] = ()
    #: config keys outside `ModelShape` that change the forward: two checkpoints written one in the
    #: other's shape (`symmerge expand`) must agree on them
    function_keys: tuple[str, ...] = ()
    #: a mixture of experts' fused tensors (`<layer>.experts.<name>`, `[n_experts, rows, cols]`) that stock
    #: checkpoints store one expert at a time: {name: the per-expert parts, concatenated along rows} (`stored.py`)
    expert_parts: dict[str, tuple[str, ...]] = {}
    #: the stock norms multiply by `norm_offset + weight` (Gemma: 1 + w); the norm weight γ every canonical
    #: computation uses is the stored tensor plus this, and a norm of weight γ is written as γ - norm_offset
    norm_offset: float = 0.0

    # --- to implement ---
    def shape(self, config) -> ModelShape:
        raise NotImplementedError

    def embed_to_canonical(self, get: Getter, s: ModelShape) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def block_to_canonical(self, get: Getter, s: ModelShape, i: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def final_to_canonical(self, get: Getter, s: ModelShape) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def ends_from_canonical(self, params: dict[str, torch.Tensor], s: ModelShape) -> dict[str, torch.Tensor]:
        """HF tensors outside the blocks: embeddings, final norm (unit weight), head."""
        raise NotImplementedError

    def block_from_canonical(self, params: dict[str, torch.Tensor], s: ModelShape, i: int) -> dict[str, torch.Tensor]:
        """HF tensors of block i (norms exported with unit weight and zero bias)."""
        raise NotImplementedError

    def export_config(self, config, s: ModelShape, params: dict[str, torch.Tensor]):
        """The config of the exported checkpoint (untied head, eps moved by the residual scale)."""
        config = config.__class__.from_dict(config.to_dict())
        config.tie_word_embeddings = False
        return config

    def norm_names(self, s: ModelShape) -> dict[str, str]:
        """HF prefix of each norm whose weight folds into its readers, by slot: "blocks.i.ln1" (read by
        attention: `hooks.attn_norm`), "blocks.i.ln2" (read by the MLP: the other of `hooks.norms`, or the same
        one where attention and MLP read one norm), "final" (read by the head), all from `hooks`; empty without
        hooks, "final" alone without norms before the sublayers (post-norms, whose weights are canonical tensors of
        their own). `gauge.Gauge` reads a reference's norms through these names (norms without parameters are
        skipped there)."""
        if self.hooks is None:
            return {}
        names = {"final": self.hooks.final_norm}
        if len(self.hooks.norms) not in (1, 2) or self.hooks.reads_inputs:
            return names
        for i in range(s.n_layers):
            h = self.hooks.layer(i)
            names[f"blocks.{i}.ln1"] = h.attn_norm
            names[f"blocks.{i}.ln2"] = next((n for n in h.norms if n != h.attn_norm), h.attn_norm)
        return names

    def score_scale(self, config, s: ModelShape) -> float:
        """The factor the stock attention multiplies `q . k` by (1/sqrt(d_head) unless the class says otherwise)."""
        return s.d_head ** -0.5

    def embed_scale(self, config, s: ModelShape) -> float:
        """The factor the stock model multiplies a token's embedding by before the first block (1 unless the class
        says otherwise): a constant of the config, outside the canonical tensors, that `expand` compensates."""
        return 1.0

    def nope_layers(self, config) -> list[int]:
        """The layers that apply no RoPE in a model that rotates q and k elsewhere (none unless the class says so).
        symmerge gives them the RoPE layers' QK group, a subgroup of theirs (`inspect` says so)."""
        return []

    # --- shared ---
    def rotary_frequencies(self, config, s: ModelShape) -> tuple[torch.Tensor, float] | None:
        """(inverse frequencies [rotary_dims/2], cos/sin scaling) exactly as the stock forward computes them
        (float32, from the class's own rotary module), or None without RoPE. Refused for RoPE types that
        change their frequencies with the sequence length (dynamic, longrope: Phi-3's su and yarn): no fixed
        values to match. The group does not need them: it holds for any frequencies on the same pairs. A class
        that rotates each layer type with its own parameters (`rope_parameters` keyed by layer type: Gemma 3,
        OLMo-3) gives its full-attention layers' frequencies (`inverse_frequencies`: the first type's where no layer
        attends fully); the other types rotate the same pairs, and the
        adapters that read such configs name `rope_parameters` a function key, so two checkpoints placed by
        these frequencies agree on every type's."""
        if not s.rotary_dims:
            return None
        rope = getattr(config, "rope_parameters", None) or {}
        per_type = [v for v in rope.values() if isinstance(v, dict)]
        for kind in (p.get("rope_type", "default") for p in (per_type or [rope])):
            require("dynamic" not in kind and kind != "longrope",
                    f"rope_type {kind!r} changes its frequencies with the sequence length: no fixed frequencies to "
                    "place rotary pairs by (aligning and merging are unaffected: a QK map commutes with every "
                    "rotation of a pair)")
        inv_freq, scaling = inverse_frequencies(rotary_module(config, s.hf_class))
        require(2 * inv_freq.numel() == s.rotary_dims,
                f"internal: {s.hf_class} rotates {2 * inv_freq.numel()} dims, the adapter says {s.rotary_dims}")
        return inv_freq, scaling

    def rename(self, key: str) -> str:
        for pattern, repl in self.renames:
            key = re.sub(pattern, repl, key)
        return key

    def saved(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`sd` under the names stock `save_pretrained` writes (`save_renames`), fused expert tensors split
        into their experts' parts (`expert_parts`)."""
        from .stored import split_experts

        out = {}
        for key, t in split_experts(self, sd).items():
            for pattern, repl in self.save_renames:
                key = re.sub(pattern, repl, key)
            out[key] = t
        return out

    def from_canonical(self, params: dict[str, torch.Tensor], s: ModelShape) -> dict[str, torch.Tensor]:
        sd = self.ends_from_canonical(params, s)
        for i in range(s.n_layers):
            sd.update(self.block_from_canonical(params, s, i))
        return sd

    def to_canonical(self, get: Getter, s: ModelShape) -> dict[str, torch.Tensor]:
        params = self.embed_to_canonical(get, s)
        for i in range(s.n_layers):
            params.update(self.block_to_canonical(get, s, i))
        params.update(self.final_to_canonical(get, s))
        return params


def _classes_of(model_type: str) -> list[str]:
    """The model classes stock `transformers` pairs with `model_type` (its auto mappings are the one
    home of that fact): the causal-LM head first, then image classification, then masked LM."""
    from transformers.models.auto import modeling_auto as auto

    mappings = (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
                auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    return [m[model_type] for m in mappings if model_type in m]


def class_names(config) -> list[str]:
    """The stock classes `config` names: its `architectures`, or for a config that names none (some hand-written
    or old checkpoints) the classes transformers' auto mappings pair with its `model_type`. An adapter that serves
    several classes reads which one from here, so that a config without `architectures` is read (and written back)
    as its own class, not as the adapter's first."""
    return list(getattr(config, "architectures", None) or []) or _classes_of(config.model_type)


def _hf_class(name: str):
    import transformers

    return getattr(transformers, name)


def require(cond: bool, msg: str) -> None:
    if not cond:
        raise SymmergeError(msg)


def rotary_module(config, hf_class: str):
    """The stock class's own rotary embedding module, built for `config` (the one RoPE class of its modeling file)."""
    import sys

    module = sys.modules[_hf_class(hf_class).__module__]
    rotary = [getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding")]
    require(len(rotary) == 1, f"internal: {module.__name__} has {len(rotary)} rotary embedding classes")
    return rotary[0](config)


def inverse_frequencies(emb) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, cos/sin scaling) of a stock rotary module. A class that rotates each layer type with
    its own parameters (its module holds `{type}_inv_freq` for the types the config's layers use): its
    full-attention layers', or, where no layer attends fully, the first type's in sorted order."""
    types = sorted(getattr(emb, "layer_types", None) or [])
    prefix = "" if not types else "full_attention_" if "full_attention" in types else f"{types[0]}_"
    return getattr(emb, f"{prefix}inv_freq").detach().clone(), float(getattr(emb, f"{prefix}attention_scaling"))


def rotary_dims(config, hf_class: str) -> int:
    """The dimensions of each head that stock `hf_class` rotates for `config`: twice the frequencies its own rotary
    module computes. Whether a class reads `partial_rotary_factor` (or `rotary_pct`) is the class's to say: GPT-NeoX,
    Phi, Phi-3 and Ministral 3 do, Llama and most others rotate the whole head whatever the config holds."""
    return 2 * inverse_frequencies(rotary_module(config, hf_class))[0].numel()


# --- attention and MLP in canonical form ------------------------------------------------------------


def attention_to_canonical(p: str, s: ModelShape, q, k, v, o, bq, bk, bv, bo) -> dict[str, torch.Tensor]:
    """Canonical attention from nn.Linear-oriented q [H*dh, d], k, v [KV*dh, d], o [d, H*dh] (biases may be None)."""
    nkv, g, dh = s.n_kv_heads, s.q_per_kv, s.d_head
    zero = lambda n: torch.zeros(n, dtype=torch.float64)  # noqa: E731
    return {
        f"{p}.attn.W_Q": split_q(q, nkv, g, dh),
        f"{p}.attn.b_Q": (zero(nkv * g * dh) if bq is None else bq).reshape(nkv, g, dh),
        f"{p}.attn.W_K": split_kv(k, nkv, dh),
        f"{p}.attn.b_K": (zero(nkv * dh) if bk is None else bk).reshape(nkv, dh),
        f"{p}.attn.W_V": split_kv(v, nkv, dh),
        f"{p}.attn.b_V": (zero(nkv * dh) if bv is None else bv).reshape(nkv, dh),
        f"{p}.attn.W_O": split_o(o, nkv, g, dh),
        f"{p}.attn.b_O": zero(s.d_model) if bo is None else bo,
    }


def attention_from_canonical(p: str, params) -> tuple[torch.Tensor, ...]:
    """(q, k, v, o, bq, bk, bv, bo) in nn.Linear orientation."""
    a = lambda n: params[f"{p}.attn.{n}"]  # noqa: E731
    return (merge_q(a("W_Q")), merge_q(a("W_K")), merge_q(a("W_V")), merge_o(a("W_O")),
            a("b_Q").reshape(-1), a("b_K").reshape(-1), a("b_V").reshape(-1), a("b_O"))


def fold_attention(q, k, v, bq, bk, bv, gamma, beta):
    q, bq = fold_norm(q, bq, gamma, beta)
    k, bk = fold_norm(k, bk, gamma, beta)
    v, bv = fold_norm(v, bv, gamma, beta)
    return q, k, v, bq, bk, bv


def layernorm_block_to_canonical(get, s: ModelShape, i: int, attn: str, proj: tuple[str, str, str, str], ln1, ln2,
                                 fc: tuple[str, str]) -> dict[str, torch.Tensor]:
    """Block i of a LayerNorm model with separate projections (`{attn}.{proj[j]}` for q, k, v, o) and an MLP
    (`fc`: its in and out layers), `ln1` (weight, bias) folded into q, k, v and `ln2` into the MLP's input layer
    (the same pair where both read one norm); every absent bias zero; the writers made mean-free."""
    p = f"blocks.{i}"
    w = lambda n: get(f"{n}.weight")  # noqa: E731
    b = lambda n: get(f"{n}.bias", None)  # noqa: E731
    names = [f"{attn}.{n}" for n in proj]
    q, k, v, bq, bk, bv = fold_attention(*(w(n) for n in names[:3]), *(b(n) for n in names[:3]), *ln1)
    out = attention_to_canonical(p, s, q, k, v, w(names[3]), bq, bk, bv, b(names[3]))
    w_in, b_in = fold_norm(w(fc[0]), b(fc[0]), *ln2)
    b_out = b(fc[1])
    out.update({f"{p}.mlp.W_in": w_in, f"{p}.mlp.b_in": b_in, f"{p}.mlp.W_out": w(fc[1]),
                f"{p}.mlp.b_out": torch.zeros(s.d_model, dtype=torch.float64) if b_out is None else b_out})
    return make_mean_free(out, s)


def layernorm_block_from_canonical(params, s: ModelShape, i: int, attn: str, proj: tuple[str, str, str, str],
                                   norms: tuple[str, ...], fc: tuple[str, str]) -> dict[str, torch.Tensor]:
    """`layernorm_block_to_canonical`'s inverse under the same names: q, k, v, o (`{attn}.{proj[j]}`) and the MLP's
    in and out layers (`fc`) with their biases, every norm of `norms` (the block's, by prefix) at unit weight and
    zero bias; `keep_expected` drops the zero biases a class without them lacks."""
    p = f"blocks.{i}"
    ones, zeros = torch.ones(s.d_model, dtype=torch.float64), torch.zeros(s.d_model, dtype=torch.float64)
    sd = {f"{n}.{t}": v for n in norms for t, v in (("weight", ones), ("bias", zeros))}
    q, k, v, o, bq, bk, bv, bo = attention_from_canonical(p, params)
    for n, w, b in zip(proj, (q, k, v, o), (bq, bk, bv, bo)):
        sd[f"{attn}.{n}.weight"], sd[f"{attn}.{n}.bias"] = w, b
    for n, c in zip(fc, ("in", "out")):
        sd[f"{n}.weight"], sd[f"{n}.bias"] = params[f"{p}.mlp.W_{c}"], params[f"{p}.mlp.b_{c}"]
    return sd


def make_mean_free(params: dict[str, torch.Tensor], s: ModelShape) -> dict[str, torch.Tensor]:
    """LayerNorm models: drop every writer's component along the all-ones vector (never read)."""
    if not s.centred:
        return params
    axes = {"embed.W_E": 1, "embed.W_pos": 1, "embed.W_patch": 0, "embed.b_patch": 0, "embed.cls": 0}
    out = {}
    for k, t in params.items():
        tail = k.split(".", 2)[-1]
        axis = axes.get(k)
        if tail in ("attn.W_O",):
            axis = 2
        elif tail in ("attn.b_O", "mlp.W_out", "mlp.b_out"):
            axis = 0
        out[k] = mean_free(t, axis) if axis is not None else t
    return out


def final_norm_to_canonical(w_u, b_u, gamma, beta, eps: float) -> dict[str, torch.Tensor]:
    """Fold the final norm into the head. Without a head bias, keep beta/gamma as `final.b_norm`.

    `w_u` is the caller's own (a `Getter`'s result) and is scaled in place: the head has the vocabulary's rows,
    and a scaled copy would hold a second one while the part is read (2.4 GB in float64 at a 262,144 x 1,152
    head). Where the product's dtype is not `w_u`'s (a float64 γ on a float32 head) it is a new tensor."""
    out = {"norm.eps": torch.tensor(eps, dtype=torch.float64)}
    if b_u is not None or beta is None:
        w, b = fold_norm(w_u, b_u, gamma, beta, in_place=True)
        out["head.W_U"] = w
        if b_u is not None:
            out["head.b_U"] = b
        return out
    require(bool((gamma != 0).all()), "the final norm has zero weights and the head has no bias: cannot fold its bias")
    out["head.W_U"] = scale_residual(w_u, gamma, in_place=True)
    out["final.b_norm"] = beta / gamma
    return out


def head_weight(get, embed: str) -> torch.Tensor:
    """The unembedding as the files hold it: `lm_head.weight`, or, where they hold none (a tied head, which stock
    `save_pretrained` drops), the embedding `embed` it is tied to."""
    w_u = get("lm_head.weight", None)
    return get(embed) if w_u is None else w_u


def any_attention_bias(params: dict[str, torch.Tensor], s: ModelShape) -> bool:
    """Whether any attention bias is non-zero (then the exported config must enable attention biases)."""
    names = ("b_Q", "b_K", "b_V", "b_O")
    return any(bool(params[f"blocks.{i}.attn.{n}"].ne(0).any()) for i in range(s.n_layers) for n in names)
