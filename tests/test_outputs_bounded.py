"""Learned and dual matching from the CLI in bounded memory: the endpoints stay `LazyModel`s from reading to
writing (no whole copy of either model anywhere in the command), and the output check reads checkpoints
block by block (`match/file_forward.py`), computing what stock `from_pretrained` computes.

The first tests pin `FileForward` to the stock forward (every architecture, float64, to 1e3 eps; negative
control: one stored tensor changed changes the logits). The CLI test runs `align --method dual|learned`
with every whole-model path made to fail (`LazyModel.as_model`, which `load_model` and every in-memory
`Model` of a checkpoint go through, and `from_pretrained`, which the old output check used): it must
succeed, hand the learner `LazyModel`s, and its outputs must still compute their inputs' functions through
stock `from_pretrained` (loaded here, after the command). The control: the same patches make a whole load fail.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from safetensors.torch import load_file, save_file

from checks import assert_different_function, assert_same_function
from factories import ARCHS, example_inputs, logits, make_model, save_model
from learned_common import char_pair
from symmerge.match import learner as learner_module
from symmerge.match.file_forward import FileForward
from symmerge.match.outputs import PROBE_TOKENS, probe
from symmerge.store.model import LazyModel, load_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


@pytest.mark.parametrize("arch", ARCHS)
def test_file_forward_is_the_stock_forward(arch, tmp_path):
    """FileForward's logits are from_pretrained(dtype=float64)'s on every architecture (tied heads included:
    GPT-2's and the tied Llama's files leave the head out)."""
    folder = save_model(make_model(arch, 0), tmp_path / "m")
    x = example_inputs(arch)
    stock = T.AutoConfig.from_pretrained(folder).architectures[0]
    with torch.no_grad():
        ref = logits(getattr(T, stock).from_pretrained(folder, dtype=torch.float64).eval(), x)
    got = FileForward(folder).logits(x)
    assert got.dtype == torch.float64
    assert_same_function(got, ref, dtype=torch.float64, what=arch)
    # negative control: one block tensor of the files scaled, the logits move
    file = next(folder.glob("*.safetensors"))
    tensors = load_file(file)
    key = next(k for k in tensors if ".1." in k and k.endswith("weight") and tensors[k].dim() == 2)
    tensors[key] = tensors[key] * 1.5
    save_file(tensors, file, metadata={"format": "pt"})
    assert_different_function(FileForward(folder).logits(x), ref, dtype=torch.float64, what=f"{arch}: {key} changed")


def test_probe_keeps_a_few_rows():
    ids = torch.arange(64 * 40).reshape(40, 64)
    small = probe({"input_ids": ids, "labels": ids})
    assert small["input_ids"].shape == (PROBE_TOKENS // 64, 64) and torch.equal(small["labels"], ids[: PROBE_TOKENS // 64])
    assert probe({"input_ids": torch.zeros(2, 1000, dtype=torch.long)})["input_ids"].shape == (1, 1000)
    assert probe({"pixel_values": torch.zeros(40, 1, 8, 8)})["pixel_values"].shape[0] == PROBE_TOKENS // 16


def _no_whole_models(monkeypatch):
    """Every whole load of a checkpoint fails; returns the list the learner's inputs are recorded in."""
    def whole(*_, **__):
        raise AssertionError("a whole model was loaded")

    monkeypatch.setattr(LazyModel, "as_model", whole)
    monkeypatch.setattr(T.PreTrainedModel, "from_pretrained", classmethod(whole))
    seen = []
    init = learner_module.Learner.__init__

    def recording(self, a, b, cfg, init_element=None):
        seen.append((type(a), type(b), cfg.recompute))
        init(self, a, b, cfg, init_element)

    monkeypatch.setattr(learner_module.Learner, "__init__", recording)
    return seen


