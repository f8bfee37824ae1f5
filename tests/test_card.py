"""Every checkpoint symmerge writes carries a model card (README.md, `symmerge.store.card`) that huggingface_hub reads:
base_model names the inputs (Hub ids where given, else folder names), tags name symmerge and the operation,
library_name is transformers; the body has the operation, the command line, symmerge's version and the figures
measured. The outputs stay loadable by stock `from_pretrained`, and the card is the same for the same command
(no timings, no absolute paths)."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import ModelCard, constants
from transformers import AutoModelForCausalLM

from bad_inputs import TEXT, hub_cache, lm
from symmerge import __version__
from symmerge.cli import main


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("card")
    c = {"a": lm(root / "a", 0), "b": lm(root / "b", 1), "wide": lm(root / "wide", 5, width=48), "text": root / "text.txt"}
    c["text"].write_text(TEXT * 6)
    c["hub"] = hub_cache(root, c["a"], c["b"])
    return c


def _run(*argv) -> list[str]:
    argv = [str(a) for a in argv]
    assert main(argv) == 0, argv
    return argv


def _card(folder: Path) -> ModelCard:
    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "transformers" and "symmerge" in card.data.tags
    assert f"symmerge {__version__}" in card.text
    AutoModelForCausalLM.from_pretrained(folder)  # the card beside them leaves the outputs stock checkpoints
    return card


def test_every_writing_command_writes_a_card_naming_its_inputs(made, tmp_path):
    a, b, text = made["a"], made["b"], made["text"]
    learn = ("--data", text, "--steps", "2", "--eval-every", "1", "--val-batches", "1")
    o = tmp_path
    cases = {  # output -> (argv, operation tag, base_model, words of the body)
        o / "align": (("align", a, b, "-o", o / "align", "--max-iters", "2"), "align", ["a", "b"], ["objective: "]),
        o / "learned": (("align", a, b, "-o", o / "learned", "--method", "learned", *learn), "align", ["a", "b"],
                        ["barrier_before: ", "losses_after: ", "Figures the command measured on `text.txt`"]),
        o / "dual" / "A": (("align", a, b, "-o", o / "dual", "--method", "dual", *learn), "align", ["a", "b"],
                           ["method: `dual`", "barrier_after: "]),
        o / "merge": (("merge", a, b, "-o", o / "merge", "--aligned", o / "merge-aligned", "--max-rounds", "2"), "merge",
                      ["a", "b"], ["objective: ", "weights: "]),
        o / "merge-act": (("merge", a, b, "-o", o / "merge-act", "--method", "activation", "--data", text, "--max-batches",
                           "1", "--max-rounds", "1"), "merge", ["a", "b"], ["Figures the command measured on `text.txt`"]),
        o / "interpolate": (("interpolate", a, b, "--lam", "0.25", "-o", o / "interpolate"), "interpolate", ["a", "b"],
                            ["λ = 0.25"]),
        o / "transform": (("transform", a, "-o", o / "transform", "--seed", "4"), "transform", ["a"], ["seed: 4"]),
        o / "expand": (("expand", a, "--like", made["wide"], "-o", o / "expand"), "expand", ["a", "wide"],
                       ["writer_scale: "]),
        o / "train": (("train", "--arch", "gpt2", "--preset", "tiny", "--data", text, "--steps", "2", "--seed", "3", "-o",
                       o / "train"), "train", None, ["final_train_loss: ", "test: loss "]),
    }
    for out, (argv, tag, bases, words) in cases.items():
        typed = _run(*argv)
        card = _card(out)
        assert card.data.base_model == bases and tag in card.data.tags, (out, card.data)
        assert "symmerge " + " ".join(Path(x).name if x.startswith("/") else x for x in typed) in card.text, card.text
        assert all(w in card.text for w in words), (out, words, card.text)
        assert str(tmp_path) not in card.text and "seconds" not in card.text and "wall_s" not in card.text
    aligned = _card(o / "merge-aligned" / "2")
    assert aligned.data.base_model == ["b"] and "merge-aligned" in aligned.data.tags
    assert _card(o / "dual" / "B").data.base_model == ["a", "b"]


def test_a_card_names_hub_inputs_by_id_and_commit(made, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(made["hub"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _run("align", "org/pair", "org/pair@v1", "-o", tmp_path / "out", "--max-iters", "2")
    card = _card(tmp_path / "out")
    assert card.data.base_model == ["org/pair", "org/pair@v1"]
    assert f"`org/pair@v1` (commit {'b' * 40})" in card.text
    assert "symmerge align org/pair org/pair@v1 -o out --max-iters 2" in card.text


def test_the_same_command_writes_the_same_card(made, tmp_path):
    """Two runs into folders of one name under different roots, inputs by absolute path: the cards are equal;
    negative control: another seed gives another card."""
    cards = []
    for root, seed in (("r1", "4"), ("r2", "4"), ("r3", "5")):
        _run("transform", made["a"], "-o", tmp_path / root / "out", "--seed", seed)
        cards.append((tmp_path / root / "out" / "README.md").read_bytes())
    assert cards[0] == cards[1] and cards[0] != cards[2]
