"""Weight matching: planted elements are recovered, the objective never decreases, outputs keep B's function.

Planted recovery runs at the canonical level in float64 for every architecture with an adapter (real
tiny checkpoints from `factories`) and for synthetic shapes that exercise what GPT-2 lacks (GQA,
RoPE, partial rotary, SwiGLU scales, clip_qkv signed permutations, no residual scale).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import transformers as T

from checks import assert_different_function, assert_same_function, with_tensor_of
from factories import ARCHS, example_inputs, make_config, make_model, rel_distance, save_model
from symmerge import SymmergeError, cli
from symmerge.adapters import ADAPTERS
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import inverse, random_element
from symmerge.algebra.shape import ModelShape
from symmerge.algebra.spec import Action, Spec, build_spec
from symmerge.match.summary import summarize
from symmerge.match.weight import weight_match
from symmerge.store.compatible import check_compatible
from symmerge.store.model import build_hf_model, export_state_dict, load_model

FAMILY_SETS = {"all": None, "permutations": ["head_perm", "ffn_perm"], "residual": ["residual_rotation"]}


SUPPORTED = [a for a in ARCHS if make_config(a).architectures[0] in ADAPTERS]  # the stock class the checkpoint names


def _shape(arch, **kw) -> ModelShape:
    base = dict(arch=arch, hf_class="X", d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, d_head=8, d_mlp=40,
                vocab=61, norm="rmsnorm", gated=False, parallel=False, rotary_dims=0, rotary_layout="none",
                tied=False, eps=1e-5, eps_in_config=True, activation="silu")
    base.update(kw)
    return ModelShape(**base)


SYNTHETIC = {
    # GQA (2 query heads per KV head), full RoPE, SwiGLU with its scales, RMSNorm: the full O(d)
    "llama_gqa": _shape("llama", n_kv_heads=2, gated=True, rotary_dims=8, rotary_layout="half"),
    # partial rotary (a full block on the other 4 dims), LayerNorm: the rotation fixes the ones vector
    "neox_partial": _shape("gpt_neox", norm="layernorm", parallel=True, rotary_dims=4, rotary_layout="half",
                           activation="gelu"),
    # clip_qkv: signed permutations and quarter turns; eps hard-coded: no residual scale
    "olmo_clip": _shape("olmo", norm="layernorm", gated=True, rotary_dims=8, rotary_layout="half",
                        eps_in_config=False, clip_qkv=0.3),
}


def synthetic_params(s: ModelShape, seed: int) -> dict[str, torch.Tensor]:
    """Random canonical tensors of every kind the spec knows for this shape (see canonical.py)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    d, nkv, q, dh, m = s.d_model, s.n_kv_heads, s.q_per_kv, s.d_head, s.d_mlp
    p = {"embed.W_E": r(s.vocab, d), "head.W_U": r(s.vocab, d), "norm.eps": torch.tensor(s.eps, dtype=torch.float64)}
    if s.centred:
        p["final.b_norm"] = r(d)
    for i in range(s.n_layers):
        b = f"blocks.{i}"
        p.update({f"{b}.attn.W_Q": r(nkv, q, dh, d), f"{b}.attn.b_Q": r(nkv, q, dh), f"{b}.attn.W_K": r(nkv, dh, d),
                  f"{b}.attn.b_K": r(nkv, dh), f"{b}.attn.W_V": r(nkv, dh, d), f"{b}.attn.b_V": r(nkv, dh),
                  f"{b}.attn.W_O": r(nkv, q, d, dh), f"{b}.attn.b_O": r(d), f"{b}.mlp.W_in": r(m, d),
                  f"{b}.mlp.b_in": r(m), f"{b}.mlp.W_out": r(d, m), f"{b}.mlp.b_out": r(d)})
        if s.gated:
            p.update({f"{b}.mlp.W_gate": r(m, d), f"{b}.mlp.b_gate": r(m)})
    return p


def monotone(history: list[float]) -> bool:
    """Never decreasing, up to the rounding of the objective (evaluated from statistics: ~1e-16 of ||A||^2)."""
    return all(y >= x - 1e-13 for x, y in zip(history, history[1:]))


def test_monotone_detects_a_decrease():
    assert monotone([0.1, 0.5, 0.5 - 1e-15, 0.9]) and not monotone([0.1, 0.5, 0.4999, 0.9])


def _planted(spec: Spec, params: dict, families, seed: int):
    g = random_element(spec, torch.Generator().manual_seed(seed), families)
    B = apply(spec, g, params)
    return B, weight_match(spec, params, B, families, max_iters=10)


