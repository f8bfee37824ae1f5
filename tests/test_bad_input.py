"""The catalogue of bad inputs and faults: each is refused (or handled) with one line, before any work.

For every case: exit code != 0, the last line of stderr is symmerge's (or argparse's) one-line message
with the expected words and no traceback, the inputs are byte-identical afterwards, and OUT does not
exist, nor any temporary folder beside it. Kills (SIGKILL, SIGTERM) of writing commands leave no OUT,
and the next run into the same OUT leaves no temporary folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers as T
from safetensors.torch import load_file, save_file

from symmerge.cli import main
from symmerge.images import processor_config, write_processor_config
from symmerge.tokenizers import char_tokenizer

TEXT = "".join(chr(c) for c in range(32, 127)) * 40 + "\n"  # every printable ASCII character


def _lm(path: Path, seed: int, text: str = TEXT, n_layer: int = 2, width: int = 24) -> Path:
    tok = char_tokenizer(text)
    torch.manual_seed(seed)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=width, n_layer=n_layer, n_head=3, n_positions=32, vocab_size=len(tok)))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _vit(path: Path) -> Path:
    torch.manual_seed(0)
    model = T.ViTForImageClassification(T.ViTConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                                    intermediate_size=40, image_size=8, patch_size=4, num_channels=1,
                                                    num_labels=10))
    model.save_pretrained(path)
    write_processor_config(path, processor_config(8, 1, 0.3, 0.4))
    return path


def _idx(path: Path, magic_dims: tuple[int, ...], payload: bytes) -> None:
    header = bytes([0, 0, 8, len(magic_dims)]) + b"".join(d.to_bytes(4, "big") for d in magic_dims)
    path.write_bytes(header + payload)


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    """Inputs every case may use: two char GPT-2s A and B, one with another tokenizer, a sharded copy of A
    whose index lies, text files, broken IDX folders, a regular file."""
    root = tmp_path_factory.mktemp("bad")
    c = {"root": root, "a": _lm(root / "a", 0), "b": _lm(root / "b", 1), "vit": _vit(root / "vit")}
    c["other_tok"] = _lm(root / "other_tok", 2, text=TEXT.replace("~", "é"))  # same size, other characters
    c["c"] = _lm(root / "c", 3)  # a third model of A's kind (merge, barrier of n models)
    c["small_vocab"] = _lm(root / "small_vocab", 4, text=TEXT.replace("~", ""))  # one character fewer
    c["wide"] = _lm(root / "wide", 5, width=48)  # A's kind, twice the width (expand)
    c["text"] = root / "text.txt"
    c["text"].write_text(TEXT * 3)
    c["unseen"] = root / "unseen.txt"
    c["unseen"].write_text(TEXT * 3 + "αβγ")
    c["file"] = root / "a_file"
    c["file"].write_text("not a folder")
    # a sharded copy of A whose index names a tensor in a shard that lacks it
    lie = root / "lying_index"
    lie.mkdir()
    sd = load_file(str(c["a"] / "model.safetensors"))
    names = sorted(sd)
    half = len(names) // 2
    save_file({k: sd[k] for k in names[:half]}, str(lie / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file({k: sd[k] for k in names[half:-1]}, str(lie / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {k: ("model-00001-of-00002.safetensors" if i < half else "model-00002-of-00002.safetensors")
                  for i, k in enumerate(names)}
    (lie / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (c["a"] / f).is_file():
            (lie / f).write_bytes((c["a"] / f).read_bytes())
    c["lying_index"] = lie
    # IDX folders: one with truncated pixel data, one whose header stops inside the dimensions
    for name, dims, payload in (("idx_trunc", (20, 8, 8), bytes(100)), ("idx_header", (20, 8, 8), b"")):
        folder = root / name
        folder.mkdir()
        for prefix in ("train", "t10k"):
            _idx(folder / f"{prefix}-labels-idx1-ubyte", (20,), bytes(20))
            _idx(folder / f"{prefix}-images-idx3-ubyte", dims, payload)
        if name == "idx_header":  # cut the images' header after the magic number and one dimension
            for prefix in ("train", "t10k"):
                f = folder / f"{prefix}-images-idx3-ubyte"
                f.write_bytes(f.read_bytes()[:8])
        c[name] = folder
    return c


def _p(c, key):
    return str(c[key])


def _barrier3(c, *extra):
    return ["barrier", _p(c, "a"), _p(c, "b"), _p(c, "c"), "--data", _p(c, "text"), *extra]


# (id, argv builder, expected words in the one-line message); OUT is always c["root"]/"out"
CASES = [
    ("out-under-a-file", lambda c, o: ["transform", _p(c, "a"), "-o", str(c["file"] / "out")], "is a file"),
    ("out-is-the-input", lambda c, o: ["transform", _p(c, "a"), "-o", _p(c, "a"), "--force"], "is the input"),
    ("out-inside-the-input", lambda c, o: ["transform", _p(c, "a"), "-o", str(c["a"] / "sub")], "inside the input"),
    ("out-holds-the-input", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "b"), "--lam", "0.5", "-o", _p(c, "root"),
                                          "--force"], "holds the input"),
    ("interpolate-out-is-b", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "b"), "--lam", "0.5", "-o", _p(c, "b"),
                                           "--force"], "is the input"),
    ("lying-shard-index", lambda c, o: ["transform", _p(c, "lying_index"), "-o", o], "lacks"),
    ("inspect-lying-shard-index", lambda c, o: ["inspect", _p(c, "lying_index")], "lacks"),
    ("transform-spread-0", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--spread", "0"], "at least 1"),
    ("transform-spread-negative", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--spread", "-2"], "at least 1"),
    ("transform-spread-nan", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--spread", "nan"], "not a finite number"),
    ("interpolate-lam-nan", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "b"), "--lam", "nan", "-o", o],
     "not a finite number"),
    ("interpolate-lam-inf", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "b"), "--lam", "inf", "--extrapolate", "-o", o],
     "not a finite number"),
    ("interpolate-lam-outside", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "b"), "--lam", "1.5", "-o", o],
     "--extrapolate"),
    ("interpolate-other-tokenizer", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "other_tok"), "--lam", "0.5", "-o", o],
     "different tokenizer.json"),
    ("barrier-other-tokenizer", lambda c, o: ["barrier", _p(c, "a"), _p(c, "other_tok"), "--data", _p(c, "text")],
     "different tokenizer.json"),
    ("barrier-max-batches-0", lambda c, o: ["barrier", _p(c, "a"), _p(c, "b"), "--data", _p(c, "text"), "--max-batches", "0"],
     "at least 1"),
    ("barrier-points-1", lambda c, o: ["barrier", _p(c, "a"), _p(c, "b"), "--data", _p(c, "text"), "--points", "1"],
     "at least 2"),
    ("barrier-plot-missing-folder", lambda c, o: ["barrier", _p(c, "a"), _p(c, "b"), "--data", _p(c, "text"), "--plot",
                                                  str(c["root"] / "nowhere" / "p.png")], "does not exist"),
    ("barrier-json-is-a-folder", lambda c, o: ["barrier", _p(c, "a"), _p(c, "b"), "--data", _p(c, "text"), "--json",
                                               _p(c, "root")], "is a folder"),
    ("eval-json-missing-folder", lambda c, o: ["eval", _p(c, "a"), "--data", _p(c, "text"), "--json",
                                               str(c["root"] / "nowhere" / "r.json")], "does not exist"),
    ("eval-batch-size-0", lambda c, o: ["eval", _p(c, "a"), "--data", _p(c, "text"), "--batch-size", "0"], "at least 1"),
    ("eval-unseen-characters", lambda c, o: ["eval", _p(c, "a"), "--data", _p(c, "unseen"), "--split", "all"],
     "outside the model's vocabulary"),
    ("align-lr-nan", lambda c, o: ["align", _p(c, "a"), _p(c, "b"), "-o", o, "--method", "learned", "--data", _p(c, "text"),
                                   "--lr", "nan"], "not a finite number"),
    ("align-lr-negative", lambda c, o: ["align", _p(c, "a"), _p(c, "b"), "-o", o, "--method", "dual", "--data", _p(c, "text"),
                                        "--lr=-1e-3"], "must be above 0"),
    ("align-json-is-a-folder", lambda c, o: ["align", _p(c, "a"), _p(c, "b"), "-o", o, "--json", _p(c, "root")], "is a folder"),
    ("align-out-is-b", lambda c, o: ["align", _p(c, "a"), _p(c, "b"), "-o", _p(c, "b"), "--force"], "is the input"),
    ("align-other-tokenizer", lambda c, o: ["align", _p(c, "a"), _p(c, "other_tok"), "-o", o], "different tokenizer.json"),
    ("align-learned-without-data", lambda c, o: ["align", _p(c, "a"), _p(c, "b"), "-o", o, "--method", "learned"], "--data"),
    ("eval-truncated-idx", lambda c, o: ["eval", _p(c, "vit"), "--data", _p(c, "idx_trunc")], "truncated"),
    ("eval-header-cut-idx", lambda c, o: ["eval", _p(c, "vit"), "--data", _p(c, "idx_header")], "truncated"),
    # merge and barrier of n models (issue 14)
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
    ("transform-out-dtype-unknown", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--out-dtype", "float8"], "invalid choice"),
    ("align-out-dtype-unknown", lambda c, o: ["align", _p(c, "a"), _p(c, "b"), "-o", o, "--out-dtype", "int8"], "invalid choice"),
    ("expand-other-architecture", lambda c, o: ["expand", _p(c, "a"), "--like", _p(c, "vit"), "-o", o], "one architecture"),
    ("expand-other-vocabulary", lambda c, o: ["expand", _p(c, "small_vocab"), "--like", _p(c, "wide"), "-o", o],
     "vocabularies"),
    ("expand-narrow-is-wider", lambda c, o: ["expand", _p(c, "wide"), "--like", _p(c, "a"), "-o", o], "wider than WIDE"),
    ("expand-out-is-the-input", lambda c, o: ["expand", _p(c, "a"), "--like", _p(c, "wide"), "-o", _p(c, "a"), "--force"],
     "is the input"),
    ("expand-like-is-not-a-checkpoint", lambda c, o: ["expand", _p(c, "a"), "--like", _p(c, "file"), "-o", o],
     "not a folder with a config.json"),
    ("align-mixed-widths-other-vocabulary", lambda c, o: ["align", _p(c, "wide"), _p(c, "small_vocab"), "-o", o],
     "vocabularies"),
    # --device and --dtype (symmerge.devices); this machine has no GPU, so every cuda is refused
    ("train-device-cuda", lambda c, o: ["train", "--arch", "gpt2", "--data", _p(c, "text"), "-o", o, "--device", "cuda"],
     "no CUDA GPU is visible"),
    ("eval-device-cuda", lambda c, o: ["eval", _p(c, "a"), "--data", _p(c, "text"), "--device", "cuda"], "no CUDA GPU"),
    ("eval-device-cuda-index", lambda c, o: ["eval", _p(c, "a"), "--data", _p(c, "text"), "--device", "cuda:7"],
     "no CUDA GPU"),
    ("eval-device-unknown", lambda c, o: ["eval", _p(c, "a"), "--data", _p(c, "text"), "--device", "gpu"],
     "not cpu, cuda or cuda:N"),
    ("eval-dtype-unknown", lambda c, o: ["eval", _p(c, "a"), "--data", _p(c, "text"), "--dtype", "float8"], "invalid choice"),
    ("barrier-device-cuda", lambda c, o: ["barrier", _p(c, "a"), _p(c, "b"), "--data", _p(c, "text"), "--device", "cuda:0"],
     "no CUDA GPU"),
    ("barrier3-device-cuda", lambda c, o: _barrier3(c, "--device", "cuda"), "no CUDA GPU"),
    ("align-dual-device-cuda", lambda c, o: ["align", _p(c, "a"), _p(c, "b"), "-o", o, "--method", "dual", "--data",
                                            _p(c, "text"), "--device", "cuda"], "no CUDA GPU"),
    ("align-weight-dtype", lambda c, o: ["align", _p(c, "a"), _p(c, "b"), "-o", o, "--dtype", "bfloat16"],
     "are for --method learned or dual"),
    ("demo-device-cuda", lambda c, o: ["demo", "-o", o, "--device", "cuda"], "no CUDA GPU"),
]


def _digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _leftovers(out: Path) -> list[Path]:
    return list(out.parent.glob(f".{out.name}.tmp-*")) + list(out.parent.glob(f".{out.name}.old-*"))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_one_line(case, ctx, capsys):
    _, argv_of, words = case
    out = ctx["root"] / "out"
    inputs = {k: _digest(ctx[k]) for k in ("a", "b", "c", "other_tok", "small_vocab", "lying_index", "vit")}
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
    assert not out.exists() and not _leftovers(out), "output or temporary folder left behind"
    assert {k: _digest(ctx[k]) for k in inputs} == inputs, "an input was modified"


def test_unwritable_output_folder_is_refused(ctx, capsys, monkeypatch):
    """Root may write anywhere, so the permission test asks os.access as an ordinary user would be answered."""
    locked = ctx["root"] / "locked"
    locked.mkdir(exist_ok=True)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    assert main(["transform", _p(ctx, "a"), "-o", str(locked / "out")]) == 2
    assert "no write permission" in capsys.readouterr().err
    assert not (locked / "out").exists()


def test_full_disk_gives_one_line_and_no_output(ctx, capsys, monkeypatch):
    import errno

    import symmerge.io as io

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "model-00001.safetensors")

    monkeypatch.setattr(io, "save_file", full)
    out = ctx["root"] / "full"
    assert main(["transform", _p(ctx, "a"), "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "No space left on device" in err and err.startswith("symmerge transform: error:"), err
    assert not out.exists() and not _leftovers(out)


def test_stale_temporary_folders_are_cleaned_and_a_hidden_old_output_restored(ctx, tmp_path):
    from symmerge.io import clean_stale

    out = tmp_path / "o"
    dead = 2**22 + 12345  # above the default pid_max: no such process
    (tmp_path / f".o.tmp-{dead}-abc").mkdir()
    (tmp_path / ".o.tmp-xyz").mkdir()  # an earlier version's name, without a pid
    (tmp_path / f".o.tmp-{os.getpid()}-live").mkdir()  # a write in progress (this process) is left alone
    old = tmp_path / f".o.old-{dead}"
    old.mkdir()
    (old / "config.json").write_text("{}")
    clean_stale(out)  # killed between the two renames: the old output comes back
    assert (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["o", f".o.tmp-{os.getpid()}-live"])
    old.mkdir()
    clean_stale(out)  # the target exists: the old copy is just removed
    assert not old.exists() and (out / "config.json").is_file()


KILLED = [
    ("transform", lambda c, o: ["transform", _p(c, "big"), "-o", o]),
    ("align-weight", lambda c, o: ["align", _p(c, "big"), _p(c, "big_b"), "-o", o, "--method", "weight", "--max-iters", "1"]),
    ("interpolate", lambda c, o: ["interpolate", _p(c, "big"), _p(c, "big_b"), "--lam", "0.5", "-o", o]),
]


@pytest.fixture(scope="module")
def big(ctx):
    """Models deep enough that writing takes a moment, so a kill can land while the temporary folder exists."""
    ctx["big"] = _lm(ctx["root"] / "big", 0, n_layer=8, width=144)
    ctx["big_b"] = _lm(ctx["root"] / "big_b", 1, n_layer=8, width=144)
    return ctx


#: SIGKILL for every writing command; SIGTERM (handled by the one mechanism in cli.main and io) for one of them
KILLS = [(case, signal.SIGKILL) for case in KILLED] + [(KILLED[0], signal.SIGTERM)]


@pytest.mark.parametrize("case,sig", KILLS, ids=[f"{c[0]}-{s.name.lower()}" for c, s in KILLS])
def test_killed_write_leaves_no_output_and_the_next_run_no_litter(case, sig, big, tmp_path):
    name, argv_of = case
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "symmerge", *argv_of(big, str(out))]
    src = str(Path(__file__).parents[1] / "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not list(tmp_path.glob(".out.tmp-*")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.001)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    assert proc.returncode != 0, f"{name} finished before the signal landed (the test's kill window was missed)"
    assert not out.exists(), "a killed run left an output"
    if sig == signal.SIGTERM:  # handled: the temporary folder is removed at once
        assert not list(tmp_path.glob(".out.*")), "SIGTERM left a temporary folder"
    assert main(argv_of(big, str(out))) == 0
    assert out.is_dir() and not list(tmp_path.glob(".out.*")), "the next run left litter"
