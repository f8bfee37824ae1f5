"""Write a narrow model as a checkpoint of a wider config that computes exactly the narrow model's function.

Every axis the symmetry spec names is embedded into the wide size by the map its family implies
(canonical tensors, so one construction serves every architecture):

- residual axis (d -> D): an isometric embedding `P` (D x d, P^T P = I). The wide norm sees
  `mean_D((a P x)^2) = a^2 (d/D) mean_d(x^2)`, so with `a^2 = eps_D D / (d eps_d)`
  `norm_D(a P x) = sqrt(D/d) P norm_d(x)` exactly: writers are multiplied by `a P`, readers by
  `sqrt(d/D) P` (an isometry is its own inverse transpose on its range), the final norm's bias (added
  after normalising, `canonical.POST_NORM`) by `sqrt(D/d) P`, and the canonical eps becomes eps_D.
  Under LayerNorm the mean-free stream must stay mean-free (then LayerNorm still is RMS
  normalisation): `P^T 1_D` must be a multiple of `1_d`. Our `P` also maps the ones vector of d to
  `sqrt(d/D)` times the ones vector of D, so the wide model's residual rotations (which fix 1_D)
  act on the expansion as on any wide model; under RMSNorm `P = [I; 0]`. A random isometry breaks it
  (the tests' negative control).
- head and FFN slots (head_perm, ffn_perm, glu_scale): zero padding. New units have zero in and out
  weights, new heads zero query, key, value and output maps: they add nothing.
- head width (qk_map, ov_map): narrow head dimension i lands on wide dimension `head_dims[i]`, zeros
  elsewhere, so `q . k` is unchanged; the query side is multiplied by `score_narrow / score_wide`
  (the stock `1/sqrt(d_head)` changes with the head width). With RoPE, each narrow rotary pair
  lands on the wide pair with the *same* inverse frequency (the stock forward's float32 values,
  compared exactly) and the pass-through dimensions on wide pass-through dimensions.
- QK-norm (an RMSNorm on q and k that reads the config's eps): q and k are multiplied by
  `sqrt(eps_D / eps_d)` (the residual scale's action on them), so the norm sees its input and eps
  scaled alike. A wider head would change the mean the norm takes and the
  score scale behind it: refused; so are more heads under a QK-norm over the whole projection (OLMoE). Post-norm
  models (OLMo-2) expand only their FFN width.
- a token embedding the stock model scales by a constant of the config (Gemma's `sqrt(d_model)`,
  `Adapter.embed_scale`) is multiplied by the narrow constant over the wide one, so the first block reads what the
  narrow model's does.
- mixtures of experts: the router is a reader (its logits unchanged), each expert's units are FFN slots (zero
  padded inside every expert), its down projection a writer; a shared expert's units are FFN slots too, its gate
  a reader. The number of experts stays: a new expert's
  router row gives it a finite logit, hence weight in the softmax and a chance in the top k.

What cannot be expanded is refused in `plan` with the reason (the list: docs/guides/widths.md,
"What cannot be expanded").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..adapters import adapter_for
from ..algebra.canonical import POST_NORM
from ..algebra.rotary import Pairing
from ..algebra.shape import ModelShape
from ..algebra.spec import QK_MAP, RESIDUAL_ROTATION, Spec, build_spec
from ..errors import SymmergeError
from .io import load_config, prepare_output
from .model import LazyModel, Model, expected_tensors, in_memory, read_whole
from .parts import ModelParts, Params

#: ModelShape fields that must be equal on both sides (the rest are widths, checked to grow, or free)
SAME = {"arch": "architectures", "hf_class": "classes", "n_layers": "layer counts", "vocab": "vocabularies (or classes)",
        "norm": "normalisations", "gated": "MLP kinds", "parallel": "residual layouts", "rotary_layout": "RoPE layouts",
        "activation": "activations", "clip_qkv": "clip_qkv", "n_positions": "position counts",
        "eps_in_config": "eps handling", "qk_norm": "QK-norms", "experts_per_token": "experts per token",
        "dense_layers": "dense layers of a mixture of experts"}
#: the canonical token embedding, which a class may scale by a constant of its config (`Adapter.embed_scale`)
TOKEN_EMBEDDING = "embed.W_E"
#: widths that may only grow from NARROW to WIDE
WIDTHS = ("d_model", "n_kv_heads", "q_per_kv", "d_head", "d_mlp", "d_mlp_dense", "d_shared")


@dataclass(frozen=True)
class Expansion:
    """How a narrow model's canonical tensors map into a wide shape (see the module docstring)."""

    narrow: ModelShape
    wide: ModelShape
    P: torch.Tensor  # [D, d] isometric embedding of the residual stream
    writer_scale: float  # a: a^2 = eps_D D / (d eps_d)
    reader_scale: float  # sqrt(d / D)
    score_scale: float  # score_narrow / score_wide, on the query side of every head
    head_dims: torch.Tensor  # [d_head narrow]: where each query/key dimension lands in the wide head
    qk_scale: float = 1.0  # sqrt(eps_D / eps_d): q and k under QK-norm (the norm's input scales with its eps)
    embed_scale: float = 1.0  # embed_narrow / embed_wide (`Adapter.embed_scale`), on the token embedding


