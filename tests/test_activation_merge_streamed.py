"""`merge --method activation` streams every model one part at a time (`match/activation_many.py`): no model,
and no mean of models, is held whole, and the result is the in-memory one to the bit.

The CLI test runs the merge with every whole-model path made to fail (`LazyModel.as_model`, through which any
checkpoint read whole goes; `InMemoryParts`, through which any model held whole in canonical form is read;
`StockForward`, the whole-model forward the objective used; `from_pretrained`), and records where each mean is
kept: it must succeed with every mean on disk, and its aligned models still compute their inputs' functions
(stock `from_pretrained`, after the command). The controls: under the same patches a whole load, the whole
forward and activation matching of models held in memory all fail.

The equality test matches the same checkpoints read lazily (means on disk) and held in memory (means in memory):
the same elements and objectives, bit for bit. The control: a disk cache that does not keep the strides of the
mean's tensors (they are written contiguous) changes the elements, so the equality is not a tautology.
"""

from __future__ import annotations

import pytest
import torch
import transformers as T

from checks import assert_same_function, stock
from factories import lm_batches, make_model, save_model
from symmerge.evaluation.forward import StockForward
from symmerge.match import activation_many, part_cache
from symmerge.store import parts as parts_module
from symmerge.store.model import LazyModel, load_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def _batches() -> list[dict]:
    return [{**b, "labels": b["input_ids"]} for b in lm_batches(2, 0, size=3, length=10)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("act")
    return [save_model(make_model("gpt2", s), root / f"m{s}") for s in range(3)]


def _whole(*_, **__):
    raise AssertionError("a whole model was loaded")


def test_cli_activation_merge_never_holds_a_model_whole(folders, tmp_path, monkeypatch):
    import symmerge.data.batches
    from symmerge.cli import main
    from symmerge.match.activation_many import activation_match_many

    in_memory = [load_model(p) for p in folders[:2]]  # for the last control, read before the patches
    batches = _batches()
    monkeypatch.setattr(symmerge.data.batches, "load_batches", lambda *a, **k: batches)
    kept = []
    cache_init = part_cache.PartCache.__init__

    def recording(self, keys, on_disk, strides=False):
        kept.append((on_disk, strides))
        cache_init(self, keys, on_disk, strides)

    with monkeypatch.context() as m:
        m.setattr(LazyModel, "as_model", _whole)
        m.setattr(parts_module.InMemoryParts, "__init__", _whole)
        m.setattr(StockForward, "__init__", _whole)
        m.setattr(T.PreTrainedModel, "from_pretrained", classmethod(_whole))
        m.setattr(part_cache.PartCache, "__init__", recording)
        out, aligned = tmp_path / "merged", tmp_path / "aligned"
        assert main(["merge", *map(str, folders), "-o", str(out), "--aligned", str(aligned), "--method", "activation",
                     "--data", "fake", "--max-rounds", "2", "--weights", "0.5,0.3,0.2"]) == 0
        # the controls: each patch catches what it stands for
        with pytest.raises(AssertionError, match="whole model"):
            load_model(folders[0])
        with pytest.raises(AssertionError, match="whole model"):
            StockForward(in_memory[0])
        with pytest.raises(AssertionError, match="whole model"):
            activation_match_many(in_memory, [0.5, 0.5], batches, max_rounds=1)
    # round 1 (2 matches, 2 objectives) and a leave-one-out round at least: every mean on disk, strides kept
    assert len(kept) >= 7 and set(kept) == {(True, True)}, kept
    x = {"input_ids": batches[0]["input_ids"]}
    for i, folder in enumerate(folders, start=1):
        assert_same_function(stock(aligned / str(i)), stock(folder), x, what=f"aligned {i}")


def test_streamed_equals_in_memory_to_the_bit(folders, monkeypatch):
    w, batches = [0.5, 0.5], _batches()
    run = lambda models: activation_many.activation_match_many(models, w, batches, max_rounds=2, seed=0)  # noqa: E731
    same = lambda x, y: x.history == y.history and all(  # noqa: E731
        torch.equal(a[n], b[n]) for a, b in zip(x.elements, y.elements) for n in a)
    held = run([load_model(p) for p in folders[:2]])
    lazy = run([LazyModel(p) for p in folders[:2]])
    assert same(lazy, held), (lazy.history, held.history)
    cache_init = part_cache.PartCache.__init__  # the control: the disk cache gives its tensors back contiguous
    monkeypatch.setattr(part_cache.PartCache, "__init__", lambda self, keys, on_disk, strides=False:
                        cache_init(self, keys, on_disk, False))
    if same(run([LazyModel(p) for p in folders[:2]]), held):  # needs kernels whose last bits follow the layout
        pytest.skip("this machine's kernels give the same bits for a strided and a contiguous mean: the control "
                    "cannot show here that the layout is kept")


def test_cli_blocks_flag_reaches_the_many_model_matcher(folders, tmp_path, monkeypatch):
    """`merge --method activation --blocks activation` is the many-model matcher with blocks="activation" (the
    API's result, to the bit), and the default (`best`, per-block groups by weight matching, chosen on the
    average's loss) gives another element: the flag is not ignored."""
    from safetensors.torch import load_file

    import symmerge.data.batches
    from symmerge import api
    from symmerge.cli import main

    batches = _batches()
    monkeypatch.setattr(symmerge.data.batches, "load_batches", lambda *a, **k: batches)
    common = [*map(str, folders), "--method", "activation", "--data", "fake", "--max-rounds", "2"]
    assert main(["merge", *common[:3], "-o", str(tmp_path / "act"), *common[3:], "--blocks", "activation"]) == 0
    assert main(["merge", *common[:3], "-o", str(tmp_path / "wt"), *common[3:]]) == 0
    api.merge(list(folders), tmp_path / "api", "activation", {"blocks": "activation"}, {"max_rounds": 2},
              data="fake")
    act, wt, ref = (load_file(tmp_path / n / "model.safetensors") for n in ("act", "wt", "api"))
    assert all(torch.equal(act[k], ref[k]) for k in ref)
    assert any(not torch.allclose(act[k], wt[k], atol=1e-6) for k in act)
