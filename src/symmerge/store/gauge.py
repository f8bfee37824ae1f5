"""Export in the gauge of a reference: canonical tensors written with a reference checkpoint's norm parameters.

Canonical form writes every norm with unit weight and zero bias (`canonical.py`). Two checkpoints in
different gauges compute what they compute, but do not average tensor by tensor: behind a norm of
weight γ a reader W acts as W·diag(γ), and the average of products is not the product of averages.
Writing an aligned B in the gauge of the stock A makes a plain average by any tool (mergekit `linear`)
equal symmerge's interpolation of the canonical forms. For a norm read by W (canonical W_B, b_B):

    γ := γ_A,  β := β_A,  W := W_B diag(γ_A)⁻¹,  b := b_B − W β_A

so W (γ_A n + β_A) + b = W_B n + b_B: the same function, and (W_A + W)/2 behind γ_A is the canonical
average (W_A γ_A + W_B)/2 (with the biases likewise). A final norm whose bias cannot be folded (the
head has no bias: `final.b_norm` holds the canonical β/γ): β := γ_A ⊙ b_norm, head W_U diag(γ_A)⁻¹.
Mean-free writers need nothing: LayerNorm removes the stream's mean either way, and every reader of
the stream sits behind a norm.

Where it fails: a zero in γ_A cannot be divided by. `Gauge.of` (`model.reference_gauge`) then returns None (the caller writes
canonical form and says so). Norms without parameters (OLMo-1) have no gauge: nothing changes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..runtime.row_blocks import row_slices

Params = dict[str, torch.Tensor]


def reader_slots(s, i: int) -> dict[str, tuple[tuple[str, str | None], ...]]:
    """(weight, bias) canonical names of the readers of block i's two norms, by slot (bias None: the reader has
    none: a mixture of experts' router, experts and shared expert)."""
    p = f"blocks.{i}"
    attn = tuple((f"{p}.attn.W_{n}", f"{p}.attn.b_{n}") for n in "QKV")
    mlp = ((f"{p}.mlp.W_in", f"{p}.mlp.b_in"),) + (((f"{p}.mlp.W_gate", f"{p}.mlp.b_gate"),) if s.gated else ())
    if s.experts_in(i):  # the routers and every expert's up and gate, [.., d_model]: the residual axis last
        shared = ("shared_router", "shared_in", "shared_gate") if s.d_shared else ()
        mlp = tuple((f"{p}.moe.W_{n}", None) for n in ("router", "in", "gate", *shared))
    return {f"{p}.ln1": attn, f"{p}.ln2": mlp}


def unfold_reader(w: torch.Tensor, b: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None):
    """The reader (W diag(γ)⁻¹, b − W' β) that behind `n * γ + β` computes what (W, b) computes behind n."""
    w_new = w / gamma  # the residual (last) axis
    b_new = b if beta is None else b - w_new @ beta
    return w_new, b_new