# --- the plan: checks and the maps -----------------------------------------------------------------


def _check_shapes(n: ModelShape, w: ModelShape) -> None:
    for key, what in SAME.items():
        if getattr(n, key) != getattr(w, key):
            raise SymmergeError(f"NARROW and WIDE differ in {what} ({key}={getattr(n, key)} vs {getattr(w, key)}); "
                                "expand only changes widths")
    if n.n_experts != w.n_experts:
        raise SymmergeError(f"NARROW and WIDE differ in the number of experts ({n.n_experts} vs {w.n_experts}): a new "
                            "expert's router row has a finite logit, so the softmax would give it weight; keep the experts")
    for key in WIDTHS:
        if getattr(n, key) > getattr(w, key):
            why = (" (a query head cannot move to another KV group: the GQA ratio may only grow)"
                   if key == "q_per_kv" else "")
            raise SymmergeError(f"NARROW is wider than WIDE in {key} ({getattr(n, key)} > {getattr(w, key)}){why}; "
                                "swap them or pick a wider WIDE")
    if n.eps <= 0 or w.eps <= 0:
        raise SymmergeError(f"eps must be positive to be compensated (NARROW {n.eps}, WIDE {w.eps})")


def _check_config(adapter, nc, wc) -> None:
    for key in adapter.function_keys:
        a, b = getattr(nc, key, None), getattr(wc, key, None)
        if key == "layer_types" or a == b:
            continue
        raise SymmergeError(f"NARROW and WIDE differ in {key} ({a} vs {b}), which changes the function beyond widths")


def residual_embedding(d: int, D: int, centred: bool) -> torch.Tensor:
    """P [D, d] with P^T P = I; centred (LayerNorm): P 1_d = sqrt(d/D) 1_D, by two Householder reflections
    that swap e_1 and the unit ones vector (H_D's first d columns after H_d)."""
    if not centred:
        return torch.eye(D, d, dtype=torch.float64)

    def householder(n: int) -> torch.Tensor:
        v = torch.full((n,), -(n ** -0.5), dtype=torch.float64)
        v[0] += 1.0
        if float(v.norm()) == 0.0:
            return torch.eye(n, dtype=torch.float64)
        return torch.eye(n, dtype=torch.float64) - 2.0 * torch.outer(v, v) / float(v @ v)

    return householder(D)[:, :d] @ householder(d)


def _pairs(dims: int, layout: str) -> tuple[list[int], list[int]]:
    """(first, second) dimension of each rotary pair k, in frequency order (`rotary.Pairing` knows the layouts)."""
    p = Pairing(dims, layout)
    return p.first.tolist(), p.second.tolist()


