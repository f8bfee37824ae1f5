"""Outputs in A's gauge: an aligned B written with A's norm parameters, so that a plain tensor-wise
average with the stock A (what mergekit `linear` does) is `symmerge interpolate A B`; against the stock
`transformers` forward, with the canonical form (the old output) as negative control."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from factories import example_inputs, logits, make_model, model_class
from symmerge.cli import main
from symmerge.store.gauge import MERGEKIT_FILE
from symmerge.store.model import load_model, reference_gauge, save_model

ARCHS = ["gpt2", "llama", "llama_untied", "qwen3", "olmo2", "gemma2", "gpt_neox", "gpt_neox_seq", "phi", "vit"]


def _stock(path, arch, dtype=torch.float64):
    return model_class(arch).from_pretrained(path, dtype=dtype).eval()


def aligned_pair(tmp_path, arch, dtype=torch.float64, method="weight"):
    """Stock A and B (independent random models) and OUT = B aligned to A."""
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    make_model(arch, seed=0, dtype=dtype).save_pretrained(a)
    make_model(arch, seed=1, dtype=dtype).save_pretrained(b)
    assert main(["align", str(a), str(b), "-o", str(out), "--method", method]) == 0
    return a, b, out


def assert_close(got, want, tol=1e-5):
    """Stock RMSNorm computes in float32 whatever the model's dtype, so float64 models agree to ~1e-7
    relative per norm: 1e-5 of the logits' scale is the bound; the negative controls differ by > 1e-2."""
    assert float((got - want).abs().max()) <= tol * max(1.0, float(want.abs().max()))


def assert_far(got, want):
    """Negative control for `assert_close`: the logits differ by more than 1e-2 of their scale (1000x its bound)."""
    assert float((got - want).abs().max()) > 1e-2 * max(1.0, float(want.abs().max()))


def plain_average(a, out, arch, dtype=torch.float64):
    """The tensor-wise midpoint of the stock A and OUT (A's tied head read as its embedding), in OUT's config."""
    ma, mo = _stock(a, arch, dtype), _stock(out, arch, dtype)
    sa = ma.state_dict()
    avg = {k: (sa[k] + v) / 2 for k, v in mo.state_dict().items()}
    mo.load_state_dict(avg)
    return mo


@pytest.mark.parametrize("arch", ARCHS)
def test_aligned_output_averages_like_interpolate(tmp_path, arch):
    a, b, out = aligned_pair(tmp_path, arch)
    x = example_inputs(arch)
    # the same function as B, and A's norm parameters verbatim
    assert_close(logits(_stock(out, arch), x), logits(_stock(b, arch), x))
    assert_far(logits(_stock(out, arch), x), logits(_stock(a, arch), x))  # negative control: A's function
    gauge = reference_gauge(a)
    sd = _stock(out, arch).state_dict()
    for prefix, gamma, beta in gauge.norms.values():
        assert torch.equal(sd[f"{prefix}.weight"], gamma)
        if beta is not None and not prefix.endswith(("ln_f", "final_layer_norm")):
            assert torch.equal(sd[f"{prefix}.bias"], beta)
    # a plain average with the stock A is symmerge's interpolation
    assert main(["interpolate", str(a), str(out), "--lam", "0.5", "-o", str(tmp_path / "mid")]) == 0
    want = logits(_stock(tmp_path / "mid", arch), x)
    got = logits(plain_average(a, out, arch), x)
    assert_close(got, want)
    # negative control: OUT in canonical form (the old output) computes the same, but does not average
    m = load_model(out)
    save_model(m, m.params, tmp_path / "canonical")
    assert_close(logits(_stock(tmp_path / "canonical", arch), x), logits(_stock(b, arch), x))
    assert_far(logits(plain_average(a, tmp_path / "canonical", arch), x), want)


def test_streamed_and_in_memory_outputs_agree(tmp_path):
    """weight matching (streamed) and activation matching (in memory) export through the same gauge."""
    a, b, out = aligned_pair(tmp_path, "gpt_neox")
    m = load_model(out)
    save_model(m, m.params, tmp_path / "again", gauge=reference_gauge(a))
    written, again = _stock(out, "gpt_neox").state_dict(), _stock(tmp_path / "again", "gpt_neox").state_dict()
    for k, v in written.items():
        assert torch.allclose(v, again[k], atol=1e-12, rtol=0), k
    # negative control: the in-memory export without A's gauge (canonical form) writes other tensors
    save_model(m, m.params, tmp_path / "canonical")
    canonical = _stock(tmp_path / "canonical", "gpt_neox").state_dict()
    assert max(float((v - canonical[k]).abs().max()) for k, v in written.items()) > 1e-2


