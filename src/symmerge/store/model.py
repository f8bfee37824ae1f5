"""Load a checkpoint folder into canonical form, and export canonical tensors as a stock HF checkpoint."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..adapters import adapter_for
from ..adapters.base import Adapter
from ..adapters.stored import StoredNames
from ..algebra.apply import apply
from ..algebra.shape import ModelShape
from ..algebra.spec import Spec, build_spec
from ..errors import SymmergeError
from .io import AtomicFolder, Checkpoint, copy_side_files, prepare_output, write_weights
from .parts import InMemoryParts, ModelParts, Params, part_keys
from .provenance import write_metadata


@dataclass
class Model:
    """A checkpoint in canonical form, held in memory whole: everything the algorithms need, nothing tied to
    nn.Module. Served part by part through a view (`parts`, `as_parts`)."""

    path: Path | None
    config: object  # the HF config of the source checkpoint
    adapter: Adapter
    shape: ModelShape
    spec: Spec
    params: dict[str, torch.Tensor]
    dtype: torch.dtype = torch.float32
    meta: dict = field(default_factory=dict)

    def parts(self, dtype: torch.dtype = torch.float64) -> InMemoryParts:
        """Its parameters served part by part in `dtype` (`parts.Parts`)."""
        return InMemoryParts(self.params, dtype)

    def as_model(self) -> Model:
        """Itself (a `LazyModel` is read into memory by its own `as_model`)."""
        return self

    def moved(self, g) -> Model:
        """The same checkpoint with its parameters under the group element `g` (`algebra.apply`): it computes
        what this model computes wherever `g` lies in the spec's symmetry group, and only up to the rounding
        of the dtype's products."""
        return replace(self, params=apply(self.spec, g, self.params))


def in_memory(source) -> bool:
    """Whether `source` is a model held in memory whole (a `Model`, or a dict of canonical tensors) rather than
    one served part by part (`parts.Parts`). The paths that differ for it: an element applied to the whole model
    and saved at once (`match.outputs.write_element`), the tensors compared whole (`compatible.check_compatible`), an
    expansion kept in memory (`expansion.expanded_like`), a mean kept in memory (`match.many`), a frozen store
    read from its float64 view (`match.frozen.reader_of`)."""
    return isinstance(source, (Model, dict))


def as_parts(source, dtype: torch.dtype = torch.float64):
    """`source` served part by part (`parts.Parts`): a model in memory (a `Model`, or a dict of canonical
    tensors) through a view in `dtype` (`InMemoryParts`), anything that serves parts already (a `LazyModel`,
    read in its own precision; a mean, ...) as it is."""
    if isinstance(source, dict):
        return InMemoryParts(source, dtype)
    return source.parts(dtype) if in_memory(source) else source


def hf_class(name: str):
    import transformers

    return getattr(transformers, name)


#: the dtypes stock mixtures of experts' default kernel (`grouped_mm`) multiplies
GROUPED_MM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def runs_in(config, dtype: torch.dtype):
    """`config`, set up for a stock model that runs in `dtype`: stock mixtures of experts default to the
    `grouped_mm` kernel, which multiplies float32/16 matrices only, so other dtypes (float64) get the eager loop
    over the experts (the same sums). Returns `config` (changed in place); in other dtypes it is left alone. A
    model without experts ignores the setting ("eager" is valid for every class)."""
    if dtype not in GROUPED_MM_DTYPES:
        config._experts_implementation = "eager"
    return config


def expected_tensors(config, class_name: str) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors a stock checkpoint of this config stores: the HF model's state dict
    (built on the meta device) less the names that share another's tensor (a tied head: `tied_copies`)."""
    tensors, _ = _stored_tensors(config.to_json_string(), class_name)
    return dict(tensors)


def tied_copies(config, class_name: str) -> dict[str, str]:
    """{name: the name it shares its tensor with} for the state dict entries a stock checkpoint leaves out, as
    `save_pretrained` does (a tied head: {"lm_head.weight": "model.embed_tokens.weight"}); {} where nothing is tied."""
    _, ties = _stored_tensors(config.to_json_string(), class_name)
    return dict(ties)


@functools.lru_cache(maxsize=32)
def _stored_tensors(config_json: str, class_name: str) -> tuple[tuple, tuple]:
    config = hf_class(class_name).config_class.from_dict(json.loads(config_json))
    with torch.device("meta"):
        model = hf_class(class_name)(config)
    first: dict[int, str] = {}  # the first name of each tensor object (the embedding before a head tied to it)
    kept, ties = [], []
    for k, v in model.state_dict(keep_vars=True).items():
        if id(v) in first:
            ties.append((k, first[id(v)]))
        else:
            first[id(v)] = k
            kept.append((k, tuple(v.shape)))
    return tuple(kept), tuple(ties)