def head_dims(adapter, nc, wc, n: ModelShape, w: ModelShape) -> torch.Tensor:
    """Where each narrow query/key dimension lands in the wide head; RoPE pairs on equal frequencies."""
    fn, fw = adapter.rotary_frequencies(nc, n), adapter.rotary_frequencies(wc, w)
    out = [0] * n.d_head
    taken: set[int] = set()
    if fn is not None:
        (inv_n, scale_n), (inv_w, scale_w) = fn, fw
        if scale_n != scale_w:
            raise SymmergeError(f"RoPE cos/sin scaling differs (NARROW {scale_n}, WIDE {scale_w}); it cannot be compensated")
        (n1, n2), (w1, w2) = _pairs(n.rotary_dims, n.rotary_layout), _pairs(w.rotary_dims, w.rotary_layout)
        for k, f in enumerate(inv_n.tolist()):
            match = [j for j, g in enumerate(inv_w.tolist()) if g == f and w1[j] not in taken]
            if not match:
                raise SymmergeError(
                    f"RoPE frequency {k} of NARROW ({f:.6g}) has no equal frequency in WIDE (rotary dims "
                    f"{n.rotary_dims} of {n.d_head} vs {w.rotary_dims} of {w.d_head}; check rope_theta and "
                    "partial_rotary_factor): the wide head cannot rotate it the same way")
            out[n1[k]], out[n2[k]] = w1[match[0]], w2[match[0]]
            taken.update((w1[match[0]], w2[match[0]]))
    free_n, free_w = range(n.rotary_dims, n.d_head), range(w.rotary_dims, w.d_head)
    if len(free_n) > len(free_w):
        raise SymmergeError(f"NARROW has {len(free_n)} head dimensions without RoPE, WIDE only {len(free_w)}: "
                            "they cannot pass through unrotated")
    for i, j in zip(free_n, free_w):
        out[i] = j
    return torch.tensor(out, dtype=torch.int64)


def plan(adapter, narrow_config, wide_config) -> Expansion:
    """The expansion of a NARROW config into a WIDE one (same adapter), or a SymmergeError saying why not."""
    n, w = adapter.shape(narrow_config), adapter.shape(wide_config)
    _check_shapes(n, w)
    _check_config(adapter, narrow_config, wide_config)
    score = adapter.score_scale(narrow_config, n) / adapter.score_scale(wide_config, w)
    if n.clip_qkv is not None and score != 1.0:
        raise SymmergeError(f"clip_qkv={n.clip_qkv} clamps q elementwise, so the score scale of a wider head "
                            "cannot be compensated in W_Q; keep d_head")
    if n.post_norm and (n.d_model, n.n_heads, n.n_kv_heads, n.d_head, n.eps) != (w.d_model, w.n_heads, w.n_kv_heads, w.d_head, w.eps):
        raise SymmergeError("post-norms normalise over the residual width and QK-norm over all heads, with one eps: "
                            "only a wider FFN (d_mlp) is expanded exactly; keep the other widths and the eps")
    if n.qk_norm == "projection" and (n.n_heads, n.n_kv_heads) != (w.n_heads, w.n_kv_heads):
        raise SymmergeError("QK-norm over the whole projection normalises q and k over all heads, so new heads "
                            "change their norms; keep the head counts")
    if n.qk_norm and n.d_head != w.d_head:
        raise SymmergeError(f"QK-norm normalises q and k over the head width, so a wider head ({n.d_head} -> "
                            f"{w.d_head}) changes their norms; keep d_head")
    return Expansion(n, w, residual_embedding(n.d_model, w.d_model, n.centred),
                     math.sqrt(w.eps * w.d_model / (n.d_model * n.eps)), math.sqrt(n.d_model / w.d_model),
                     score, head_dims(adapter, narrow_config, wide_config, n, w), math.sqrt(w.eps / n.eps),
                     adapter.embed_scale(narrow_config, n) / adapter.embed_scale(wide_config, w))


# --- applying it: pure, tensor by tensor ------------------------------------------------------------


def _along(t: torch.Tensor, axis: int, m: torch.Tensor) -> torch.Tensor:
    """Multiply axis `axis` of t by the matrix m [new, old]."""
    x = torch.movedim(t, axis, -1)
    return torch.movedim(x @ m.to(t.dtype).T, -1, axis)


def _pad(t: torch.Tensor, axis: int, size: int, index: torch.Tensor | None = None) -> torch.Tensor:
    """t with axis `axis` grown to `size`: entry i at `index[i]` (default i), zeros elsewhere."""
    shape = list(t.shape)
    shape[axis] = size
    out = t.new_zeros(shape)
    index = torch.arange(t.shape[axis]) if index is None else index
    return out.index_copy(axis, index, t)