def test_mergekit_config_beside_output(tmp_path):
    a, b, out = aligned_pair(tmp_path, "llama_untied")
    text = (out / MERGEKIT_FILE).read_text()
    assert "merge_method: linear" in text and f'base_model: "{a.resolve()}"' in text and str(out.resolve()) in text


def test_zero_norm_weight_falls_back_to_canonical(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    ma = make_model("llama_untied", seed=0)
    with torch.no_grad():
        ma.model.layers[0].input_layernorm.weight[3] = 0
    ma.save_pretrained(a)
    make_model("llama_untied", seed=1).save_pretrained(b)
    assert main(["align", str(a), str(b), "-o", str(tmp_path / "out")]) == 0
    assert "canonical form" in capsys.readouterr().err
    assert not (tmp_path / "out" / MERGEKIT_FILE).exists()
    w = _stock(tmp_path / "out", "llama_untied").model.layers[0].input_layernorm.weight
    assert torch.equal(w, torch.ones_like(w))
    x = example_inputs("llama_untied")
    assert_close(logits(_stock(tmp_path / "out", "llama_untied"), x), logits(_stock(b, "llama_untied"), x))
    # negative control: A's function
    assert_far(logits(_stock(tmp_path / "out", "llama_untied"), x), logits(_stock(a, "llama_untied"), x))


@pytest.mark.parametrize("command,dtype", [("transform", torch.bfloat16), ("interpolate", torch.float16),
                                           ("align", torch.float32), ("expand", torch.bfloat16)])
def test_out_dtype(tmp_path, command, dtype):
    """--out-dtype writes the checkpoint in that dtype; the function agrees to that dtype's precision."""
    from symmerge.store.io import Checkpoint

    a, b = tmp_path / "a", tmp_path / "b"
    make_model("llama_untied", seed=0).save_pretrained(a)
    make_model("llama_untied", seed=1).save_pretrained(b)
    out, name = tmp_path / "out", str(dtype).replace("torch.", "")
    argv = {"transform": ["transform", str(a), "--seed", "3"], "interpolate": ["interpolate", str(a), str(a), "--lam", "0.5"],
            "align": ["align", str(a), str(b)], "expand": ["expand", str(a), "--like", str(a)]}[command]
    assert main([*argv, "-o", str(out), "--out-dtype", name]) == 0
    assert Checkpoint(out).dtype() == dtype
    source = b if command == "align" else a
    x = example_inputs("llama_untied")
    want = logits(_stock(source, "llama_untied"), x)
    got = logits(_stock(out, "llama_untied"), x)
    err = float((got - want).abs().max()) / max(1.0, float(want.abs().max()))
    eps = torch.finfo(dtype).eps
    # weights rounded once to the dtype (half an eps each), through two layers: measured at most 1.4 eps of the
    # logits' scale over these four cases; 8 eps leaves room for other machines' arithmetic, the control is at 100
    assert err <= 8 * eps
    # negative control: the other input's function (OUT written from the wrong model)
    other = logits(_stock(a if source == b else b, "llama_untied"), x)
    assert float((got - other).abs().max()) / max(1.0, float(want.abs().max())) > 100 * eps


def _stored(folder) -> set[str]:
    """The tensor names in a checkpoint folder's safetensors files."""
    from safetensors import safe_open

    names = set()
    for f in Path(folder).glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            names.update(h.keys())
    return names


def test_tied_llama_stays_tied(tmp_path):
    """A tied Llama transformed by permutations (no residual rotation) is written tied (head = embedding,
    final norm weight permuted), storing the tensors stock `save_pretrained` stores (no head); with a residual
    rotation it cannot be, and is written untied, head stored. Both against the stock forward."""
    src = tmp_path / "src"
    make_model("llama", seed=0).save_pretrained(src)  # the factory's Llama is tied
    assert "lm_head.weight" not in _stored(src)
    x = example_inputs("llama")
    want = logits(_stock(src, "llama"), x)
    for groups, tied in (("residual_perm,ffn_perm,head_perm", True), ("residual_rotation", False)):
        out = tmp_path / groups.replace(",", "_")
        assert main(["transform", str(src), "-o", str(out), "--seed", "4", "--groups", groups]) == 0
        model = _stock(out, "llama")
        assert model.config.tie_word_embeddings is tied
        assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight) is tied
        assert_close(logits(model, x), want)
        # the tied output stores the source's tensors; the untied one the head besides (negative control)
        assert _stored(out) == (_stored(src) if tied else _stored(src) | {"lm_head.weight"})
    # negative control: the rotated model written tied after all (its head read as its embedding)
    model.lm_head.weight = model.model.embed_tokens.weight
    assert_far(logits(model, x), want)
    m = load_model(src)  # A's own parameters through save_model (in-memory export): tied as well
    save_model(m, m.params, tmp_path / "again")
    assert _stock(tmp_path / "again", "llama").config.tie_word_embeddings is True
    assert _stored(tmp_path / "again") == _stored(src)


