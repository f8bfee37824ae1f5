"""Weight matching at Pythia shapes: time per sweep and per step kind, peak memory, planted recovery.

Synthetic float64 canonical weights of GPT-NeoX shape (LayerNorm: the rotation fixes the ones vector;
partial rotary: 25% of each head), a planted element of the selected families, then `weight_match`.
The implementation holds both models in memory (float64), so the full 1.4B shape (2 x 11 GB) does
not fit a 23 GB machine: use `--layers` and scale the per-layer figures (the residual steps grow with
the parameter count, the others per layer).

    PYTHONPATH=src python benchmarks/weight_matching_scale.py --shape pythia-410m --layers 24 --sweeps 2
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from symmerge.apply import apply
from symmerge.match.weight import weight_match
from symmerge.shape import ModelShape
from symmerge.spec import build_spec, random_element

SHAPES = {"pythia-410m": (1024, 24, 16), "pythia-1.4b": (2048, 24, 16)}  # d_model, layers, heads


def shape(name: str, layers: int | None) -> ModelShape:
    d, n_layers, h = SHAPES[name]
    dh = d // h
    return ModelShape(arch="gpt_neox", hf_class="GPTNeoXForCausalLM", d_model=d, n_layers=layers or n_layers,
                      n_heads=h, n_kv_heads=h, d_head=dh, d_mlp=4 * d, vocab=50304, norm="layernorm", gated=False,
                      parallel=True, rotary_dims=dh // 4, rotary_layout="half", tied=False, eps=1e-5,
                      eps_in_config=True, activation="gelu")


def random_params(s: ModelShape, gen: torch.Generator) -> dict[str, torch.Tensor]:
    r = lambda *sh: torch.randn(*sh, generator=gen, dtype=torch.float64) / s.d_model**0.5  # noqa: E731
    d, h, dh, m = s.d_model, s.n_heads, s.d_head, s.d_mlp
    p = {"embed.W_E": r(s.vocab, d), "head.W_U": r(s.vocab, d), "final.b_norm": r(d),
         "norm.eps": torch.tensor(s.eps, dtype=torch.float64)}
    for i in range(s.n_layers):
        b = f"blocks.{i}"
        p.update({f"{b}.attn.W_Q": r(h, 1, dh, d), f"{b}.attn.b_Q": r(h, 1, dh), f"{b}.attn.W_K": r(h, dh, d),
                  f"{b}.attn.b_K": r(h, dh), f"{b}.attn.W_V": r(h, dh, d), f"{b}.attn.b_V": r(h, dh),
                  f"{b}.attn.W_O": r(h, 1, d, dh), f"{b}.attn.b_O": r(d), f"{b}.mlp.W_in": r(m, d),
                  f"{b}.mlp.b_in": r(m), f"{b}.mlp.W_out": r(d, m), f"{b}.mlp.b_out": r(d)})
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=SHAPES, default="pythia-410m")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the real model (default: all)")
    ap.add_argument("--sweeps", type=int, default=2)
    ap.add_argument("--groups", default=None, help="comma-separated families (default all)")
    args = ap.parse_args()
    fams = args.groups.split(",") if args.groups else None
    s = shape(args.shape, args.layers)
    spec = build_spec(s)
    t0 = time.perf_counter()
    A = random_params(s, torch.Generator().manual_seed(0))
    B = apply(spec, random_element(spec, torch.Generator().manual_seed(1), fams), A)
    n = sum(t.numel() for t in A.values())
    print(f"{args.shape} x {s.n_layers} layers: {n / 1e6:.0f}M parameters, built in {time.perf_counter() - t0:.1f}s")
    res = weight_match(spec, A, B, fams, max_iters=args.sweeps, progress=True)
    g_b = apply(spec, res.g, B)
    err = (sum(float(((g_b[k] - A[k]) ** 2).sum()) for k in A) / sum(float((A[k] ** 2).sum()) for k in A)) ** 0.5
    print(f"sweeps {len(res.history) - 1}, {res.seconds:.1f}s ({res.seconds / (len(res.history) - 1):.1f}s per sweep)")
    print("seconds by step kind: " + ", ".join(f"{k} {v:.1f}" for k, v in res.extra["seconds_by_step_kind"].items()))
    print(f"similarity {res.history[0]:.4f} -> {res.history[-1]:.12f}; relative error of g.B vs A {err:.2e}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")


if __name__ == "__main__":
    main()
