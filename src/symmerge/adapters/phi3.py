"""Phi-3 (`Phi3ForCausalLM`, Phi-3/3.5/4-mini): the Llama layout with fused projections and partial rotary.

`self_attn.qkv_proj` holds q, k and v stacked along its rows (`[(H + 2 KV) d_head, d]`, in that order) and
`mlp.gate_up_proj` the gate's rows, then the up projection's (`gate, up = gate_up_proj(x).chunk(2)`). They are
read as Llama's separate projections (`unfused`: the stock names sliced out of the fused tensors) and fused
again on export, so the canonical tensors and the group are Llama's: RMSNorm admits all of O(d), the residual
scale, head and FFN permutations, GLU scale and OV maps. `partial_rotary_factor` (Phi-4-mini: 0.75) rotates the
first `rotary_dims` of each head by `rotate_half`: a scaled rotation per rotary pair, a full block on the rest.

RoPE scalings: Phi-3 knows `default` and `longrope` (`su` and `yarn` are read as `longrope`), which picks the
short or the long frequency factors by the sequence length. The group holds for both: a QK map acts on each
rotary pair as a scaled rotation, which commutes with a rotation of the pair by any angle, and longrope's
cos/sin factor multiplies q's and k's rotary dims alike (tested at both lengths). What needs one fixed set of
frequencies, placing a narrow head's pairs in a wider head (`expand`), refuses longrope (`Adapter.rotary_frequencies`).
"""

from __future__ import annotations

import re

import torch

from ..algebra.shape import ModelShape
from .llama import LlamaAdapter

_QKV = re.compile(r"^(?P<p>.+\.self_attn)\.(?P<n>[qkv])_proj\.(?P<t>weight|bias)$")
_GATE_UP = re.compile(r"^(?P<p>.+\.mlp)\.(?P<n>gate|up)_proj\.(?P<t>weight|bias)$")


def _qkv_rows(s: ModelShape) -> list[int]:
    return [s.n_heads * s.d_head, s.n_kv_heads * s.d_head, s.n_kv_heads * s.d_head]


def unfused(get, s: ModelShape):
    """`get` under Llama's names: q, k, v sliced out of `qkv_proj`, gate and up out of `gate_up_proj`."""
    def g(name, *default):
        if m := _QKV.match(name):
            t = get(f"{m['p']}.qkv_proj.{m['t']}", *default)
            return None if t is None else t.split(_qkv_rows(s))["qkv".index(m["n"])]
        if m := _GATE_UP.match(name):
            t = get(f"{m['p']}.gate_up_proj.{m['t']}", *default)
            return None if t is None else t.chunk(2)[("gate", "up").index(m["n"])]
        return get(name, *default)
    return g


def fused(sd: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    """Block i's Llama-named tensors `sd` with q, k, v fused into `qkv_proj` and gate, up into `gate_up_proj`."""
    out, hf = dict(sd), f"model.layers.{i}"
    for fused_name, parts in (("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                              ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj"))):
        for t in ("weight", "bias"):
            out[f"{hf}.{fused_name}.{t}"] = torch.cat([out.pop(f"{hf}.{p}.{t}") for p in parts])
    return out


class Phi3Adapter(LlamaAdapter):
    name = "phi3"
    hf_classes = ("Phi3ForCausalLM",)
    function_keys = ("sliding_window",)

    def block_to_canonical(self, get, s, i):
        return super().block_to_canonical(unfused(get, s), s, i)

    def block_from_canonical(self, params, s, i):
        return fused(super().block_from_canonical(params, s, i), i)