# --- planted recovery ------------------------------------------------------------------------------


@pytest.mark.parametrize("fams", FAMILY_SETS)
@pytest.mark.parametrize("arch", SUPPORTED)
def test_planted_recovery_real_architectures(arch, fams, tmp_path):
    model = load_model(save_model(make_model(arch, 0), tmp_path / "a"))
    B, res = _planted(model.spec, model.params, FAMILY_SETS[fams], seed=5)
    assert rel_distance(B, model.params) > 0.1, "the planted element must move the weights"
    assert rel_distance(apply(model.spec, res.g, B), model.params) <= 1e-5
    assert monotone(res.history)


@pytest.mark.parametrize("fams", FAMILY_SETS)
@pytest.mark.parametrize("name", SYNTHETIC)
def test_planted_recovery_synthetic_shapes(name, fams):
    shape = SYNTHETIC[name]
    spec, params = build_spec(shape), synthetic_params(shape, 3)
    families = [f for f in (FAMILY_SETS[fams] or spec.families()) if f in spec.families()]
    B, res = _planted(spec, params, families, seed=11)
    assert rel_distance(B, params) > 0.1
    assert rel_distance(apply(spec, res.g, B), params) <= 1e-5
    assert monotone(res.history)


def test_negative_controls_do_not_recover():
    """The recovered element with a shuffled permutation, or acting through a wrong action, misses A."""
    shape = SYNTHETIC["llama_gqa"]
    spec, params = build_spec(shape), synthetic_params(shape, 3)
    B, res = _planted(spec, params, None, seed=11)
    assert rel_distance(apply(spec, res.g, B), params) <= 1e-5
    shuffled = dict(res.g)
    shuffled["blocks.0.ffn"] = res.g["blocks.0.ffn"].roll(1)
    assert rel_distance(apply(spec, shuffled, B), params) > 1e-2
    # the QK map acting on W_K by G instead of G^{-T}
    wrong = {k: [Action(a.group, a.axis, "g", a.batch_axes) if a.group == "blocks.1.qk" else a for a in v]
             for k, v in spec.actions.items()}
    assert rel_distance(apply(Spec(spec.shape, spec.groups, wrong), res.g, B), params) > 1e-2
    # and the inverse of the found element is not the found element
    assert rel_distance(apply(spec, inverse(spec, res.g), B), params) > 1e-2


# --- end to end through the CLI ------------------------------------------------------------------


def _cli(*argv) -> int:
    """The CLI's exit status (argparse refuses bad option values itself, exiting with 2)."""
    try:
        return cli.main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


CLI_ARCHS = ("gpt2", "llama", "qwen3", "olmo2", "phi", "phi3", "gemma", "gemma2", "gemma3")


@pytest.mark.parametrize("arch", [a for a in CLI_ARCHS if a in SUPPORTED])
def test_cli_transform_then_align_recovers_a(tmp_path, arch):
    a = save_model(make_model(arch, 0), tmp_path / "a")
    assert _cli("transform", a, "-o", tmp_path / "b", "--seed", 4) == 0
    assert _cli("align", a, tmp_path / "b", "-o", tmp_path / "c", "--json", tmp_path / "r.json", "--groups", "all") == 0
    A, B, C = (load_model(tmp_path / x) for x in ("a", "b", "c"))
    assert rel_distance(C.params, A.params) <= 1e-5
    hf_b = T.AutoModelForCausalLM.from_pretrained(tmp_path / "b").eval()
    hf_c = T.AutoModelForCausalLM.from_pretrained(tmp_path / "c").eval()
    x = example_inputs(arch)
    assert_same_function(hf_c, hf_b, x, what=f"{arch} aligned")
    assert_different_function(with_tensor_of(hf_c, hf_b), hf_b, x, what="one reader left as B has it")
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["objective"][-1] > 1 - 1e-10 and rep["objective"][0] < 0.5
    assert monotone(rep["objective"])
    # the report counts what the planted element moved (transform draws it from the seed)
    truth = summarize(A.spec, inverse(A.spec, random_element(A.spec, torch.Generator().manual_seed(4))), list(A.spec.groups))
    assert rep["families"]["ffn_perm"] == truth["families"]["ffn_perm"]
    assert rep["families"]["head_perm"] == truth["families"]["head_perm"]
    assert rep["families"]["ffn_perm"]["units_moved"] > 0