def _check_tensors(ckpt: Checkpoint, shape: ModelShape, names: StoredNames) -> None:
    """Every tensor the HF class needs is present with the shape the config implies."""
    expected = expected_tensors(ckpt.config, shape.hf_class)
    shapes = names.shapes()
    for name, want in expected.items():
        if name not in names:
            raise SymmergeError(f"{ckpt.path}: tensor {name} is missing; the checkpoint does not match its config.json")
        got = shapes[name]
        if got != want:
            raise SymmergeError(
                f"{ckpt.path}: tensor {name} has shape {got} but config.json implies {want}; "
                "fix config.json or use the checkpoint it belongs to"
            )


class LazyModel(ModelParts):
    """A checkpoint whose canonical tensors are read one part at a time, in `dtype` (the algebra's precision).

    Files are closed after each part, so memory mapped for reading does not accumulate over a pass."""

    def __init__(self, path, dtype: torch.dtype = torch.float64):
        self.ckpt = Checkpoint(path)
        self.path = self.ckpt.path
        self.config = self.ckpt.config
        self.adapter = adapter_for(self.config)
        self.shape = self.adapter.shape(self.config)
        self.spec = build_spec(self.shape)
        self.dtype = self.ckpt.dtype()  # the storage dtype (what outputs are written in)
        self.compute_dtype = dtype
        self._names = StoredNames(self.adapter, self.ckpt)
        _check_tensors(self.ckpt, self.shape, self._names)
        self.meta = json.loads((self.path / "symmerge.json").read_text()) if (self.path / "symmerge.json").is_file() else {}

    def at_dtype(self, dtype: torch.dtype) -> LazyModel:
        """The same checkpoint read in another precision (shares the open files; nothing is read)."""
        other = copy.copy(self)
        other.compute_dtype = dtype
        return other

    def get(self, name: str, *default) -> torch.Tensor:
        if name not in self._names:
            if default:
                return default[0]
            raise SymmergeError(f"{self.path}: tensor {name} is missing; the checkpoint does not match its config.json")
        # a copy of its own (`adapters.base.Getter`): a tensor as safetensors returns it shares its memory with
        # every other read of it from the same open file
        t = self._names.get(name).to(self.compute_dtype, copy=True)
        # a sum is finite when every entry is (the exact check runs only if it is not: a sum can overflow)
        if not math.isfinite(float(t.sum())) and not torch.isfinite(t).all():
            raise SymmergeError(f"{self.path}: tensor {name} contains NaN or Inf; the checkpoint is broken")
        return t

    def part(self, key) -> Params:
        """One part (see `part_keys`): the embeddings, block `key`, or the final norm and head; then the
        files are closed."""
        try:
            if key == "embed":
                return self.adapter.embed_to_canonical(self.get, self.shape)
            if key == "final":
                return self.adapter.final_to_canonical(self.get, self.shape)
            return self.adapter.block_to_canonical(self.get, self.shape, key)
        finally:
            self.ckpt.close()

    def as_model(self) -> Model:
        """Everything in memory (for small models)."""
        return read_whole(self)


def read_whole(source: ModelParts) -> Model:
    """Every part of `source` (a `LazyModel`, an expanded one) read into one `Model` in memory."""
    params = {k: v for key in part_keys(source.shape) for k, v in source.part(key).items()}
    return Model(source.path, source.config, source.adapter, source.shape, source.spec, params, source.dtype,
                 dict(source.meta))


def load_model(path) -> Model:
    """A checkpoint folder in canonical form, in memory."""
    return LazyModel(path).as_model()


def export_state_dict(model: Model, params: dict[str, torch.Tensor] | None = None, dtype=None, gauge=None,
                      tie: bool = False):
    """(config, HF state dict) for canonical `params` (default: the model's own), cast once to `dtype`;
    in the norm gauge of a reference (`gauge.Gauge`) if `gauge` is given, else in canonical form. With
    `tie`, the head is tied where `gauge.tied_scale` allows it (for files: a model built once and fed
    other parameters, as the evaluators do, must stay untied)."""
    from .gauge import export_params

    params = model.params if params is None else params
    params, hf_norms, tied = export_params(model.adapter, model.shape, params, gauge, tie)
    config = model.adapter.export_config(model.config, model.shape, params)
    config.tie_word_embeddings = tied
    sd = model.adapter.from_canonical(params, model.shape)
    sd.update({k: v for k, v in hf_norms.items() if k in sd})
    sd = keep_expected(sd, config, model.shape.hf_class)
    dtype = dtype or model.dtype
    return config, {k: v.to(dtype=dtype, copy=True).contiguous() for k, v in sd.items()}


