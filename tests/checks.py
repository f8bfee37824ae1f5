"""One rule for "these compute the same function": logits agree to a tolerance derived from the dtype.

    tolerance = 1e3 · finfo(dtype).eps · max(1, max |reference|)

The dtype is the precision the forward really runs in: the weights' dtype, but at most float32 for
the stock classes whose norms compute in float32 whatever the weights' dtype (Llama, Mistral, Ministral 3, Granite,
Qwen2, Qwen3, Mixtral, OLMoE, Qwen3-MoE, Phi-3, Gemma, OLMo-2's and OLMo-3's RMSNorm (the routers' softmax too), OLMo's LayerNorm cast to
float32 and back). Float64 models of the other classes (GPT-2, GPT-NeoX, ViT) agree to float64
precision, so a flat 1e-4 would be eight orders too loose.
"""

from __future__ import annotations

import torch

from factories import logits

#: `config.model_type`s whose stock forward normalises in float32
NORM_IN_FP32 = {"llama", "mistral", "ministral3", "granite", "qwen2", "seed_oss", "smollm3", "qwen3", "olmo", "olmo2", "olmo3", "exaone4",
                "mixtral", "phi3", "olmoe", "granitemoe", "cohere", "qwen2_moe", "qwen3_moe", "gemma", "gemma2",
                "gemma3_text"}


def precision(model) -> torch.dtype:
    """The dtype a stock HF model's logits are exact to (see the module docstring)."""
    dtype = next(model.parameters()).dtype
    if model.config.model_type in NORM_IN_FP32 and torch.finfo(dtype).eps < torch.finfo(torch.float32).eps:
        return torch.float32
    return dtype


def tolerance(dtype: torch.dtype, ref: torch.Tensor, ulps: float = 1e3) -> float:
    return ulps * torch.finfo(dtype).eps * max(1.0, float(ref.abs().max()))


def _outputs(x, inputs):
    return x if torch.is_tensor(x) else logits(x, inputs)


def _dtype(dtype, *xs) -> torch.dtype:
    if dtype is not None:
        return dtype
    models = [x for x in xs if not torch.is_tensor(x)]
    if not models:
        raise ValueError("comparing logits tensors: pass the dtype they were computed in")
    return max((precision(m) for m in models), key=lambda d: torch.finfo(d).eps)  # the coarser one


def _measure(x, ref, inputs, dtype, ulps=1e3):
    a, b = _outputs(x, inputs), _outputs(ref, inputs)
    assert a.shape == b.shape, f"logits of shape {tuple(a.shape)} vs {tuple(b.shape)}"
    d = _dtype(dtype, x, ref)
    return float((a.double() - b.double()).abs().max()), tolerance(d, b, ulps), d, float(b.abs().max())


def gap(x, ref, inputs=None, dtype=None) -> float:
    """max |x - ref| over the logits, in tolerances. x, ref: models (run on `inputs`) or logits tensors."""
    diff, tol, _, _ = _measure(x, ref, inputs, dtype)
    return diff / tol


def assert_same_function(x, ref, inputs=None, dtype=None, what: str = "outputs", ulps: float = 1e3) -> None:
    """x computes ref's function: logits within the dtype's tolerance (the message says by how much not)."""
    diff, tol, d, scale = _measure(x, ref, inputs, dtype, ulps)
    assert diff <= tol, (f"{what}: logits differ by {diff:.3e} (max |ref| {scale:.3g}), {diff / tol:.3g}x the "
                         f"{d} tolerance {tol:.3e}")


def assert_different_function(x, ref, inputs=None, dtype=None, factor: float = 100.0, what: str = "outputs") -> None:
    """Negative control: x's logits differ from ref's by more than `factor` tolerances."""
    g = gap(x, ref, inputs, dtype)
    assert g > factor, f"{what}: logits within {g:.3g} tolerances of the reference (a negative control needs > {factor:g})"


def stock(folder):
    """The stock HF model saved in `folder`, in its saved dtype."""
    import json

    import transformers as T

    arch = json.loads((folder / "config.json").read_text())["architectures"][0]
    return getattr(T, arch).from_pretrained(folder, dtype="auto").eval()


def assert_reported_gap(row: dict, batch: dict) -> None:
    """An output report row {input, output, max_logit_diff}: OUT computes its input's function (stock
    `from_pretrained` of both, here), and the reported gap is within the same tolerance. Negative control: where
    OUT's first attention reader moved, OUT with that reader as its input has it computes another function."""
    from pathlib import Path

    source, output = stock(Path(row["input"])), stock(Path(row["output"]))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    ref = logits(source, inputs)
    assert_same_function(output, ref, inputs, dtype=precision(source), what=row["output"])
    tol = tolerance(precision(source), ref)
    assert row["max_logit_diff"] <= tol, f"reported gap {row['max_logit_diff']:.3e} > tolerance {tol:.3e}"
    if _reader_moved(output, source):  # else that reader is its input's: nothing to put back
        assert_different_function(with_tensor_of(output, source), ref, inputs, dtype=precision(source),
                                  what=f"{row['output']} with one reader as its input has it")


def _reader_key(sd: dict, layer: int = 0) -> str:
    names = ("q_proj.weight", "qkv_proj.weight", "query.weight", "c_attn.weight", "query_key_value.weight")
    return next(k for k in sd if f".{layer}." in k and k.endswith(names))


def _reader_moved(model, source) -> bool:
    """Whether `with_tensor_of(model, source)` replaces a tensor moved by over 10% of its norm."""
    sd, ref = model.state_dict(), source.state_dict()
    key = _reader_key(sd)
    return float((sd[key].double() - ref[key].double()).norm()) > 0.1 * float(ref[key].double().norm())


def with_tensor_of(model, other, layer: int = 0):
    """A copy of `model` whose attention input projection in `layer` is `other`'s: one reader of the
    residual stream left as `other` has it (the negative control for an action that missed a tensor)."""
    import copy

    out = copy.deepcopy(model)
    sd = out.state_dict()
    key = _reader_key(sd, layer)
    out.load_state_dict({**sd, key: other.state_dict()[key]})
    return out

