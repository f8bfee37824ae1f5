"""Mixed widths in `align`, `interpolate` and `barrier`: the narrower model is expanded into the wider
one's config first (`symmerge.store.expansion.widest`), and OUT is a wide-config checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T

from checks import assert_different_function, assert_same_function, stock, with_tensor_of
from factories import example_inputs, make_config, make_model, rel_distance
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.cli import main
from symmerge.data.tokenizers import char_tokenizer
from symmerge.store.expansion import expand_checkpoint
from symmerge.store.model import load_model, save_model


def _wide_config(arch: str):
    c = make_config(arch)
    d_mlp_key = "n_inner" if hasattr(c, "n_inner") else "intermediate_size"
    setattr(c, d_mlp_key, 2 * (getattr(c, d_mlp_key) or 4 * c.hidden_size))
    c.hidden_size *= 2
    return c


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def planted(request, tmp_path_factory):
    """NARROW, and WIDE = a random element of the wide group applied to NARROW expanded into WIDE's config."""
    arch, root = request.param, tmp_path_factory.mktemp(request.param)
    make_model(arch).save_pretrained(root / "narrow")
    _wide_config(arch).save_pretrained(root / "like")
    expand_checkpoint(root / "narrow", root / "like", root / "expanded")
    e = load_model(root / "expanded")
    g = random_element(e.spec, torch.Generator().manual_seed(3), e.spec.default_families())
    save_model(e, apply(e.spec, g, e.params), root / "wide")
    return arch, root


def test_align_mixed_widths_recovers_the_planted_wide_coordinates(planted, tmp_path):
    arch, root = planted
    out = tmp_path / "out"
    assert main(["align", str(root / "wide"), str(root / "narrow"), "-o", str(out), "--method", "weight"]) == 0
    got = stock(out)
    assert got.config.hidden_size == _wide_config(arch).hidden_size  # WIDE's config
    assert_same_function(got, stock(root / "narrow"), example_inputs(arch), what="aligned expansion vs NARROW")
    wide, aligned = load_model(root / "wide").params, load_model(out).params
    assert rel_distance(aligned, wide) < 1e-6  # in WIDE's coordinates (the planted element undone)
    expanded = load_model(root / "expanded").params
    assert rel_distance(expanded, wide) > 0.1  # without alignment it is not


def test_align_narrow_first_writes_b_in_the_expanded_a(planted, tmp_path, capsys):
    """NARROW first: A is expanded into B's config, and OUT is B in the coordinates and the norm gauge of A
    so expanded (canonical form, as `symmerge expand` writes it): with B a planted element of that
    expansion, OUT's stock tensors are the expansion's, norms included. Negative control: B's are not."""
    arch, root = planted
    out = tmp_path / "out"
    assert main(["align", str(root / "narrow"), str(root / "wide"), "-o", str(out), "--method", "weight"]) == 0
    assert "expanded into a wider config" in capsys.readouterr().err
    got = stock(out)
    assert got.config.hidden_size == _wide_config(arch).hidden_size
    assert_same_function(got, stock(root / "wide"), example_inputs(arch), what="aligned WIDE vs WIDE")
    expanded, wide = stock(root / "expanded").state_dict(), stock(root / "wide").state_dict()
    written = got.state_dict()
    assert rel_distance(written, expanded) < 1e-6  # A's expansion, tensor for tensor (its unit norms too)
    assert rel_distance(wide, expanded) > 0.1
    assert not (out / "mergekit.yml").exists()  # A itself is of another width: no average of A and OUT


def test_interpolate_mixed_widths_expands_the_narrow_end(planted, tmp_path):
    arch, root = planted
    x = example_inputs(arch)
    for lam, ref in ((1.0, "narrow"), (0.0, "wide")):
        out = tmp_path / f"lam{lam}"
        assert main(["interpolate", str(root / "wide"), str(root / "narrow"), "--lam", str(lam), "-o", str(out)]) == 0
        assert stock(out).config.hidden_size == _wide_config(arch).hidden_size
        assert_same_function(stock(out), stock(root / ref), x, what=f"interpolate λ={lam}")
    # negative control: the λ = 1 end with one reader of the residual stream taken from the other end (WIDE)
    assert_different_function(with_tensor_of(stock(tmp_path / "lam1.0"), stock(root / "wide")), stock(root / "narrow"), x,
                              what="one reader from the other end")


def test_barrier_mixed_widths_is_flat_between_a_model_and_its_planted_expansion(planted, tmp_path):
    arch, root = planted
    text = tmp_path / "t.txt"
    text.write_text("".join(chr(33 + i % 60) for i in range(4000)))
    char_tokenizer(text.read_text()).save_pretrained(root / "narrow")
    rc = main(["barrier", str(root / "narrow"), str(root / "expanded"), "--data", str(text), "--max-batches", "2",
               "--points", "3", "--json", str(tmp_path / "b.json")])
    assert rc == 0
    rep = json.loads((tmp_path / "b.json").read_text())
    # flat: every point, not just the barrier (clipped at the ends, it is 0 on a path that dips as well)
    assert abs(rep["barrier"]) < 1e-9 and max(rep["loss"]) - min(rep["loss"]) < 1e-9
    # negative control: WIDE (the expansion moved by a planted element) computes the same function, off the flat path
    assert main(["barrier", str(root / "narrow"), str(root / "wide"), "--data", str(text), "--max-batches", "2",
                 "--points", "3", "--json", str(tmp_path / "w.json")]) == 0
    moved = json.loads((tmp_path / "w.json").read_text())
    assert moved["loss"][0] == pytest.approx(moved["loss"][-1], abs=1e-5)  # float32 norms: not to the bit
    assert max(moved["loss"]) - min(moved["loss"]) > 1e-3, moved["loss"]


def test_align_refuses_a_pair_that_neither_way_expands(planted, tmp_path, capsys):
    arch, root = planted
    # WIDE is wider in d_model, NARROW wider in FFN: neither expands into the other
    c = make_config(arch)
    key = "n_inner" if hasattr(c, "n_inner") else "intermediate_size"
    setattr(c, key, 8 * (getattr(c, key) or 4 * c.hidden_size))
    torch.manual_seed(0)
    getattr(T, c.architectures[0])(c).save_pretrained(tmp_path / "ffn_wide")
    out = tmp_path / "out"
    rc = main(["align", str(root / "wide"), str(tmp_path / "ffn_wide"), "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "neither expands" in err[-1] and not out.exists(), err