@dataclass
class Gauge:
    """The norm parameters of a reference checkpoint, by slot ("blocks.i.ln1", "blocks.i.ln2", "final"):
    (HF prefix, the stored weight, β or None), in float64; the norm's weight γ is `offset` + the stored weight
    (`gamma`), and the stored tensors are what the outputs hold, verbatim."""

    norms: dict[str, tuple[str, torch.Tensor, torch.Tensor | None]]
    source: str = ""
    offset: float = 0.0  # the class's `Adapter.norm_offset`: γ = offset + the stored weight

    def gamma(self, slot: str) -> torch.Tensor:
        """The weight γ the norm of `slot` multiplies by."""
        weight = self.norms[slot][1]
        return self.offset + weight if self.offset else weight

    @classmethod
    def of(cls, ref) -> Gauge | None:
        """The gauge of the reference `ref`, a `model.LazyModel` (`model.reference_gauge` builds one for a
        folder); None (with a line on stderr) where a norm weight is zero, since its readers cannot be
        divided by it."""
        norms, offset = {}, ref.adapter.norm_offset
        for slot, prefix in ref.adapter.norm_names(ref.shape).items():
            gamma, beta = ref.get(f"{prefix}.weight", None), ref.get(f"{prefix}.bias", None)
            if gamma is None:  # a norm without parameters (OLMo-1): nothing to keep
                continue
            if not bool((offset + gamma != 0).all()):
                print(f"symmerge: {ref.path}: {prefix}.weight has zeros; writing the output in canonical form "
                      "(unit norm weights) instead of the reference's gauge", file=sys.stderr)
                ref.ckpt.close()
                return None
            norms[slot] = (prefix, gamma, beta)
        ref.ckpt.close()
        return cls(norms, str(ref.path), offset)

    def canonical(self, params: Params, s) -> tuple[Params, Params]:
        """(readers unfolded, HF norm tensors) for the canonical tensors in `params` (a part or all of a
        model); the HF tensors replace the unit norms that the adapter's export writes."""
        out, hf = dict(params), {}
        for i in range(s.n_layers):
            for slot, readers in reader_slots(s, i).items():
                if slot in self.norms and readers[0][0] in params:
                    (prefix, weight, beta), gamma = self.norms[slot], self.gamma(slot)
                    for w, b in readers:
                        out[w], bias = unfold_reader(params[w], None if b is None else params[b], gamma, beta)
                        if b is not None:
                            out[b] = bias
                    hf.update(_norm_tensors(prefix, weight, beta))
        if "final" in self.norms and "head.W_U" in params:
            self._final(params, out, hf)
        return out, hf

    def _final(self, params: Params, out: Params, hf: Params) -> None:
        (prefix, weight, beta), gamma = self.norms["final"], self.gamma("final")
        if "head.b_U" in params:
            out["head.W_U"], out["head.b_U"] = unfold_reader(params["head.W_U"], params["head.b_U"], gamma, beta)
            hf.update(_norm_tensors(prefix, weight, beta))
            return
        out["head.W_U"] = params["head.W_U"] / gamma
        if "final.b_norm" in params:  # the head has no bias: the norm's bias carries b_norm in A's scale
            out["final.b_norm"] = gamma * params["final.b_norm"]
            hf.update(_norm_tensors(prefix, weight, out["final.b_norm"]))
        else:
            hf.update(_norm_tensors(prefix, weight, None))


def _norm_tensors(prefix: str, weight: torch.Tensor, beta: torch.Tensor | None) -> Params:
    out = {f"{prefix}.weight": weight}
    if beta is not None:
        out[f"{prefix}.bias"] = beta
    return out


def tied_scale(params: Params, s, gauge: Gauge | None = None) -> torch.Tensor | None:
    """The final norm weight γ' with W_U = W_E diag(γ') (to float64 rounding), where the source was tied:
    the output can then be tied (head = embedding behind a final norm of weight γ'). None otherwise.

    It holds after any group element whose residual map is diagonal up to a permutation and signs (a
    permutation, a residual scale) on an RMSNorm model; not after a residual rotation, and not on LayerNorm
    models (the writers are mean-free, the head is not) or where the head has a bias. Under a gauge, γ'
    must also be the reference's final weight (the gauge fixes that norm); else the output stays untied.
    Memory: the embedding and head are compared a few rows at a time (`runtime.row_blocks`: whole products of a
    262,144-row vocabulary would be transients of 2.4 GB each in float64)."""
    if not s.tied or s.centred or "embed.W_E" not in params or "head.W_U" not in params:
        return None
    if "final.b_norm" in params or "head.b_U" in params:
        return None
    e, u = params["embed.W_E"], params["head.W_U"]
    rows = row_slices(e)
    norm2 = sum((e[r] * e[r]).sum(0) for r in rows)
    if not bool((norm2 > 0).all()):
        return None
    g = sum((u[r] * e[r]).sum(0) for r in rows) / norm2
    tol = 1e-9 * max(1.0, max(float(u[r].abs().max()) for r in rows))
    if not bool((g != 0).all()) or max(float((u[r] - e[r] * g).abs().max()) for r in rows) > tol:
        return None
    if gauge is not None and "final" in gauge.norms:
        ref = gauge.gamma("final")
        if float((g - ref).abs().max()) > 1e-9 * max(1.0, float(ref.abs().max())):
            return None
        g = ref
    return g