def keep_expected(sd: dict[str, torch.Tensor], config, class_name: str, partial: bool = False) -> dict[str, torch.Tensor]:
    """The tensors a stock checkpoint of the HF class stores (`expected_tensors`); a dropped one must be zero (an
    absent bias) or, tied to a kept one (`tied_copies`), equal to it.

    With `partial`, `sd` is one part of the model (a block) and missing tensors are not an error."""
    expected, ties = expected_tensors(config, class_name), tied_copies(config, class_name)
    for k, v in sd.items():
        if k in expected:
            continue
        if k in ties and ties[k] in sd:
            if not torch.equal(v, sd[ties[k]]):
                raise SymmergeError(f"internal: {class_name} ties {k} to {ties[k]}, but the export gives them different values")
        elif bool(v.detach().ne(0).any()):
            raise SymmergeError(f"internal: {class_name} has no {k}, but the export needs it non-zero")
    missing = [k for k in expected if k not in sd]
    if missing and not partial:
        raise SymmergeError(f"internal: export of {class_name} lacks {missing[:3]}")
    return {k: sd[k] for k in expected if k in sd}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Modules built inside make their buffers as `from_pretrained(dtype=dtype)` makes them: the default dtype is
    `dtype` meanwhile (a buffer made from a Python number, e.g. Gemma's embedding scale sqrt(d), is then exact in
    float64 instead of a float32 value widened)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_hf_model(config, state_dict: dict[str, torch.Tensor], class_name: str):
    """A stock HF model holding exactly `state_dict` (strict: every parameter must be given), its buffers made as
    `from_pretrained(dtype=...)` makes them in the state dict's dtype."""
    from transformers.initialization import no_init_weights

    dtype = next(iter(state_dict.values())).dtype
    with no_init_weights(), default_dtype(dtype):  # the weights are overwritten below: no random initialisation
        model = hf_class(class_name)(runs_in(config, dtype))
    model.to(dtype)
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def reference_gauge(reference, like=None):
    """The norm gauge (`gauge.Gauge`) of the checkpoint folder or `LazyModel` `reference`, or None where it
    cannot be used (see `gauge.Gauge.of`). Lives here so that gauge.py needs nothing of this module.

    `like`: the model (in memory or lazy) the outputs are written as. Where its shape is not the reference's
    own (the reference was expanded into a wider config, `expansion.widest`), the reference's norms have the
    narrow width and no gauge of it exists there but canonical form: None. Canonical form is the gauge of
    the reference so expanded (`expand` folds its norms into the readers and writes unit norms)."""
    from .gauge import Gauge

    ref = LazyModel(reference) if isinstance(reference, (str, Path)) else reference
    if like is not None and like.shape != ref.shape:
        print(f"symmerge: {ref.path} is expanded into a wider config: writing the outputs in canonical form (unit "
              "norm weights), the gauge in which `symmerge expand` writes it", file=sys.stderr)
        ref.ckpt.close()
        return None
    return Gauge.of(ref)


def save_model(model: Model, params: dict[str, torch.Tensor], out, force: bool = False, dtype=None,
               extra: dict | None = None, gauge=None, side: dict[str, str] | None = None) -> Path:
    """Write canonical `params` as a stock HF checkpoint of the model's class, atomically (in the
    gauge of a reference if `gauge` is given: see `gauge.py`); `side`: more files (name -> text) in OUT;
    `extra`: this operation's record for symmerge.json (`provenance.write_metadata`, over the model's own)."""
    out = prepare_output(out, force)
    config, sd = export_state_dict(model, params, dtype, gauge, tie=True)
    with AtomicFolder(out) as tmp:
        config.architectures = [model.shape.hf_class]
        config.save_pretrained(tmp)
        write_weights(tmp, model.adapter.saved(sd))
        if model.path is not None:
            copy_side_files(model.path, tmp)
        if extra is not None:
            write_metadata(tmp, extra, model.meta)
        for name, text in (side or {}).items():
            (tmp / name).write_text(text)
    return out
