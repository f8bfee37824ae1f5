"""Bad input to `merge` and to `barrier` with n models: one line, exit != 0, nothing written, inputs untouched.

The cases use the names of the shared catalogue's context (a, b, other_tok, vit, text, root) so that
they fold into its CASES."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import transformers as T

from symmerge.cli import main
from symmerge.images import processor_config, write_processor_config
from symmerge.tokenizers import char_tokenizer

TEXT = "".join(chr(c) for c in range(32, 127)) * 40 + "\n"


def _lm(path: Path, seed: int, text: str = TEXT) -> Path:
    tok = char_tokenizer(text)
    torch.manual_seed(seed)
    T.GPT2LMHeadModel(T.GPT2Config(n_embd=24, n_layer=2, n_head=3, n_positions=32, vocab_size=len(tok))).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _vit(path: Path) -> Path:
    torch.manual_seed(0)
    T.ViTForImageClassification(T.ViTConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                            intermediate_size=40, image_size=8, patch_size=4, num_channels=1,
                                            num_labels=10)).save_pretrained(path)
    write_processor_config(path, processor_config(8, 1, 0.3, 0.4))
    return path


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_many")
    c = {"root": root, "a": _lm(root / "a", 0), "b": _lm(root / "b", 1), "c": _lm(root / "c", 3), "vit": _vit(root / "vit")}
    c["other_tok"] = _lm(root / "other_tok", 2, text=TEXT.replace("~", "é"))  # same size, other characters
    c["small_vocab"] = _lm(root / "small_vocab", 4, text=TEXT.replace("~", ""))  # one character fewer
    c["text"] = root / "text.txt"
    c["text"].write_text(TEXT * 3)
    return c


def _p(c, key):
    return str(c[key])


def _barrier3(c, *extra):
    return ["barrier", _p(c, "a"), _p(c, "b"), _p(c, "c"), "--data", _p(c, "text"), *extra]


# (id, argv builder, expected words in the one-line message); OUT is always c["root"]/"out"
CASES = [
    ("merge-one-model", lambda c, o: ["merge", _p(c, "a"), "-o", o], "at least two models"),
    ("merge-weights-count", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), _p(c, "c"), "-o", o, "--weights", "0.5,0.5"],
     "2 weights for 3 models"),
    ("merge-weights-negative", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", o, "--weights=1.5,-0.5"], "non-negative"),
    ("merge-weights-sum", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", o, "--weights", "0.5,0.4"], "not 1"),
    ("merge-weights-nan", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", o, "--weights", "nan,0.5"], "finite"),
    ("merge-weights-text", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", o, "--weights", "half,half"],
     "comma-separated"),
    ("merge-other-architecture", lambda c, o: ["merge", _p(c, "a"), _p(c, "vit"), "-o", o], "same architecture"),
    ("merge-other-vocabulary", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), _p(c, "small_vocab"), "-o", o],
     "vocabularies"),
    ("merge-other-tokenizer", lambda c, o: ["merge", _p(c, "a"), _p(c, "other_tok"), "-o", o], "different tokenizer.json"),
    ("merge-out-is-an-input", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", _p(c, "b"), "--force"], "is the input"),
    ("merge-out-inside-an-input", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", str(c["a"] / "sub")],
     "inside the input"),
    ("merge-aligned-is-out", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", o, "--aligned", o], "the other output"),
    ("merge-aligned-is-an-input", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", o, "--aligned", _p(c, "a"),
                                                "--force"], "is the input"),
    ("merge-method-not-built", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", o, "--method", "activation"],
     "not built for many models"),
    ("merge-max-rounds-0", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", o, "--max-rounds", "0"], "at least 1"),
    ("merge-json-is-a-folder", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", o, "--json", _p(c, "root")],
     "a folder"),
    ("merge-unknown-family", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), "-o", o, "--groups", "nonsense"], "nonsense"),
    ("barrier-one-model", lambda c, o: ["barrier", _p(c, "a"), "--data", _p(c, "text")], "at least two models"),
    ("barrier3-weights-sum", lambda c, o: _barrier3(c, "--weights", "0.2,0.2,0.2"), "not 1"),
    ("barrier3-weights-count", lambda c, o: _barrier3(c, "--weights", "0.5,0.5"), "2 weights for 3 models"),
    ("barrier3-simplex-points-0", lambda c, o: _barrier3(c, "--simplex-points", "0"), "at least 1"),
    ("barrier4-plot", lambda c, o: ["barrier", _p(c, "a"), _p(c, "b"), _p(c, "c"), _p(c, "a"), "--data", _p(c, "text"),
                                    "--plot", str(c["root"] / "p.png")], "three models"),
    ("barrier3-other-architecture", lambda c, o: ["barrier", _p(c, "a"), _p(c, "b"), _p(c, "vit"), "--data",
                                                  _p(c, "text")], "same architecture"),
    ("barrier3-other-tokenizer", lambda c, o: ["barrier", _p(c, "a"), _p(c, "b"), _p(c, "other_tok"), "--data",
                                               _p(c, "text")], "different tokenizer.json"),
    ("barrier2-simplex-option", lambda c, o: ["barrier", _p(c, "a"), _p(c, "b"), "--data", _p(c, "text"), "--weights",
                                              "0.5,0.5"], "three or more"),
]


def _digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_one_line(case, ctx, capsys):
    _, argv_of, words = case
    out = ctx["root"] / "out"
    before = _digest(ctx["root"])
    capsys.readouterr()
    try:
        code = main(argv_of(ctx, str(out)))
    except SystemExit as e:  # argparse refuses while parsing
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code not in (0, None), "accepted"
    assert err and words in err[-1], err[-3:]
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith(("symmerge ", "usage:")) or ": error: " in err[-1], err[-1]
    assert not out.exists(), "output left behind"
    assert _digest(ctx["root"]) == before, "an input was modified or a file written"
