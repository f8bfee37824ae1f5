"""Which models can be interpolated and merged in canonical form.

Canonical tensors of two models with the same `ModelShape` live in the same coordinates (norms
folded, heads explicit), so a merge is plain arithmetic on them (`evaluation.interpolate`); the result
is exported through the adapter as a stock checkpoint. Interpolating after aligning B to A (`g·B`) is
the point of the whole tool.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import SymmergeError
from .model import in_memory

#: shape fields that may differ between two models that are still interpolable
_FREE_FIELDS = ("eps", "tied")


def check_compatible(a, b, name_a: str = "A", name_b: str = "B") -> None:
    """Raise a SymmergeError naming the first mismatch: only models with one symmetry group align or merge.

    `a`, `b`: `Model`s or `LazyModel`s (whose tensors are compared part by part when read)."""
    sa, sb = dataclasses.asdict(a.shape), dataclasses.asdict(b.shape)
    if (sa["arch"], sa["hf_class"]) != (sb["arch"], sb["hf_class"]):
        raise SymmergeError(f"{name_a} is a {sa['hf_class']} (arch {sa['arch']}) and {name_b} a {sb['hf_class']} "
                            f"(arch {sb['arch']}); both must be the same architecture")
    for key in sa:
        if key not in _FREE_FIELDS and sa[key] != sb[key]:
            what = {"vocab": "vocabularies (or classes)", "n_layers": "layer counts", "d_model": "widths",
                    "d_mlp": "FFN widths", "n_heads": "head counts"}.get(key, key)
            raise SymmergeError(f"{name_a} and {name_b} differ in {what}: {key}={sa[key]} vs {sb[key]}; "
                                "only checkpoints of the same architecture and sizes can be aligned or merged")
    check_same_preprocessing(getattr(a, "path", None), getattr(b, "path", None), name_a, name_b)
    if in_memory(a) and in_memory(b):
        check_same_tensors(a.params, b.params, name_a, name_b)


#: files that say how a checkpoint reads its input; two models merged or compared must agree on them
PREPROCESSING = ("tokenizer.json", "preprocessor_config.json")


def check_same_preprocessing(a, b, name_a: str = "A", name_b: str = "B") -> None:
    """Both checkpoint folders read data the same way: equal tokenizer / image-processor files where both
    have one. Two models with equal vocabulary sizes but different tokenizers have rows of the embedding
    that stand for different tokens: aligning, averaging or comparing them is meaningless."""
    if a is None or b is None:
        return
    for name in PREPROCESSING:
        fa, fb = Path(a) / name, Path(b) / name
        if fa.is_file() and fb.is_file() and fa.read_bytes() != fb.read_bytes():
            raise SymmergeError(f"{name_a} and {name_b} have different {name}; they must share their tokenizer / image "
                                "processor (models trained by symmerge on one corpus with one --tokenizer do)")


def check_same_tensors(a: dict, b: dict, name_a: str = "A", name_b: str = "B") -> None:
    """The same canonical tensors on both sides (lazy models are checked part by part as they are read)."""
    only = sorted(set(a) ^ set(b))
    if only:
        where = name_a if only[0] in a else name_b
        raise SymmergeError(f"tensor {only[0]} exists only in {where}; the checkpoints have different parameter sets")


def check_lambda(lam: float, extrapolate: bool = False) -> None:
    if not extrapolate and not 0.0 <= lam <= 1.0:
        raise SymmergeError(f"lambda={lam} is outside [0, 1]; pass --extrapolate to go beyond the endpoints")