def _axis_map(e: Expansion, spec: Spec, name: str, t: torch.Tensor, axis: int, family: str, how: str, size: int):
    if family == RESIDUAL_ROTATION:
        scale = e.reader_scale if how == "inv_t" else (1.0 / e.reader_scale if name in POST_NORM else e.writer_scale)
        return _along(t, axis, e.P) * scale
    if family == QK_MAP:
        t = _pad(t, axis, size, e.head_dims)
        return t * e.score_scale if how == "g" else t
    return _pad(t, axis, size)  # head slots, FFN units, head width on the value side


def expand_params(e: Expansion, wide_spec: Spec, params: Params) -> Params:
    """The narrow canonical `params` (any part) in the wide shape; pure."""
    out = {}
    for name, t in params.items():
        if name not in wide_spec.actions:
            raise SymmergeError(f"internal: canonical tensor {name} has no entry in the wide spec")
        done: set[int] = set()
        for a in wide_spec.actions[name]:
            group = wide_spec.groups[a.group]
            if a.how == "sq":  # the eps: WIDE's, exactly (a^2 d/D eps_d = eps_D up to rounding)
                t = torch.full_like(t, e.wide.eps)
            elif wide_spec.is_residual_scale(a.group):
                # a writer's scale rides on its residual axis (`_axis_map`); q and k under QK-norm are scaled
                # without being writers
                if not any(b.how == "g" and wide_spec.groups[b.group].family == RESIDUAL_ROTATION for b in wide_spec.actions[name]):
                    t = t * e.qk_scale
            elif a.axis not in done:
                t = _axis_map(e, wide_spec, name, t, a.axis, group.family, a.how, group.size)
                done.add(a.axis)
        out[name] = t * e.embed_scale if name == TOKEN_EMBEDDING else t
    return out


class ExpandedModel(ModelParts):
    """A `LazyModel` of NARROW seen in WIDE's config: parts are expanded as they are read, so
    `stream.write_streaming` writes the expansion one block at a time."""

    def __init__(self, narrow, wide_config, expansion: Expansion):
        self.narrow, self.e = narrow, expansion
        self.adapter, self.config, self.shape = narrow.adapter, wide_config, expansion.wide
        self.spec = build_spec(self.shape)
        self.path, self.dtype, self.meta = narrow.path, narrow.dtype, narrow.meta

    def part(self, key) -> Params:
        return expand_params(self.e, self.spec, self.narrow.part(key))

    def as_model(self) -> Model:
        return read_whole(self)


def expanded_like(narrow, wide_config):
    """NARROW (a `Model` in memory or a `LazyModel`) in the shape of `wide_config`, of the same kind."""
    e = plan(narrow.adapter, narrow.config, wide_config)
    if in_memory(narrow):
        spec = build_spec(e.wide)
        return Model(narrow.path, wide_config, narrow.adapter, e.wide, spec, expand_params(e, spec, narrow.params),
                     narrow.dtype, dict(narrow.meta))
    return ExpandedModel(narrow, wide_config, e)


def widest(a, b, name_a: str = "A", name_b: str = "B"):
    """(a, b) with the narrower expanded into the other's config when their widths differ (`align`,
    `interpolate`, `barrier` on mixed widths). Pairs that differ in more than widths, or that neither
    way expands, are refused with the expansion's reason (other architectures: `compatible.check_compatible`'s)."""
    from .compatible import check_compatible

    if a.shape.arch != b.shape.arch or not _widths_differ(a, b):
        check_compatible(a, b, name_a, name_b)
        return a, b
    try:
        a, b = a, expanded_like(b, a.config)
    except SymmergeError as to_a:
        try:
            a, b = expanded_like(a, b.config), b
        except SymmergeError:
            raise SymmergeError(f"{name_a} and {name_b} differ in widths and neither expands into the other: "
                                f"{name_b} into {name_a}: {to_a}") from None
    check_compatible(a, b, name_a, name_b)  # one shape now; the preprocessing and the tensors still checked
    return a, b


