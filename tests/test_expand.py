"""`symmerge expand`: a narrow model written in a wider config computes exactly its function.

Every test architecture x every width change it admits, against the stock `transformers` forward
(float64 weights, tolerance from the dtype: `checks.assert_same_function`), with negative controls
(each map left uncompensated must change the logits) and the refusals of what cannot be expanded.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from checks import assert_different_function, assert_same_function, stock
from factories import ARCHS, example_inputs, make_config, make_model
from symmerge import SymmergeError
from symmerge.adapters import adapter_for
from symmerge.cli import main
from symmerge.store.expansion import ExpandedModel, expand_checkpoint, plan
from symmerge.store.model import LazyModel
from symmerge.store.stream import write_streaming

EPS_KEYS = ("layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps")


def _d_mlp_key(c) -> str:
    """The config key of the FFN width (of each expert's, in a mixture of experts)."""
    return next(k for k in ("moe_intermediate_size", "n_inner", "intermediate_size") if hasattr(c, k))


def _widened(arch: str, d=1, ffn=1, heads=1, kv=None, head_dim=1, eps=1.0):
    """The factory's config of `arch` with widths multiplied (kv: KV-head factor, default = heads)."""
    c = make_config(arch)
    d_mlp = getattr(c, _d_mlp_key(c)) or 4 * c.hidden_size
    c.hidden_size *= d
    setattr(c, _d_mlp_key(c), d_mlp * ffn)
    if hasattr(c, "moe_intermediate_size"):  # the dense layers' width too (Qwen3-MoE's mlp_only_layers)
        c.intermediate_size *= ffn
    if hasattr(c, "shared_expert_intermediate_size"):  # Qwen2-MoE's shared expert
        c.shared_expert_intermediate_size *= ffn
    c.num_attention_heads *= heads
    if getattr(c, "num_key_value_heads", None):
        c.num_key_value_heads *= heads if kv is None else kv
    if getattr(c, "head_dim", None):
        c.head_dim *= head_dim
    for k in EPS_KEYS:
        if hasattr(c, k):
            setattr(c, k, getattr(c, k) * eps)
    return c


def _cases(arch: str) -> dict[str, dict]:
    c = make_config(arch)
    cases = {"d_model": dict(d=2), "ffn": dict(ffn=2), "heads": dict(d=2, heads=2),
             "all": dict(d=2, ffn=2, heads=2, eps=1000.0)}
    if getattr(c, "head_dim", None):
        cases["head_dim"] = dict(head_dim=2)
    if getattr(c, "num_key_value_heads", None) and c.num_key_value_heads < c.num_attention_heads:
        cases["q_per_kv"] = dict(d=2, heads=2, kv=1)
    return cases


ALL_CASES = [(a, k) for a in ARCHS for k in _cases(a)]


@pytest.fixture(scope="module")
def narrow_models(narrow_dirs):
    """The narrow models as stock HF loads them (the reference function)."""
    return {arch: stock(path) for arch, path in narrow_dirs.items()}


@pytest.fixture(scope="module")
def narrow_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("narrow")
    out = {}
    for arch in ARCHS:
        make_model(arch).save_pretrained(root / arch)
        out[arch] = root / arch
    return out


def _wide_dir(tmp_path, config):
    config.save_pretrained(tmp_path / "wide")  # expand reads WIDE's config only
    return tmp_path / "wide"


def _shape(config):
    return adapter_for(config).shape(config)


def _changes_head(arch, case) -> bool:
    return _shape(make_config(arch)).d_head != _shape(_widened(arch, **_cases(arch)[case])).d_head


@pytest.mark.parametrize("arch,case", ALL_CASES)
def test_expand_preserves_the_function(arch, case, narrow_dirs, narrow_models, tmp_path):
    wide = _widened(arch, **_cases(arch)[case])
    refusal = _refusal(arch, case)
    if refusal:
        with pytest.raises(SymmergeError, match=refusal):
            expand_checkpoint(narrow_dirs[arch], _wide_dir(tmp_path, wide), tmp_path / "out")
        assert not (tmp_path / "out").exists()
        return
    out, e = expand_checkpoint(narrow_dirs[arch], _wide_dir(tmp_path, wide), tmp_path / "out")
    got = stock(out)
    for key in ("hidden_size", "num_attention_heads", _d_mlp_key(wide), *EPS_KEYS):
        if hasattr(wide, key):
            assert getattr(got.config, key) == getattr(wide, key), key  # WIDE's config, eps included
    assert type(got).__name__ == wide.architectures[0]
    assert_same_function(got, narrow_models[arch], example_inputs(arch), what=f"{arch} {case}")
    assert e.P.T @ e.P == pytest.approx(torch.eye(e.narrow.d_model, dtype=torch.float64), abs=1e-14)


def test_layernorm_embedding_keeps_the_stream_mean_free():
    """P 1_d = sqrt(d/D) 1_D, and a mean-free narrow vector stays mean-free."""
    from symmerge.store.expansion import residual_embedding

    for d, D in ((24, 48), (32, 40), (5, 5)):
        P = residual_embedding(d, D, centred=True)
        assert (P.T @ P - torch.eye(d, dtype=torch.float64)).abs().max() < 1e-14
        assert (P @ torch.ones(d, dtype=torch.float64) - math.sqrt(d / D)).abs().max() < 1e-14
        x = torch.randn(d, dtype=torch.float64, generator=torch.Generator().manual_seed(d))
        assert abs(float((P @ (x - x.mean())).sum())) < 1e-13
        if d < D:  # negative control: the uncentred embedding (zero padding) does not map 1_d to sqrt(d/D) 1_D
            U = residual_embedding(d, D, centred=False)
            assert (U @ torch.ones(d, dtype=torch.float64) - math.sqrt(d / D)).abs().max() > 1e-2


def _expanded_with(narrow_dir, wide_config, tmp_path, **wrong):
    """The expansion with some maps replaced (a negative control), written and loaded as a stock model."""
    narrow = LazyModel(narrow_dir)
    e = dataclasses.replace(plan(narrow.adapter, narrow.config, wide_config), **wrong)
    write_streaming(ExpandedModel(narrow, wide_config, e), lambda p: p, tmp_path / "wrong", progress=False)
    return stock(tmp_path / "wrong")


def _refusal(arch: str, case: str) -> str | None:
    """The words of the refusal an expansion case must meet, None where it is exact."""
    s = _shape(make_config(arch))
    if s.post_norm and case != "ffn":
        return "post-norms"
    if s.qk_norm == "projection" and _shape(make_config(arch)).n_heads != _shape(_widened(arch, **_cases(arch)[case])).n_heads:
        return "whole projection"
    if _changes_head(arch, case):
        return "clip_qkv" if s.clip_qkv is not None else "QK-norm" if s.qk_norm else None
    return None


def _controls():
    """(arch, case, name of the control): each arch with the controls its expansions exercise."""
    out = []
    for arch in ARCHS:
        s = _shape(make_config(arch))
        if s.post_norm or s.qk_norm == "projection":  # only the FFN widens: zero units, nothing to compensate
            continue
        out.append((arch, "all", "reader_scale"))
        if s.eps_in_config:
            out.append((arch, "all", "writer_scale"))  # WIDE's eps is 1000x NARROW's
        if s.qk_norm:
            out.append((arch, "all", "qk_scale"))
        if s.centred:
            out.append((arch, "heads", "P"))
        case = "head_dim" if "head_dim" in _cases(arch) else "d_model"
        if s.clip_qkv is None and not s.qk_norm and _changes_head(arch, case):
            wide = _widened(arch, **_cases(arch)[case])
            adapter = adapter_for(wide)
            if adapter.score_scale(make_config(arch), s) != adapter.score_scale(wide, adapter.shape(wide)):
                out.append((arch, case, "score_scale"))  # Granite's is a constant of the config
            if s.rotary_dims:
                out.append((arch, case, "head_dims"))
    return out


@pytest.mark.parametrize("arch,case,control", _controls())
def test_uncompensated_expansions_change_the_function(arch, case, control, narrow_dirs, narrow_models, tmp_path):
    wide = _widened(arch, **_cases(arch)[case])
    narrow = LazyModel(narrow_dirs[arch])
    e = plan(narrow.adapter, narrow.config, wide)
    wrong = {"reader_scale": 1.0, "writer_scale": 1.0, "score_scale": 1.0, "qk_scale": 1.0,
             # RoPE pairs on the first wide pairs, whatever their frequencies
             "head_dims": torch.cat([torch.arange(e.narrow.rotary_dims // 2),
                                     e.wide.rotary_dims // 2 + torch.arange(e.narrow.rotary_dims // 2),
                                     e.head_dims[e.narrow.rotary_dims:]]),
             # an isometry that does not keep the stream mean-free (P^T 1_D not a multiple of 1_d): LayerNorm
             # then centres what the narrow model never centred
             "P": torch.linalg.qr(torch.randn(e.wide.d_model, e.narrow.d_model, dtype=torch.float64,
                                              generator=torch.Generator().manual_seed(0)))[0]}[control]
    assert not torch.equal(torch.as_tensor(getattr(e, control)), torch.as_tensor(wrong)), "the control must differ"
    got = _expanded_with(narrow_dirs[arch], wide, tmp_path, **{control: wrong})
    assert_different_function(got, narrow_models[arch], example_inputs(arch), what=f"{arch} {case} without {control}")


# --- refusals ----------------------------------------------------------------------------------------


def _refusal_cases():
    rope = make_config("llama")
    rope.rope_parameters["rope_theta"] = 500000.0
    neox = _widened("gpt_neox", d=2)
    neox.rope_parameters["partial_rotary_factor"] = 0.375  # 6 of 16 dims: frequency base^-1/2 has no partner
    layers = make_config("gpt2")
    layers.num_hidden_layers = 3
    vocab = make_config("gpt2")
    vocab.vocab_size = 62
    gqa = make_config("llama")
    gqa.num_key_value_heads = 4  # 1 query head per KV head, NARROW has 2
    experts = make_config("mixtral")
    experts.num_local_experts = 5
    top = make_config("qwen3_moe")
    top.num_experts_per_tok = 3
    gpt2_half = make_config("gpt2")
    gpt2_half.n_inner = 48  # narrower FFN than NARROW's 4 x 24
    return [
        ("gpt2", make_config("llama"), "architecture"),
        ("gpt2", vocab, "vocabularies"),
        ("gpt2", layers, "layer counts"),
        ("gpt2", gpt2_half, "wider than WIDE in d_mlp"),
        ("llama", rope, "differ in rope_parameters"),
        ("gpt_neox", neox, "RoPE frequency"),
        ("llama", gqa, "q_per_kv"),
        ("olmo_clip", _widened("olmo_clip", d=2), "clip_qkv"),
        ("mixtral", experts, "number of experts"),
        ("qwen3_moe", top, "experts per token"),
    ]


@pytest.mark.parametrize("arch,wide,words", _refusal_cases())
def test_unexpandable_pairs_are_refused_with_one_line(arch, wide, words, narrow_dirs, tmp_path, capsys):
    rc = main(["expand", str(narrow_dirs[arch]), "--like", str(_wide_dir(tmp_path, wide)), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and words in err[0] and err[0].startswith("symmerge expand: error:"), err
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_wider_narrow_is_refused(narrow_dirs, tmp_path):
    """Swapped arguments: the 'narrow' model is wider than WIDE."""
    out, _ = expand_checkpoint(narrow_dirs["gpt2"], _wide_dir(tmp_path, _widened("gpt2", d=2)), tmp_path / "big")
    rc = main(["expand", str(out), "--like", str(narrow_dirs["gpt2"]), "-o", str(tmp_path / "out")])
    assert rc == 2 and not (tmp_path / "out").exists()


def test_cli_expand_runs_as_documented(narrow_dirs, tmp_path, capsys):
    wide = _wide_dir(tmp_path, _widened("llama", d=2, ffn=2, heads=2))
    assert main(["expand", str(narrow_dirs["llama"]), "--like", str(wide), "-o", str(tmp_path / "out")]) == 0
    assert "same function" in capsys.readouterr().out
    assert_same_function(stock(tmp_path / "out"), stock(narrow_dirs["llama"]), example_inputs("llama"))