def export_params(adapter, s, params: Params, gauge: Gauge | None, tie: bool = True) -> tuple[Params, Params, bool]:
    """(canonical params as exported, HF norm tensors replacing the unit norms, tied) for `params` (all
    of a model or one part): in `gauge` if given, and with `tie` tied where `tied_scale` allows it."""
    g = tied_scale(params, s, gauge) if tie else None
    hf_norms = {}
    if gauge is not None:
        if g is not None:  # the head is written as the embedding (below): it is not unfolded, a copy of its size
            params = {k: v for k, v in params.items() if k != "head.W_U"}
        params, hf_norms = gauge.canonical(params, s)
    if g is not None:
        params = {**params, "head.W_U": params["embed.W_E"]}
        final = adapter.norm_names(s).get("final")
        if final is not None:  # the reference's stored weight verbatim, else γ' as the class stores it
            kept = gauge is not None and "final" in gauge.norms
            hf_norms[f"{final}.weight"] = gauge.norms["final"][1] if kept else g - adapter.norm_offset
    return params, hf_norms, g is not None


def export_part(adapter, s, params: Params, gauge: Gauge | None, key) -> Params:
    """HF tensors of one part ("ends" or block index `key`) of canonical `params`, in `gauge` if given."""
    params, hf_norms, _ = export_params(adapter, s, params, gauge)
    sd = adapter.ends_from_canonical(params, s) if key == "ends" else adapter.block_from_canonical(params, s, key)
    for k, v in hf_norms.items():
        if k in sd:
            sd[k] = v
    return sd


MERGEKIT_FILE = "mergekit.yml"


def mergekit_config(models: list, base, dtype: str, weights: list[float] | None = None, notes: tuple[str, ...] = ()) -> str:
    """A mergekit `linear` config of the weighted mean of `models` (checkpoint folders, absolute paths;
    default the midpoint), with `base_model` set so that mergekit takes that model's config instead of
    one of the inputs' at random; `notes`: comment lines under the header."""
    import json as _json

    q = lambda p: _json.dumps(str(p))  # noqa: E731 - a JSON string is a YAML string
    lines = ["# mergekit-yaml mergekit.yml MERGED: the plain average that symmerge's gauge makes equal to",
             "# `symmerge interpolate` at lam 0.5 (the aligned model is written in the gauge of the first)",
             *(f"# {n}" for n in notes),
             "merge_method: linear", f"base_model: {q(base)}", f"dtype: {dtype}", "models:"]
    for m, w in zip(models, weights or [1.0 / len(models)] * len(models)):
        lines += [f"  - model: {q(m)}", "    parameters:", f"      weight: {w!r}"]
    return "\n".join(lines) + "\n"


#: mergekit.yml's note where A ties its head to its embedding (the aligned output is untied unless its residual map
#: is a permutation: `tied_scale`)
TIE_NOTE = ("A ties its head to its embedding. Where the aligned output does not (its config.json says",
            "tie_word_embeddings: false), mergekit merges the head right only where its definition of this class",
            "names that tie; where it infers the layout instead (it logs 'Inferred ... modules') it takes the",
            "output's head alone, and the merge is not the midpoint. `symmerge interpolate A OUT --lam 0.5` is.")


def pair_side_files(reference, output, dtype) -> dict[str, str]:
    """`side_files` of the midpoint of the reference A and an aligned `output` in A's gauge (align by weight,
    activation or learned matching). Its `base_model` is A (mergekit then takes A's config), except where A is
    tied: the output is then taken as untied (see TIE_NOTE's comment), and a tied config would drop its head;
    that config also carries `TIE_NOTE`."""
    from .io import Checkpoint

    tied = bool(getattr(Checkpoint(reference).config, "tie_word_embeddings", False))
    base = Path(output if tied else reference).resolve()
    return side_files([reference, output], base, dtype, notes=TIE_NOTE if tied else ())


def side_files(models: list, base, dtype, weights: list[float] | None = None, notes: tuple[str, ...] = ()) -> dict[str, str]:
    """{"mergekit.yml": the config of the (weighted) mean of `models`} to write beside aligned outputs."""
    name = str(dtype).replace("torch.", "")
    return {MERGEKIT_FILE: mergekit_config([Path(m).resolve() for m in models], base, name, weights, notes)}