def _widths_differ(a, b) -> bool:
    return any(getattr(a.shape, k) != getattr(b.shape, k) for k in WIDTHS + ("n_heads",))


def widest_many(models: list, names: list[str]) -> tuple[list, int]:
    """(models, w): every model in the config of models[w], the first into whose config every other
    expands ("the widest"; `merge` and the barrier of many models on mixed widths), those of that config
    as they are. Models that differ in more than widths are refused by `compatible.check_compatible`'s reason;
    when no model takes all the others, the reason the widest (largest d_model, then FFN) cannot take one."""
    from .compatible import check_compatible

    if all(m.shape.arch == models[0].shape.arch for m in models) and any(_widths_differ(models[0], m) for m in models):
        for w, target in enumerate(models):
            try:
                out = [m if not _widths_differ(m, target) else expanded_like(m, target.config) for m in models]
            except SymmergeError:
                continue
            for m, name in zip(out, names):
                check_compatible(out[w], m, names[w], name)
            return out, w
        w = max(range(len(models)), key=lambda i: (models[i].shape.d_model, models[i].shape.d_mlp))
        bad = next(i for i, m in enumerate(models) if i != w and _failure(m, models[w]) is not None)
        raise SymmergeError(f"the models differ in widths and none takes all the others: {names[bad]} does not expand "
                            f"into {names[w]}: {_failure(models[bad], models[w])}")
    for m, name in zip(models[1:], names[1:]):
        check_compatible(models[0], m, names[0], name)
    return models, 0


def _failure(narrow, wide) -> SymmergeError | None:
    """Why `narrow` does not expand into `wide`'s config (None where it does or needs not)."""
    if not _widths_differ(narrow, wide):
        return None
    try:
        plan(narrow.adapter, narrow.config, wide.config)
    except SymmergeError as e:
        return e
    return None


def check_exported_shapes(model: ExpandedModel) -> None:
    """Every HF tensor of the expansion (ends and block 0; blocks are alike) has the shape WIDE's config
    implies: catches differences no width explains (patch size, channels...)."""
    want = expected_tensors(model.config, model.shape.hf_class)
    ends = model.ends()
    sd = model.adapter.ends_from_canonical(ends, model.shape)
    if model.shape.n_layers:
        sd.update(model.adapter.block_from_canonical(model.part(0), model.shape, 0))
    for k, v in sd.items():
        if k in want and tuple(v.shape) != want[k]:
            raise SymmergeError(f"NARROW's {k} would have shape {tuple(v.shape)} in WIDE's config, which implies "
                                f"{want[k]}: the two differ in more than widths")


def expand_checkpoint(narrow_path, wide_path, out, force: bool = False, progress: bool = False,
                      dtype: torch.dtype | None = None):
    """`symmerge expand NARROW --like WIDE -o OUT`: write NARROW in WIDE's config (its function unchanged).

    Reads WIDE's config only; NARROW one block at a time. `dtype`: of the written weights (default:
    NARROW's storage dtype). Returns (OUT, Expansion)."""
    from .stream import write_streaming

    prepare_output(out, force, inputs=[narrow_path, wide_path])
    narrow = LazyModel(narrow_path)
    if not (Path(wide_path) / "config.json").is_file():
        raise SymmergeError(f"--like {wide_path} is not a folder with a config.json; pass the wide checkpoint's folder")
    wide_config = load_config(Path(wide_path))
    wide_config.dtype = narrow.config.dtype  # the weights keep NARROW's storage dtype
    if adapter_for(wide_config) is not narrow.adapter:
        raise SymmergeError(f"NARROW is a {narrow.shape.hf_class} and WIDE a "
                            f"{(wide_config.architectures or [wide_config.model_type])[0]}; both must be one architecture")
    e = plan(narrow.adapter, narrow.config, wide_config)
    model = ExpandedModel(narrow, wide_config, e)
    check_exported_shapes(model)
    extra = {"expand": {"narrow": str(narrow_path), "like": str(wide_path),
                                        "writer_scale": e.writer_scale, "score_scale": e.score_scale}}
    write_streaming(model, lambda part: part, out, force=force, extra=extra, progress=progress, dtype=dtype)
    return out, e