@pytest.mark.parametrize("method, recompute", [("dual", "weights"), ("learned", "block")])
def test_cli_learned_and_dual_never_load_a_model_whole(method, recompute, tmp_path, monkeypatch):
    """(`--recompute` reaches the learner too.)"""
    from symmerge import cli

    pair, tok, text = char_pair(tmp_path, 20000)
    args = ["align", *pair, "--method", method, "--recipe", "quick", "--batch-size", "4", "--max-batches", "2",
            "--val-batches", "1", "--steps", "2", "--eval-every", "2", "--max-iters", "2", "--recompute", recompute]
    with monkeypatch.context() as m:
        seen = _no_whole_models(m)
        with pytest.raises(AssertionError, match="whole model"):  # the control: the patches catch a whole load
            load_model(pair[0])
        out = tmp_path / "out"
        assert cli.main([*args, "-o", str(out), "--json", str(tmp_path / "r.json")]) == 0
    assert seen and all(t == (LazyModel, LazyModel, recompute) for t in seen), seen
    report = json.loads((tmp_path / "r.json").read_text())
    x = {"input_ids": torch.tensor([tok.encode(text[:32])])}

    def run(folder):
        with torch.no_grad():
            return T.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()(**x).logits

    outs = [("A", "m0"), ("B", "m1")] if method == "dual" else [(None, "m1")]
    for side, src in outs:
        folder = out / side if side else out
        assert_same_function(run(folder), run(tmp_path / src), dtype=torch.float32, what=str(folder))
    assert all(row["max_logit_diff"] < 1e-4 for row in report["outputs"]), report["outputs"]
    assert float((run(out / "B" if method == "dual" else out) - run(tmp_path / "m0")).abs().max()) > 1e-2


def test_cli_merge_dual_never_loads_a_model_whole_and_takes_device_and_dtype(tmp_path, monkeypatch, capsys):
    """`merge --method dual --device cpu --dtype bfloat16`: the many-model learner gets the `LazyModel`s (no
    whole load anywhere: the same patches as above), learns in bfloat16 and the aligned models still compute
    their inputs' functions (stock `from_pretrained`, after the command). `--dtype` with weight matching, which
    runs no forward, is refused with exit 2 and nothing written."""
    from symmerge import cli
    from symmerge.match import learn_many

    pair, tok, text = char_pair(tmp_path, 20000)
    models, data = pair[:2], pair[2:]
    seen = []
    init = learn_many.ManyLearner.__init__

    def recording(self, ms, cfg, *args, **kwargs):
        seen.append(([type(m) for m in ms], cfg.dtype, cfg.device))
        init(self, ms, cfg, *args, **kwargs)

    out, aligned = tmp_path / "merged", tmp_path / "aligned"
    with monkeypatch.context() as m:
        _no_whole_models(m)
        m.setattr(learn_many.ManyLearner, "__init__", recording)
        assert cli.main(["merge", *models, *data, "-o", str(out), "--aligned", str(aligned), "--method", "dual",
                         "--steps", "2", "--batch-size", "4", "--max-batches", "2", "--val-batches", "1",
                         "--max-rounds", "1", "--device", "cpu", "--dtype", "bfloat16"]) == 0
    assert seen == [([LazyModel, LazyModel], "bfloat16", "cpu")], seen
    x = {"input_ids": torch.tensor([tok.encode(text[:32])])}

    def run(folder):
        with torch.no_grad():
            return T.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()(**x).logits

    for i, src in enumerate(models, start=1):
        assert_same_function(run(aligned / str(i)), run(src), dtype=torch.float32, what=f"aligned {i}")
    # negative control: an aligned model against the other input
    assert_different_function(run(aligned / "1"), run(models[1]), dtype=torch.float32, what="aligned 1 vs input 2")
    assert cli.main(["merge", *models, "-o", str(tmp_path / "w"), "--dtype", "bfloat16"]) == 2
    assert "--device and --dtype are for merge --method activation, learned or dual" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_the_endpoints_are_freed_before_the_outputs_are_written(tmp_path, monkeypatch):
    """With the garbage collector off (reference counting only), no frozen endpoint store is alive when
    `align --method dual` writes its outputs: nothing refers back to the learner (a closure over it in a store
    kept the whole learner, and both endpoints, alive through writing and checking). Control: a store made
    here and kept is counted."""
    import gc

    from symmerge import cli
    from symmerge.match import frozen, outputs

    pair, tok, text = char_pair(tmp_path, 20000)
    counts = []
    save = outputs.save_outputs

    def stores():
        return {id(o) for o in gc.get_objects() if isinstance(o, frozen.Frozen)}

    def counting(*a, **k):
        counts.append(len(stores() - before))  # stores made by this test (earlier tests' are not its business)
        return save(*a, **k)

    monkeypatch.setattr(outputs, "save_outputs", counting)
    gc.collect()
    before = stores()
    kept = frozen.Frozen(LazyModel(pair[0]))
    gc.disable()
    try:
        assert cli.main(["align", *pair, "-o", str(tmp_path / "o"), "--method", "dual", "--recipe", "quick", "--steps",
                         "2", "--batch-size", "4", "--max-batches", "2", "--val-batches", "1", "--eval-every", "2",
                         "--max-iters", "1"]) == 0
    finally:
        gc.enable()
    assert counts == [1], counts  # only `kept`
    del kept