@pytest.mark.parametrize("arch", [a for a in ("gpt2", "llama", "qwen3", "olmo2") if a in SUPPORTED])
def test_align_independent_models_keeps_b_function(tmp_path, arch):
    """Two unrelated models: the objective rises monotonically and OUT still computes B's function."""
    a = save_model(make_model(arch, 0), tmp_path / "a")
    b = save_model(make_model(arch, 1), tmp_path / "b")
    assert _cli("align", a, b, "-o", tmp_path / "c", "--json", tmp_path / "r.json", "--max-iters", 6) == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    hist = rep["objective"]
    assert len(hist) >= 3 and hist[-1] > hist[0]
    assert monotone(hist)
    C = load_model(tmp_path / "c")
    config, sd = export_state_dict(C)
    out = build_hf_model(config, sd, C.shape.hf_class)
    x = example_inputs(arch)
    hf_b = T.AutoModelForCausalLM.from_pretrained(b).eval()
    # float32 precision for Llama: its RMSNorm computes in float32 whatever the weights' dtype
    assert_same_function(out, hf_b, x, what=f"{arch} aligned")
    assert_different_function(out, T.AutoModelForCausalLM.from_pretrained(a).eval(), x, what="it is not A")
    assert_different_function(with_tensor_of(out, hf_b), hf_b, x, what="one reader left as B has it")


# --- bad input -------------------------------------------------------------------------------------


def _gpt2(tmp_path, name, **kw):
    cfg = dict(n_embd=24, n_layer=2, n_head=3, vocab_size=61, n_positions=32, bos_token_id=0, eos_token_id=0)
    cfg.update(kw)
    torch.manual_seed(0)
    m = T.GPT2LMHeadModel(T.GPT2Config(**cfg)).to(torch.float64)
    m.config.architectures = ["GPT2LMHeadModel"]
    return save_model(m, tmp_path / name)


# widths that differ one way only are expanded (tests/test_expand_align.py); these differ both ways
@pytest.mark.parametrize("change,word", [({"n_embd": 30, "n_inner": 50}, "d_model"), ({"vocab_size": 67}, "vocab"),
                                         ({"n_layer": 3}, "n_layers"), ({"n_embd": 21, "n_inner": 120}, "d_mlp")])
def test_mismatched_models_fail_cleanly(tmp_path, capsys, change, word):
    a, b = _gpt2(tmp_path, "a"), _gpt2(tmp_path, "b", **change)
    assert _cli("align", a, b, "-o", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert word in err and "error" in err
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


@pytest.mark.parametrize("other", [a for a in ("llama", "gpt_neox", "vit") if a in SUPPORTED])
def test_different_architectures_fail_cleanly(tmp_path, capsys, other):
    a = save_model(make_model("gpt2", 0), tmp_path / "a")
    b = save_model(make_model(other, 0), tmp_path / "b")
    assert _cli("align", a, b, "-o", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "arch" in err and "gpt2" in err and other.split("_")[0] in err
    assert not (tmp_path / "out").exists()


def test_different_architectures_are_named():
    sa, sb = SYNTHETIC["llama_gqa"], SYNTHETIC["neox_partial"]
    a = SimpleNamespace(shape=sa, params=synthetic_params(sa, 0))
    b = SimpleNamespace(shape=sb, params=synthetic_params(sb, 0))
    with pytest.raises(SymmergeError, match="arch"):
        check_compatible(a, b)
    check_compatible(a, a)  # and the same model passes


def test_unknown_family_and_bad_iters_fail(tmp_path, capsys):
    a = _gpt2(tmp_path, "a")
    assert _cli("align", a, a, "-o", tmp_path / "o1", "--groups", "glu_scale") == 2
    assert "glu_scale" in capsys.readouterr().err
    assert _cli("align", a, a, "-o", tmp_path / "o2", "--max-iters", 0) == 2
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_cli_default_leaves_the_residual_scale_alone(tmp_path):
    """Without --groups the residual scale is not matched (it shrinks for unrelated models); 'all' matches it."""
    a = save_model(make_model("gpt2", 0), tmp_path / "a")
    b = save_model(make_model("gpt2", 1), tmp_path / "b")
    assert _cli("align", a, b, "-o", tmp_path / "c", "--json", tmp_path / "r.json", "--max-iters", 3) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert "residual_scale" not in report["groups_selected"]
    assert _cli("align", a, b, "-o", tmp_path / "d", "--json", tmp_path / "s.json", "--max-iters", 3, "--groups", "all") == 0
    assert "residual_scale" in json.loads((tmp_path / "s.json").read_text())["groups_selected"]
