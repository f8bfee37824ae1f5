"""Mixed widths in `merge` and in the barrier of many models: every model expanded into the widest config
(`expansion.widest_many`), against the stock transformers forward.

Planted: NARROW, and WIDE_k = g_k·expand(NARROW) for two random elements of the wide group (wide-config
checkpoints computing NARROW's function in other coordinates). Merging NARROW, WIDE_1, WIDE_2 gives a
wide-config checkpoint computing NARROW's function, and each aligned endpoint computes its input's.
"""

from __future__ import annotations

import json

import pytest
import torch

from checks import assert_different_function, assert_same_function, stock
from factories import example_inputs, lm_batches, rel_distance
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.cli import main
from symmerge.evaluation.barrier_many import many_barrier
from symmerge.store.model import load_model, save_model
from test_expand_align import _wide_config
from test_expand_align import planted as expand_planted  # noqa: F401 (a fixture)
from test_merge_many_methods import own_labels

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def planted(expand_planted):  # noqa: F811 (the imported fixture, requested by name)
    """test_expand_align's NARROW and WIDE (= WIDE_1), and WIDE_2 from another element."""
    arch, root = expand_planted
    if not (root / "wide2").exists():
        e = load_model(root / "expanded")
        save_model(e, apply(e.spec, random_element(e.spec, torch.Generator().manual_seed(4), e.spec.default_families()),
                            e.params), root / "wide2")
    return arch, root, [root / "narrow", root / "wide", root / "wide2"]


def test_merge_mixed_widths_gives_the_narrow_function_in_the_wide_config(planted, tmp_path):
    arch, root, paths = planted
    out, al, rep = tmp_path / "m", tmp_path / "al", tmp_path / "r.json"
    assert main(["merge", *map(str, paths), "-o", str(out), "--aligned", str(al), "--json", str(rep),
                 "--max-rounds", "3"]) == 0
    x, narrow = example_inputs(arch), stock(root / "narrow")
    merged = stock(out)
    assert merged.config.hidden_size == _wide_config(arch).hidden_size
    assert_same_function(merged, narrow, x, what=f"{arch}: merged vs NARROW")
    for i, p in enumerate(paths, start=1):
        got = stock(al / str(i))
        assert got.config.hidden_size == _wide_config(arch).hidden_size
        assert_same_function(got, stock(p), x, what=f"{arch}: aligned {i} vs its input")
    # negative control (an input written unchanged computes its function too): the aligned endpoints
    # coincide (the planted elements undone), where the inputs (the expansion, WIDE_1, WIDE_2) are far apart
    ends = [load_model(al / str(i)).params for i in (1, 2, 3)]
    ins = [load_model(root / n).params for n in ("expanded", "wide", "wide2")]
    assert max(rel_distance(e, ends[0]) for e in ends[1:]) < 1e-9
    assert min(rel_distance(ins[i], ins[j]) for i, j in ((0, 1), (0, 2), (1, 2))) > 0.1
    r = json.loads(rep.read_text())
    assert r["expanded"] == [1] and r["gauge_of"] == str(paths[1]) and r["objective"][-1] > 1 - 1e-9
    # negative control: the expansion averaged with the wide models without alignment is another function
    e, w1, w2 = (load_model(root / n) for n in ("expanded", "wide", "wide2"))
    plain = {k: (e.params[k] + w1.params[k] + w2.params[k]) / 3 for k in e.params}
    save_model(e, plain, tmp_path / "plain")
    assert_different_function(stock(tmp_path / "plain"), narrow, x, what=f"{arch}: plain average of the expansion")


def test_barrier_of_mixed_widths(planted, tmp_path, monkeypatch):
    """The narrow endpoint is evaluated in the wide config with its own loss; aligned, the excess is 0."""
    arch, root, paths = planted
    models = [load_model(p) for p in paths]
    batches = own_labels(models[0], lm_batches(2, 3, size=3, length=10))
    r = many_barrier(models, batches, points=2, simplex_points=3, progress=False)
    hf = stock(root / "narrow")
    with torch.no_grad():
        own = sum(float(hf(**b).loss) for b in batches) / len(batches)
    assert r["endpoint_losses"][0] == pytest.approx(own, abs=1e-5)
    assert r["average_excess"] > 0.05  # not aligned: the planted elements separate them
    al = tmp_path / "al"
    assert main(["merge", *map(str, paths), "-o", str(tmp_path / "m"), "--aligned", str(al), "--max-rounds", "2"]) == 0
    aligned = many_barrier([load_model(al / str(i)) for i in (1, 2, 3)], batches, points=2, simplex_points=3,
                           progress=False)
    assert abs(aligned["average_excess"]) < 1e-5 and aligned["simplex_barrier"] < 1e-5
    # the CLI takes the mixed widths too
    import symmerge.data.batches

    monkeypatch.setattr(symmerge.data.batches, "load_batches", lambda *a, **k: batches)
    assert main(["barrier", *map(str, paths), "--data", "synthetic", "--simplex-points", "3", "--points", "2",
                 "--json", str(tmp_path / "b.json")]) == 0
    cli = json.loads((tmp_path / "b.json").read_text())
    assert cli["endpoint_losses"] == pytest.approx(r["endpoint_losses"], abs=1e-9)