def test_norms_without_parameters_have_no_gauge(model_dirs):
    """OLMo-1's LayerNorm has no weight or bias: its gauge is empty and the export is canonical form."""
    assert reference_gauge(model_dirs["olmo"]).norms == {}
    assert set(reference_gauge(model_dirs["llama"]).norms) == {"final", "blocks.0.ln1", "blocks.0.ln2", "blocks.1.ln1", "blocks.1.ln2"}


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox"])
def test_merge_aligned_endpoints_average_to_out(tmp_path, arch):
    """merge --aligned DIR: the endpoints are in the first input's gauge, so their plain weighted average
    (what DIR/mergekit.yml asks mergekit for) is OUT; merge --out-dtype casts both."""
    paths = []
    for seed in range(3):
        paths.append(tmp_path / f"m{seed}")
        make_model(arch, seed=seed).save_pretrained(paths[-1])
    out, aligned = tmp_path / "out", tmp_path / "aligned"
    assert main(["merge", *map(str, paths), "-o", str(out), "--aligned", str(aligned), "--weights", "0.5,0.3,0.2"]) == 0
    assert "weight: 0.3" in (aligned / MERGEKIT_FILE).read_text()
    ends = [_stock(aligned / str(i), arch) for i in (1, 2, 3)]
    mean = ends[0]
    sds = [m.state_dict() for m in ends]
    mean.load_state_dict({k: 0.5 * sds[0][k] + 0.3 * sds[1][k] + 0.2 * sds[2][k] for k in sds[0]})
    x = example_inputs(arch)
    want = logits(_stock(out, arch), x)
    assert_close(logits(mean, x), want)
    # negative control: the endpoints averaged with the weights reversed (0.2, 0.3, 0.5)
    mean.load_state_dict({k: 0.2 * sds[0][k] + 0.3 * sds[1][k] + 0.5 * sds[2][k] for k in sds[0]})
    assert_far(logits(mean, x), want)
    ins = [logits(_stock(p, arch), x) for p in paths]
    for i, ref in enumerate(ins, start=1):
        assert_close(logits(_stock(aligned / str(i), arch), x), ref)
    # negative control: an endpoint against another input (the aligned endpoints in the wrong order)
    assert_far(logits(ends[1], x), ins[2])


def test_tied_scale_reads_every_row_a_few_rows_at_a_time(monkeypatch):
    """`tied_scale` compares the head with the embedding a few rows at a time (`runtime.row_blocks`): γ' over every
    row, and a head that differs in the last row alone is not tied (control: a check that skipped a block would tie it)."""
    from types import SimpleNamespace

    from symmerge.runtime import row_blocks
    from symmerge.store import gauge

    gen = torch.Generator().manual_seed(0)
    e = torch.randn(37, 5, dtype=torch.float64, generator=gen)
    g = torch.rand(5, dtype=torch.float64, generator=gen) + 0.5
    s = SimpleNamespace(tied=True, centred=False)
    monkeypatch.setattr(row_blocks, "ENTRIES", 12)  # two rows at a time
    assert len(row_blocks.row_slices(e)) == 19
    assert torch.allclose(gauge.tied_scale({"embed.W_E": e, "head.W_U": e * g}, s), g, rtol=1e-12, atol=0)
    u = e * g
    u[-1, 0] += 1e-6
    assert gauge.tied_scale({"embed.W_E": e, "head.W_U": u}, s) is None
