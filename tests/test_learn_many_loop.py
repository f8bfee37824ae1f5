"""Many-model learned / dual merging runs the pair's loop (`learn_loop.Run`): a run stopped and resumed from its
checkpoint equals an uninterrupted one to the bit, from the library and from `merge --resume`; the resumed run
refuses other settings; the best-state rule and learning on are the loop's (tested with pairs)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from factories import lm_batches, make_model, save_model
from learned_common import CONTINUOUS
from symmerge import SymmergeError, cli
from symmerge.algebra.elements import random_element
from symmerge.data.tokenizers import char_tokenizer
from symmerge.match import learn_loop, learn_state
from symmerge.match.learn_config import LearnConfig
from symmerge.match.learn_loop import Interrupted
from symmerge.match.learn_many import learn_many
from symmerge.match.outputs import checkpoint_folder
from symmerge.store.model import load_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread

CHARS = "".join(chr(c) for c in range(65, 125))  # 60 characters: with <unk>, the tiny GPT-2s' 61 tokens


def _three(tmp_path):
    a = load_model(save_model(make_model("gpt2", 0), tmp_path / "a"))
    return [a] + [a.moved(random_element(a.spec, torch.Generator().manual_seed(s), CONTINUOUS, spread=1.0))
                  for s in (5, 6)]


def _cfg(**kw) -> LearnConfig:
    base = dict(method="dual", groups=CONTINUOUS, steps=6, lr=0.02, eval_every=2, progress=False, extend=1.0,
                checkpoint_every=100)
    return LearnConfig(**{**base, **kw})


def test_many_model_resume_equals_uninterrupted(tmp_path):
    models, weights = _three(tmp_path), [0.5, 0.3, 0.2]
    train, val = lm_batches(3, 0), lm_batches(2, 1)
    whole = learn_many(models, weights, train, val, _cfg(), checkpoint=tmp_path / "whole")
    with pytest.raises(Interrupted, match="--resume"):
        learn_many(models, weights, train, val, _cfg(), checkpoint=tmp_path / "cut", on_step=lambda s: s == 3)
    taken = []
    resumed = learn_many(models, weights, train, val, _cfg(), checkpoint=tmp_path / "cut", resume=True, on_step=taken.append)
    assert taken == [4, 5, 6], taken  # resumed, not started over (a deterministic rerun would be equal too)
    for i, g in enumerate(whole.elements):
        for k, t in g.items():
            assert torch.equal(t, resumed.elements[i][k]), (i, k)
    assert whole.report["history"] == resumed.report["history"] and whole.report["steps"] == 6
    assert whole.report["objective_after"] == min(h["objective"] for h in whole.report["history"])
    # negative control: another seed draws other batches and points
    other = learn_many(models, weights, train, val, _cfg(seed=4))
    assert not torch.equal(other.elements[1]["residual.rotation"], whole.elements[1]["residual.rotation"])
    with pytest.raises(SymmergeError, match="merge_weights"):
        learn_many(models, [0.4, 0.4, 0.2], train, val, _cfg(), checkpoint=tmp_path / "cut", resume=True)
    with pytest.raises(SymmergeError, match="lr=0.02"):
        learn_many(models, weights, train, val, _cfg(lr=0.03), checkpoint=tmp_path / "cut", resume=True)


def test_many_model_lr_auto_takes_the_best_rate_and_a_resume_keeps_it(tmp_path, monkeypatch):
    """`--lr auto` for many models: every rate's short run is scored by the run's own objective and the
    lowest wins (ties to the smaller rate); the plan is saved, so a run stopped after its search and resumed
    takes that rate without searching again (that a resume ends where the uninterrupted run ends:
    `test_many_model_resume_equals_uninterrupted`)."""
    from symmerge.match import lr_search

    models, weights = _three(tmp_path), [1 / 3] * 3
    train, val = lm_batches(3, 0), lm_batches(2, 1)
    cfg = _cfg(lr="auto", steps=620, eval_every=310)  # about the shortest run that affords the search
    with pytest.raises(Interrupted):
        learn_many(models, weights, train, val, cfg, checkpoint=tmp_path / "cut", on_step=lambda step: step == 2)
    monkeypatch.setattr(lr_search, "choose_lr", lambda *a: pytest.fail("a resumed run searched again"))
    with pytest.raises(Interrupted):  # the resumed run takes steps 3 and 4 at the saved rate, then stops
        learn_many(models, weights, train, val, cfg, checkpoint=tmp_path / "cut", resume=True, on_step=lambda step: step == 4)
    plan, (_, meta) = learn_state.load_plan(tmp_path / "cut"), learn_state.load_state(tmp_path / "cut")
    s = plan["lr_search"]
    finite = [(x, r) for x, r in zip(s["excess"], s["rates"]) if x is not None]
    assert len(s["rates"]) >= len(s["grid"]) and s["chosen"] == min(finite)[1]
    assert plan["lr"] == s["chosen"] == meta["settings"]["lr"] and meta["step"] == 4 and meta["settings"]["steps"] == 620
    assert len({x for x, _ in finite}) > 1  # the rates were told apart: the score depends on the rate


def test_many_model_learning_refuses_what_belongs_to_pairs(tmp_path):
    models = _three(tmp_path)
    with pytest.raises(SymmergeError, match="lam-sampling peak is for pairs"):
        learn_many(models, [1 / 3] * 3, lm_batches(2, 0), lm_batches(1, 1), _cfg(lam_sampling="peak"))
    # none given: the simplex's own, uniform (the default of pairs, peak, is not forced on it)
    report = learn_many(models, [1 / 3] * 3, lm_batches(2, 0), lm_batches(1, 1), _cfg(steps=2)).report
    assert report["steps"] == 2 and report["settings"]["lam_sampling"] == "uniform"


@pytest.fixture
def folders(tmp_path):
    tok = char_tokenizer(CHARS)
    paths = [save_model(make_model("gpt2", s), tmp_path / f"m{s}") for s in range(3)]
    for p in paths:
        tok.save_pretrained(p)
    ids = torch.randint(0, len(CHARS), (6000,), generator=torch.Generator().manual_seed(0))
    (tmp_path / "text.txt").write_text("".join(CHARS[i] for i in ids))
    return paths


def _merge(paths, out, *extra) -> list[str]:
    return ["merge", *map(str, paths), "-o", str(out), "--method", "dual", "--data", str(paths[0].parent / "text.txt"),
            "--steps", "4", "--eval-every", "2", "--lr", "0.05", "--batch-size", "4", "--max-batches", "3",
            "--val-batches", "2", *extra]


def test_merge_resume_continues_a_stopped_run_exactly(folders, tmp_path, monkeypatch, capsys):
    """`merge --method dual` stopped at step 3 (as Ctrl-C stops it) leaves its state in OUT.learn-state and no OUT;
    rerun without --resume it refuses to start over; with --resume it writes what an uninterrupted run writes."""
    assert cli.main(_merge(folders, tmp_path / "whole")) == 0
    real = learn_loop.Run.__init__

    def stopping(self, learner, train, val, checkpoint, on_step):
        real(self, learner, train, val, checkpoint, lambda step: step == 3)

    monkeypatch.setattr(learn_loop.Run, "__init__", stopping)
    assert cli.main(_merge(folders, tmp_path / "cut")) == 130
    monkeypatch.undo()
    assert checkpoint_folder(tmp_path / "cut").is_dir() and not (tmp_path / "cut").exists()
    capsys.readouterr()
    assert cli.main(_merge(folders, tmp_path / "cut")) == 2 and "--resume" in capsys.readouterr().err
    assert cli.main(_merge(folders, tmp_path / "cut", "--resume")) == 0
    whole, cut = (load_file(str(tmp_path / n / "model.safetensors")) for n in ("whole", "cut"))
    assert all(torch.equal(whole[k], cut[k]) for k in whole)
    assert not checkpoint_folder(tmp_path / "cut").exists()  # the run is done
    # negative control: another learning seed writes another merge
    assert cli.main(_merge(folders, tmp_path / "seed", "--seed", "5")) == 0
    other = load_file(str(tmp_path / "seed" / "model.safetensors"))
    assert any(not torch.equal(whole[k], other[k]) for k in whole)
    assert cli.main(["merge", *map(str, folders), "-o", str(tmp_path / "w"), "--resume"]) == 2
    assert "keeps no run to resume" in capsys.readouterr().err
