"""The catalogue of bad inputs and faults: each is refused (or handled) with one line, before any work.

For every case: exit code != 0, the last line of stderr is symmerge's (or argparse's) one-line message
with the expected words and no traceback, every input (`bad_inputs.build`) is byte-identical afterwards,
and OUT does not exist, nor any temporary folder beside it. Faults of the machine rather than the
command line: a full disk (a real 16 KiB tmpfs where this process may mount one, else safetensors'
own full-disk error raised from the writer) and a folder without write permission. Kills of writing
commands, and the cleaning of what a kill leaves, are in `test_kill.py`.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest
from safetensors import SafetensorError

from bad_inputs import build, digest, folders, leftovers
from symmerge.cli import main


def _mount_tmpfs(folder: Path) -> bool:
    folder.mkdir()
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(folder)], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    c = build(tmp_path_factory.mktemp("bad"))
    c["full"] = c["root"] / "full"
    c["tmpfs"] = _mount_tmpfs(c["full"])
    yield c
    if c["tmpfs"]:
        subprocess.run(["umount", str(c["full"])], check=True)


def _p(c, key):
    return str(c[key])


def _a_b(c, *extra):
    return [_p(c, "a"), _p(c, "b"), *extra]


def _barrier(c, *extra):
    return ["barrier", *_a_b(c, "--data", _p(c, "text"), *extra)]


def _barrier3(c, *extra):
    return ["barrier", *_a_b(c, _p(c, "c"), "--data", _p(c, "text"), *extra)]


def _align(c, o, *extra):
    return ["align", *_a_b(c, "-o", o, *extra)]


def _learned(c, o, *extra):
    return _align(c, o, "--method", "learned", "--data", _p(c, "text"), *extra)


def _activation(c, o, *extra):
    return _align(c, o, "--method", "activation", "--data", _p(c, "text"), *extra)


def _interp(c, o, *extra):
    return ["interpolate", *_a_b(c, "--lam", "0.5", "-o", o, *extra)]


def _merge(c, o, *extra):
    return ["merge", *_a_b(c, "-o", o, *extra)]


def _eval(c, *extra, model="a", data="text"):
    return ["eval", _p(c, model), "--data", _p(c, data), *extra]


def _train(c, o, *extra, arch="gpt2", data="text"):
    return ["train", "--arch", arch, "--data", _p(c, data), "-o", o, *extra]


def _demo(c, o, *extra):
    return ["demo", "-o", o, *extra]


AT_LEAST_1, FINITE = "at least 1", "not a finite number"

# (id, argv builder, expected words in the one-line message); OUT is c["root"]/"out" unless the case's fault moves it
CASES = [
    # where outputs go
    ("out-under-a-file", lambda c, o: ["transform", _p(c, "a"), "-o", str(c["file"] / "out")], "is a file"),
    ("out-is-the-input", lambda c, o: ["transform", _p(c, "a"), "-o", _p(c, "a"), "--force"], "is the input"),
    ("out-inside-the-input", lambda c, o: ["transform", _p(c, "a"), "-o", str(c["a"] / "sub")], "inside the input"),
    ("out-holds-the-input", lambda c, o: _interp(c, _p(c, "root"), "--force"), "holds the input"),
    ("interpolate-out-is-b", lambda c, o: _interp(c, _p(c, "b"), "--force"), "is the input"),
    ("align-out-is-b", lambda c, o: _align(c, _p(c, "b"), "--force"), "is the input"),
    ("align-out-inside-a", lambda c, o: _align(c, str(c["a"] / "sub")), "inside the input"),
    ("merge-out-is-an-input", lambda c, o: _merge(c, _p(c, "b"), "--force"), "is the input"),
    ("merge-out-inside-an-input", lambda c, o: _merge(c, str(c["a"] / "sub")), "inside the input"),
    ("merge-aligned-is-out", lambda c, o: _merge(c, o, "--aligned", o), "the other output"),
    ("merge-aligned-is-an-input", lambda c, o: _merge(c, o, "--aligned", _p(c, "a"), "--force"), "is the input"),
    ("merge-aligned-inside-an-input", lambda c, o: _merge(c, o, "--aligned", str(c["a"] / "sub")), "inside the input"),
    ("merge-aligned-under-a-file", lambda c, o: _merge(c, o, "--aligned", str(c["file"] / "x")), "is a file"),
    ("expand-out-is-the-input", lambda c, o: ["expand", _p(c, "a"), "--like", _p(c, "wide"), "-o", _p(c, "a"), "--force"],
     "is the input"),
    ("expand-out-is-like", lambda c, o: ["expand", _p(c, "a"), "--like", _p(c, "wide"), "-o", _p(c, "wide"), "--force"],
     "is the input"),
    ("expand-out-inside-like", lambda c, o: ["expand", _p(c, "a"), "--like", _p(c, "wide"), "-o", str(c["wide"] / "s")],
     "inside the input"),
    ("train-out-exists", lambda c, o: _train(c, _p(c, "a")), "--force"),
    ("train-out-under-a-file", lambda c, o: _train(c, str(c["file"] / "x")), "is a file"),
    ("demo-out-holds-another-run", lambda c, o: _demo(c, _p(c, "a")), "holds another run"),
    ("demo-out-under-a-file", lambda c, o: _demo(c, str(c["file"] / "x")), "is a file"),
    # report files
    ("barrier-plot-missing-folder", lambda c, o: _barrier(c, "--plot", str(c["root"] / "nowhere" / "p.png")), "does not exist"),
    ("barrier-json-missing-folder", lambda c, o: _barrier(c, "--json", str(c["root"] / "nowhere" / "r.json")), "does not exist"),
    ("barrier-plot-unknown-type", lambda c, o: _barrier(c, "--plot", str(c["root"] / "p.txt")), "matplotlib cannot write .txt"),
    ("barrier-plot-no-suffix", lambda c, o: _barrier(c, "--plot", str(c["root"] / "plot")), "without a suffix"),
    ("barrier-plot-is-the-json", lambda c, o: _barrier(c, "--plot", str(c["root"] / "r.png"), "--json",
                                                        str(c["root"] / "r.png")), "both name"),
    ("barrier3-plot-unknown-type", lambda c, o: _barrier3(c, "--plot", str(c["root"] / "p.json")), "matplotlib cannot write"),
    ("out-in-proc", lambda c, o: ["transform", _p(c, "a"), "-o", "/proc/symmerge-out"], "cannot write"),
    ("barrier-json-is-a-folder", lambda c, o: _barrier(c, "--json", _p(c, "root")), "is a folder"),
    ("eval-json-missing-folder", lambda c, o: _eval(c, "--json", str(c["root"] / "nowhere" / "r.json")), "does not exist"),
    ("eval-json-is-a-folder", lambda c, o: _eval(c, "--json", _p(c, "root")), "is a folder"),
    ("align-json-is-a-folder", lambda c, o: _align(c, o, "--json", _p(c, "root")), "is a folder"),
    ("align-json-is-out", lambda c, o: _align(c, o, "--json", o), "is the output folder"),
    ("merge-json-is-aligned", lambda c, o: _merge(c, o, "--aligned", o + "-al", "--json", o + "-al"), "is the output folder"),
    ("align-json-missing-folder", lambda c, o: _align(c, o, "--json", str(c["root"] / "nowhere" / "r.json")), "does not exist"),
    ("merge-json-is-a-folder", lambda c, o: _merge(c, o, "--json", _p(c, "root")), "a folder"),
    # checkpoints: wrong paths, wrong kinds, broken files
    ("inspect-missing-folder", lambda c, o: ["inspect", str(c["root"] / "nope")], "is not a folder"),
    ("transform-model-is-a-file", lambda c, o: ["transform", _p(c, "text"), "-o", o], "is not a folder"),
    ("inspect-no-config", lambda c, o: ["inspect", _p(c, "no_config")], "has no config.json"),
    ("eval-data-folder-as-model", lambda c, o: _eval(c, model="idx_trunc"), "has no config.json"),
    ("transform-no-weights", lambda c, o: ["transform", _p(c, "no_weights"), "-o", o], "has no model.safetensors"),
    ("transform-pickles-only", lambda c, o: ["transform", _p(c, "pickles"), "-o", o], "never unpickles"),
    ("inspect-config-not-json", lambda c, o: ["inspect", _p(c, "bad_config")], "is not valid JSON"),
    ("inspect-config-without-model-type", lambda c, o: ["inspect", _p(c, "typeless_config")], "has no model_type"),
    ("transform-unsupported-architecture", lambda c, o: ["transform", _p(c, "bert"), "-o", o], "post-norm"),
    ("transform-truncated-safetensors", lambda c, o: ["transform", _p(c, "truncated"), "-o", o], "truncated or corrupt"),
    ("inspect-header-cut-safetensors", lambda c, o: ["inspect", _p(c, "header_cut")], "truncated or corrupt"),
    ("interpolate-truncated-b", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "truncated"), "--lam", "0.5", "-o", o],
     "truncated or corrupt"),
    ("merge-truncated-model", lambda c, o: ["merge", _p(c, "a"), _p(c, "truncated"), "-o", o], "truncated or corrupt"),
    ("eval-truncated-safetensors", lambda c, o: _eval(c, model="truncated"), "truncated or corrupt"),
    ("lying-shard-index", lambda c, o: ["transform", _p(c, "lying_index"), "-o", o], "lacks"),
    ("inspect-lying-shard-index", lambda c, o: ["inspect", _p(c, "lying_index")], "lacks"),
    ("align-lying-shard-index", lambda c, o: ["align", _p(c, "a"), _p(c, "lying_index"), "-o", o], "lacks"),
    ("eval-lying-shard-index", lambda c, o: _eval(c, model="lying_index"), "lacks"),
    ("transform-missing-shard", lambda c, o: ["transform", _p(c, "missing_shard"), "-o", o], "are missing"),
    ("inspect-index-not-json", lambda c, o: ["inspect", _p(c, "bad_index")], "not a valid safetensors index"),
    ("transform-tensor-wrong-shape", lambda c, o: ["transform", _p(c, "wrong_shape"), "-o", o], "config.json implies"),
    ("interpolate-tensor-wrong-shape", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "wrong_shape"), "--lam", "0.5", "-o", o],
     "config.json implies"),
    ("transform-tensor-missing", lambda c, o: ["transform", _p(c, "missing_tensor"), "-o", o], "is missing"),
    ("merge-missing-model", lambda c, o: ["merge", _p(c, "a"), str(c["root"] / "nope"), "-o", o], "is not a folder"),
    ("expand-missing-narrow", lambda c, o: ["expand", str(c["root"] / "nope"), "--like", _p(c, "wide"), "-o", o],
     "is not a folder"),
    ("expand-like-is-not-a-checkpoint", lambda c, o: ["expand", _p(c, "a"), "--like", _p(c, "file"), "-o", o],
     "not a folder with a config.json"),
    ("eval-no-tokenizer", lambda c, o: _eval(c, model="no_tokenizer"), "has no tokenizer"),
    ("barrier-no-tokenizer", lambda c, o: ["barrier", _p(c, "no_tokenizer"), _p(c, "no_tokenizer"), "--data", _p(c, "text")],
     "has no tokenizer"),
    # two or more models that do not belong together
    ("interpolate-other-tokenizer", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "other_tok"), "--lam", "0.5", "-o", o],
     "different tokenizer.json"),
    ("align-other-tokenizer", lambda c, o: ["align", _p(c, "a"), _p(c, "other_tok"), "-o", o], "different tokenizer.json"),
    ("barrier-other-tokenizer", lambda c, o: ["barrier", _p(c, "a"), _p(c, "other_tok"), "--data", _p(c, "text")],
     "different tokenizer.json"),
    ("merge-other-tokenizer", lambda c, o: ["merge", _p(c, "a"), _p(c, "other_tok"), "-o", o], "different tokenizer.json"),
    ("barrier3-other-tokenizer", lambda c, o: ["barrier", _p(c, "a"), _p(c, "b"), _p(c, "other_tok"), "--data", _p(c, "text")],
     "different tokenizer.json"),
    ("interpolate-other-architecture", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "vit"), "--lam", "0.5", "-o", o],
     "same architecture"),
    ("align-other-architecture", lambda c, o: ["align", _p(c, "a"), _p(c, "llama"), "-o", o], "same architecture"),
    ("merge-other-architecture", lambda c, o: ["merge", _p(c, "a"), _p(c, "vit"), "-o", o], "same architecture"),
    ("barrier3-other-architecture", lambda c, o: ["barrier", _p(c, "a"), _p(c, "b"), _p(c, "vit"), "--data", _p(c, "text")],
     "same architecture"),
    ("expand-other-architecture", lambda c, o: ["expand", _p(c, "a"), "--like", _p(c, "vit"), "-o", o], "one architecture"),
    ("align-other-layer-count", lambda c, o: ["align", _p(c, "a"), _p(c, "deep"), "-o", o], "layer counts"),
    ("interpolate-other-layer-count", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "deep"), "--lam", "0.5", "-o", o],
     "layer counts"),
    ("barrier-other-layer-count", lambda c, o: ["barrier", _p(c, "a"), _p(c, "deep"), "--data", _p(c, "text")], "layer counts"),
    ("merge-other-layer-count", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), _p(c, "deep"), "-o", o], "layer counts"),
    ("expand-other-layer-count", lambda c, o: ["expand", _p(c, "a"), "--like", _p(c, "deep"), "-o", o], "layer counts"),
    ("align-other-vocabulary", lambda c, o: ["align", _p(c, "a"), _p(c, "small_vocab"), "-o", o], "vocabularies"),
    ("merge-other-vocabulary", lambda c, o: ["merge", _p(c, "a"), _p(c, "b"), _p(c, "small_vocab"), "-o", o], "vocabularies"),
    ("expand-other-vocabulary", lambda c, o: ["expand", _p(c, "small_vocab"), "--like", _p(c, "wide"), "-o", o], "vocabularies"),
    ("align-mixed-widths-other-vocabulary", lambda c, o: ["align", _p(c, "wide"), _p(c, "small_vocab"), "-o", o], "vocabularies"),
    ("expand-narrow-is-wider", lambda c, o: ["expand", _p(c, "wide"), "--like", _p(c, "a"), "-o", o], "wider than WIDE"),
    # data: missing, of the wrong kind, unreadable, too little
    ("barrier-missing-data", lambda c, o: _barrier(c)[:-1] + [str(c["root"] / "nope.txt")], "does not exist"),
    ("align-activation-empty-text", lambda c, o: _align(c, o, "--method", "activation", "--data", _p(c, "empty")), "is empty"),
    ("eval-binary-text", lambda c, o: _eval(c, data="binary"), "looks binary"),
    ("barrier-text-not-utf8", lambda c, o: ["barrier", *_a_b(c, "--data", _p(c, "latin1"))], "not UTF-8"),
    ("eval-text-too-short", lambda c, o: _eval(c, data="short"), "at least 3"),
    ("eval-unseen-characters", lambda c, o: _eval(c, "--split", "all", data="unseen"), "outside the model's vocabulary"),
    ("align-activation-unseen-characters", lambda c, o: _align(c, o, "--method", "activation", "--data", _p(c, "unseen"),
                                                               "--split", "all"), "outside the model's vocabulary"),
    ("eval-text-for-a-vit", lambda c, o: _eval(c, model="vit"), "not an image data set"),
    ("eval-images-for-an-lm", lambda c, o: ["eval", _p(c, "a"), "--data", "digits"], "pass a text file"),
    ("eval-truncated-idx", lambda c, o: _eval(c, model="vit", data="idx_trunc"), "truncated"),
    ("eval-header-cut-idx", lambda c, o: _eval(c, model="vit", data="idx_header"), "truncated"),
    ("eval-idx-bad-magic", lambda c, o: _eval(c, model="vit", data="idx_magic"), "bad magic number"),
    ("eval-idx-labels-beyond-classes", lambda c, o: _eval(c, model="vit", data="idx_labels"), "classes"),
    ("eval-idx-missing-test-files", lambda c, o: _eval(c, model="vit", data="idx_no_test"), "has no t10k-images"),
    ("align-learned-without-data", lambda c, o: _align(c, o, "--method", "learned"), "--data"),
    ("align-activation-without-data", lambda c, o: _align(c, o, "--method", "activation"), "--data"),
    ("train-missing-data", lambda c, o: ["train", "--arch", "gpt2", "--data", str(c["root"] / "nope.txt"), "-o", o],
     "does not exist"),
    ("train-empty-text", lambda c, o: _train(c, o, data="empty"), "is empty"),
    ("train-text-too-short", lambda c, o: _train(c, o, data="short"), "at least 3"),
    ("train-text-for-a-vit", lambda c, o: _train(c, o, arch="vit"), "needs image data"),
    ("train-images-for-gpt2", lambda c, o: ["train", "--arch", "gpt2", "--data", "digits", "-o", o], "language model"),
    ("train-truncated-idx", lambda c, o: _train(c, o, arch="vit", data="idx_trunc"), "truncated"),
    ("train-gpt2-tokenizer-without-files", lambda c, o: _train(c, o, "--tokenizer", "gpt2"), "--gpt2-bpe"),
    ("train-resume-without-state", lambda c, o: _train(c, o, "--resume"), "to resume from"),
    ("demo-missing-data", lambda c, o: _demo(c, o, "--data", str(c["root"] / "nope.txt")), "does not exist"),
    ("demo-truncated-idx", lambda c, o: _demo(c, o, "--data", _p(c, "idx_trunc")), "truncated"),
    # numbers: NaN, inf, negative, zero, text
    ("transform-spread-0", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--spread", "0"], "at least 1"),
    ("transform-spread-negative", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--spread", "-2"], "at least 1"),
    ("transform-spread-above-cap", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--spread", "1e30"], "at most 100"),
    ("transform-spread-nan", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--spread", "nan"], FINITE),
    ("transform-spread-inf", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--spread", "inf"], FINITE),
    ("transform-seed-not-an-integer", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--seed", "1.5"], "is not a whole number"),
    ("interpolate-lam-nan", lambda c, o: ["interpolate", *_a_b(c, "--lam", "nan", "-o", o)], FINITE),
    ("interpolate-lam-inf", lambda c, o: ["interpolate", *_a_b(c, "--lam", "inf", "--extrapolate", "-o", o)], FINITE),
    ("interpolate-lam-nan-extrapolate", lambda c, o: ["interpolate", *_a_b(c, "--lam", "nan", "--extrapolate", "-o", o)],
     FINITE),
    ("interpolate-lam-minus-inf", lambda c, o: ["interpolate", *_a_b(c, "--lam=-inf", "--extrapolate", "-o", o)], FINITE),
    ("interpolate-lam-outside", lambda c, o: ["interpolate", *_a_b(c, "--lam", "1.5", "-o", o)], "--extrapolate"),
    ("interpolate-lam-negative", lambda c, o: ["interpolate", *_a_b(c, "--lam=-0.5", "-o", o)], "--extrapolate"),
    ("interpolate-lam-text", lambda c, o: ["interpolate", *_a_b(c, "--lam", "half", "-o", o)], "is not a number"),
    ("align-max-iters-0", lambda c, o: _align(c, o, "--max-iters", "0"), AT_LEAST_1),
    ("align-max-iters-negative", lambda c, o: _align(c, o, "--max-iters=-3"), AT_LEAST_1),
    ("align-batch-size-0", lambda c, o: _activation(c, o, "--batch-size", "0"), AT_LEAST_1),
    ("align-max-batches-0", lambda c, o: _activation(c, o, "--max-batches", "0"), AT_LEAST_1),
    ("align-seq-len-0", lambda c, o: _activation(c, o, "--seq-len", "0"), "outside 2..32"),
    ("align-seq-len-beyond-context", lambda c, o: _activation(c, o, "--seq-len", "1000"), "outside 2..32"),
    ("align-split-unknown", lambda c, o: _activation(c, o, "--split", "nonsense"), "unknown split"),
    ("align-lr-nan", lambda c, o: _learned(c, o, "--lr", "nan"), FINITE),
    ("align-lr-inf", lambda c, o: _learned(c, o, "--lr", "inf"), FINITE),
    ("align-lr-0", lambda c, o: _learned(c, o, "--lr", "0"), "must be above 0"),
    ("align-lr-negative", lambda c, o: _align(c, o, "--method", "dual", "--data", _p(c, "text"), "--lr=-1e-3"), "must be above 0"),
    ("align-steps-negative", lambda c, o: _learned(c, o, "--steps=-5"), "at least 0"),
    ("align-eval-every-0", lambda c, o: _learned(c, o, "--eval-every", "0"), AT_LEAST_1),
    ("align-patience-negative", lambda c, o: _learned(c, o, "--patience=-1"), "at least 0"),
    ("align-val-batches-0", lambda c, o: _learned(c, o, "--val-batches", "0"), AT_LEAST_1),
    ("align-val-points-1", lambda c, o: _learned(c, o, "--val-points", "1"), "at least 3"),
    ("align-lam-range-reversed", lambda c, o: _learned(c, o, "--lam-range", "0.6,0.4"), "0 <= low <= high <= 1"),
    ("align-lam-range-nan", lambda c, o: _learned(c, o, "--lam-range", "nan,1"), "0 <= low <= high <= 1"),
    ("align-lam-range-outside", lambda c, o: _learned(c, o, "--lam-range=-1,2"), "0 <= low <= high <= 1"),
    ("align-lam-range-text", lambda c, o: _learned(c, o, "--lam-range", "low,high"), "LOW,HIGH"),
    ("align-lr-word", lambda c, o: _learned(c, o, "--lr", "fast"), "neither 'auto' nor a number"),
    ("align-lr-auto-quick", lambda c, o: _learned(c, o, "--recipe", "quick", "--lr", "auto"), "needs a longer run"),
    ("align-lr-auto-short", lambda c, o: _learned(c, o, "--steps", "10", "--lr", "auto"), "needs a longer run"),
    ("align-recipe-unknown", lambda c, o: _learned(c, o, "--recipe", "best"), "invalid choice"),
    ("align-steps-and-epochs", lambda c, o: _learned(c, o, "--steps", "5", "--epochs", "2"), "give one of them"),
    ("align-epochs-nan", lambda c, o: _learned(c, o, "--epochs", "nan"), "finite number above 0"),
    ("align-epochs-0", lambda c, o: _learned(c, o, "--epochs", "0"), "finite number above 0"),
    ("align-val-batches-text", lambda c, o: _learned(c, o, "--val-batches", "many"), "neither 'auto' nor a whole number"),
    ("align-param-unknown", lambda c, o: _learned(c, o, "--param", "nonsense"), "unknown parameterisation"),
    ("align-resume-without-checkpoint", lambda c, o: _learned(c, o, "--resume"), "no learned-matching checkpoint"),
    ("align-unknown-family", lambda c, o: _align(c, o, "--groups", "nonsense"), "nonsense"),
    ("align-both-residual-groups", lambda c, o: _align(c, o, "--groups", "residual_perm,residual_rotation"), "not both"),
    ("align-out-dtype-unknown", lambda c, o: _align(c, o, "--out-dtype", "int8"), "invalid choice"),
    ("transform-out-dtype-unknown", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--out-dtype", "float8"], "invalid choice"),
    ("barrier-max-batches-0", lambda c, o: _barrier(c, "--max-batches", "0"), AT_LEAST_1),
    ("barrier-batch-size-0", lambda c, o: _barrier(c, "--batch-size", "0"), AT_LEAST_1),
    ("barrier-batch-size-nan", lambda c, o: _barrier(c, "--batch-size", "nan"), "not a whole number"),
    ("barrier-seq-len-1", lambda c, o: _barrier(c, "--seq-len", "1"), "outside 2..32"),
    ("barrier-points-1", lambda c, o: _barrier(c, "--points", "1"), "at least 2"),
    ("barrier-points-0", lambda c, o: _barrier(c, "--points", "0"), "at least 2"),
    ("eval-batch-size-0", lambda c, o: _eval(c, "--batch-size", "0"), AT_LEAST_1),
    ("eval-max-batches-negative", lambda c, o: _eval(c, "--max-batches=-1"), AT_LEAST_1),
    ("eval-seq-len-negative", lambda c, o: _eval(c, "--seq-len=-5"), "outside 2..32"),
    ("eval-split-unknown", lambda c, o: _eval(c, "--split", "nonsense"), "invalid choice"),
    ("train-steps-0", lambda c, o: _train(c, o, "--steps", "0"), AT_LEAST_1),
    ("train-steps-negative", lambda c, o: _train(c, o, "--steps=-1"), AT_LEAST_1),
    ("train-batch-size-0", lambda c, o: _train(c, o, "--batch-size", "0"), AT_LEAST_1),
    ("train-lr-nan", lambda c, o: _train(c, o, "--lr", "nan"), FINITE),
    ("train-lr-negative", lambda c, o: _train(c, o, "--lr=-1"), "must be above 0"),
    ("train-lr-0", lambda c, o: _train(c, o, "--lr", "0"), "must be above 0"),
    ("train-warmup-negative", lambda c, o: _train(c, o, "--warmup=-1"), "at least 0"),
    ("train-save-every-0", lambda c, o: _train(c, o, "--save-every", "0"), AT_LEAST_1),
    ("train-threads-0", lambda c, o: _train(c, o, "--threads", "0"), AT_LEAST_1),
    ("train-threads-negative", lambda c, o: _train(c, o, "--threads=-1"), AT_LEAST_1),
    ("train-bpe-vocab-size-0", lambda c, o: _train(c, o, "--tokenizer", "bpe", "--vocab-size", "0"), "too small"),
    ("train-d-model-0", lambda c, o: _train(c, o, "--d-model", "0"), "positive integers"),
    ("train-heads-do-not-divide-width", lambda c, o: _train(c, o, "--heads", "5"), "not divisible"),
    ("train-kv-heads-do-not-divide-heads", lambda c, o: _train(c, o, "--kv-heads", "3", arch="llama"), "multiple of --kv-heads"),
    ("train-preset-unknown", lambda c, o: _train(c, o, "--preset", "nonsense"), "unknown preset"),
    ("demo-train-steps-0", lambda c, o: _demo(c, o, "--train-steps", "0"), AT_LEAST_1),
    ("demo-learn-steps-0", lambda c, o: _demo(c, o, "--learn-steps", "0"), AT_LEAST_1),
    ("demo-match-iters-0", lambda c, o: _demo(c, o, "--match-iters", "0"), AT_LEAST_1),
    ("demo-test-batches-0", lambda c, o: _demo(c, o, "--test-batches", "0"), AT_LEAST_1),
    ("demo-methods-unknown", lambda c, o: _demo(c, o, "--methods", "nonsense"), "unknown demo methods"),
    ("demo-seeds-equal", lambda c, o: _demo(c, o, "--seeds", "0,0"), "two different integers"),
    ("train-seed-negative", lambda c, o: _train(c, o, "--seed=-1"), "is not a seed"),
    ("transform-seed-huge", lambda c, o: ["transform", _p(c, "a"), "-o", o, "--seed", str(2**64)], "is not a seed"),
    ("align-seed-negative", lambda c, o: _learned(c, o, "--seed=-3"), "is not a seed"),
    ("merge-order-seed-negative", lambda c, o: _merge(c, o, "--order-seed=-1"), "is not a seed"),
    ("barrier3-seed-negative", lambda c, o: _barrier3(c, "--seed=-1"), "is not a seed"),
    ("demo-seeds-negative", lambda c, o: _demo(c, o, "--seeds=-1,0"), "is not a seed"),
    # merge and barrier of n models
    ("merge-one-model", lambda c, o: ["merge", _p(c, "a"), "-o", o], "at least two models"),
    ("merge-weights-count", lambda c, o: ["merge", *_a_b(c, _p(c, "c"), "-o", o, "--weights", "0.5,0.5")], "2 weights for 3 models"),
    ("merge-weights-negative", lambda c, o: _merge(c, o, "--weights=1.5,-0.5"), "non-negative"),
    ("merge-weights-sum", lambda c, o: _merge(c, o, "--weights", "0.5,0.4"), "not 1"),
    ("merge-weights-nan", lambda c, o: _merge(c, o, "--weights", "nan,0.5"), "finite"),
    ("merge-weights-inf", lambda c, o: _merge(c, o, "--weights", "inf,0"), "finite"),
    ("merge-weights-text", lambda c, o: _merge(c, o, "--weights", "half,half"), "comma-separated"),
    ("merge-weights-empty", lambda c, o: _merge(c, o, "--weights", ""), "comma-separated"),
    ("merge-weights-trailing-comma", lambda c, o: _merge(c, o, "--weights", "0.5,0.5,"), "comma-separated"),
    ("merge-max-rounds-0", lambda c, o: _merge(c, o, "--max-rounds", "0"), AT_LEAST_1),
    ("merge-max-iters-0", lambda c, o: _merge(c, o, "--max-iters", "0"), AT_LEAST_1),
    ("merge-precision-unknown", lambda c, o: _merge(c, o, "--precision", "float16"), "invalid choice"),
    ("merge-unknown-family", lambda c, o: _merge(c, o, "--groups", "nonsense"), "nonsense"),
    ("barrier-one-model", lambda c, o: ["barrier", _p(c, "a"), "--data", _p(c, "text")], "at least two models"),
    ("barrier3-weights-sum", lambda c, o: _barrier3(c, "--weights", "0.2,0.2,0.2"), "not 1"),
    ("barrier3-weights-count", lambda c, o: _barrier3(c, "--weights", "0.5,0.5"), "2 weights for 3 models"),
    ("barrier3-simplex-points-0", lambda c, o: _barrier3(c, "--simplex-points", "0"), AT_LEAST_1),
    ("barrier3-simplex-points-nan", lambda c, o: _barrier3(c, "--simplex-points", "nan"), "not a whole number"),
    ("barrier3-refine", lambda c, o: _barrier3(c, "--refine"), "for two models"),
    ("barrier4-plot", lambda c, o: ["barrier", *_a_b(c, _p(c, "c"), _p(c, "a"), "--data", _p(c, "text"), "--plot",
                                                     str(c["root"] / "p.png"))], "three models"),
    ("barrier2-simplex-option", lambda c, o: _barrier(c, "--weights", "0.5,0.5"), "three or more"),
    # --device and --dtype (symmerge.runtime.devices); this machine has no GPU, so every cuda is refused
    ("train-device-cuda", lambda c, o: _train(c, o, "--device", "cuda"), "no CUDA GPU is visible"),
    ("eval-device-cuda", lambda c, o: _eval(c, "--device", "cuda"), "no CUDA GPU"),
    ("eval-device-cuda-index", lambda c, o: _eval(c, "--device", "cuda:7"), "no CUDA GPU"),
    ("eval-device-unknown", lambda c, o: _eval(c, "--device", "gpu"), "not cpu, cuda or cuda:N"),
    ("eval-dtype-unknown", lambda c, o: _eval(c, "--dtype", "float8"), "invalid choice"),
    ("barrier-device-cuda", lambda c, o: _barrier(c, "--device", "cuda:0"), "no CUDA GPU"),
    ("barrier3-device-cuda", lambda c, o: _barrier3(c, "--device", "cuda"), "no CUDA GPU"),
    ("align-dual-device-cuda", lambda c, o: _align(c, o, "--method", "dual", "--data", _p(c, "text"), "--device", "cuda"),
     "no CUDA GPU"),
    ("align-weight-dtype", lambda c, o: _align(c, o, "--dtype", "bfloat16"), "is for --method activation or learned or dual"),
    ("align-weight-resume", lambda c, o: _align(c, o, "--resume"), "keeps no run to resume"),
    ("align-activation-resume", lambda c, o: _align(c, o, "--method", "activation", "--data", _p(c, "text"),
                                                    "--resume"), "keeps no run to resume"),
    ("align-weight-device-cuda", lambda c, o: _align(c, o, "--device", "cuda"), "no CUDA GPU"),
    ("align-weight-device-cuda-index", lambda c, o: _align(c, o, "--device", "cuda:1"), "no CUDA GPU"),
    ("align-activation-device-cuda", lambda c, o: _align(c, o, "--method", "activation", "--data", _p(c, "text"),
                                                         "--device", "cuda"), "no CUDA GPU"),
    ("merge-activation-device-cuda", lambda c, o: _merge(c, o, "--method", "activation", "--data", _p(c, "text"),
                                                         "--device", "cuda"), "no CUDA GPU"),
    ("demo-device-cuda", lambda c, o: _demo(c, o, "--device", "cuda"), "no CUDA GPU"),
    # merge by the data-driven methods; mixed widths in merge and the barrier of n models (issue 14, helper many)
    *[(f"merge-{m}-without-data", lambda c, o, m=m: _merge(c, o, "--method", m), "needs --data")
      for m in ("activation", "learned", "dual")],
    ("merge-learned-one-model", lambda c, o: ["merge", _p(c, "a"), "-o", o, "--method", "learned", "--data",
                                              _p(c, "text")], "at least two models"),
    ("merge-dual-weights-negative", lambda c, o: _merge(c, o, "--method", "dual", "--data", _p(c, "text"),
                                                        "--weights=1.2,-0.2"), "non-negative"),
    ("merge-val-simplex-points-0", lambda c, o: _merge(c, o, "--method", "learned", "--data", _p(c, "text"),
                                                       "--val-simplex-points", "0"), AT_LEAST_1),
    ("merge-mixed-widths-unexpandable", lambda c, o: ["merge", _p(c, "a"), _p(c, "wide"), _many_heads(c), "-o", o],
     "none takes all the others"),
    ("merge-mixed-widths-other-vocabulary", lambda c, o: ["merge", _p(c, "wide"), _p(c, "a"), _p(c, "small_vocab"),
                                                          "-o", o], "vocabularies"),
    ("merge-mixed-widths-other-layer-count", lambda c, o: ["merge", _p(c, "wide"), _p(c, "a"), _p(c, "deep"), "-o", o],
     "layer counts"),
    ("barrier3-mixed-widths-unexpandable", lambda c, o: ["barrier", _p(c, "a"), _p(c, "wide"), _many_heads(c), "--data",
                                                         _p(c, "text")], "none takes all the others"),
]


def _many_heads(c) -> str:
    """A's width with twice its heads (d_head halved): it does not expand into `wide` (more heads than it
    has), and `wide` does not expand into it (wider d_model), so no model of {a, wide, it} takes the others."""
    import torch
    import transformers as T

    from bad_inputs import TEXT
    from symmerge.data.tokenizers import char_tokenizer

    path = c["root"] / "many_heads"
    if not path.exists():
        tok = char_tokenizer(TEXT)
        torch.manual_seed(6)
        T.GPT2LMHeadModel(T.GPT2Config(n_embd=24, n_layer=2, n_head=6, n_positions=32, vocab_size=len(tok))
                          ).save_pretrained(path)
        tok.save_pretrained(path)
    return str(path)

#: faults of the machine: (id, argv builder, expected words, fault); the fault moves OUT (see `_out`)
FULL = "No space left on device"
FAULTS = [
    ("full-disk-transform", lambda c, o: ["transform", _p(c, "a"), "-o", o], FULL, "full"),
    ("full-disk-interpolate", lambda c, o: _interp(c, o), FULL, "full"),
    ("full-disk-align", lambda c, o: _align(c, o), FULL, "full"),
    ("full-disk-merge", lambda c, o: _merge(c, o, "--aligned", o + "-aligned"), FULL, "full"),
    ("full-disk-expand", lambda c, o: ["expand", _p(c, "a"), "--like", _p(c, "wide"), "-o", o], FULL, "full"),
    ("full-disk-train-first-save", lambda c, o: _train(c, o, "--preset", "tiny", "--steps", "2"), FULL, "full"),
    ("full-disk-barrier-json", lambda c, o: _barrier(c, "--points", "3", "--json", o), FULL, "full-write"),
    ("full-disk-eval-json", lambda c, o: ["eval", _p(c, "a"), "--data", _p(c, "text"), "--json", o], FULL, "full-write"),
    ("data-hf-unknown-offline", lambda c, o: ["eval", _p(c, "a"), "--data", "hf:nobody/no-such-dataset"],
     "not in the local cache and HF_HUB_OFFLINE is set", "offline"),
    ("data-hf-unknown-no-network", lambda c, o: ["eval", _p(c, "a"), "--data", "hf:nobody/no-such-dataset"],
     "cannot be reached", "no-network"),
    # checkpoints by Hub id, resolved offline from the cache `bad_inputs.hub_cache` lays out
    ("hub-unknown-id", lambda c, o: ["inspect", "org/nothing"], "is not cached", "hub"),
    ("hub-unknown-id-offline-said", lambda c, o: ["transform", "org/nothing", "-o", o], "HF_HUB_OFFLINE is set", "hub"),
    ("hub-merge-unknown-id", lambda c, o: ["merge", _p(c, "a"), "org/nothing@main", "-o", o], "is not cached", "hub"),
    ("hub-unknown-revision", lambda c, o: ["transform", "org/pair@v9", "-o", o], "revision v9 of org/pair", "hub"),
    ("hub-expand-like-unknown-revision", lambda c, o: ["expand", _p(c, "a"), "--like", "org/pair@" + "d" * 40, "-o", o],
     "is not cached (cached: main, v1)", "hub"),
    ("hub-pickles-only", lambda c, o: ["align", _p(c, "a"), "org/pickles", "-o", o], "safe_serialization=True", "hub"),
    ("hub-gated-without-token", lambda c, o: ["align", _p(c, "a"), "org/gated", "-o", o], "gated repository", "gated"),
    ("hub-unauthorized", lambda c, o: ["eval", "org/private", "--data", _p(c, "text")], "set HF_TOKEN", "401"),
    ("no-write-permission-transform", lambda c, o: ["transform", _p(c, "a"), "-o", o], "no write permission", "locked"),
    ("no-write-permission-merge", lambda c, o: _merge(c, o), "no write permission", "locked"),
]


def _out(ctx, fault, monkeypatch) -> Path:
    """OUT for a case: beside the inputs; on a full disk; or in a folder this user may not write."""
    if fault == "full":
        if not ctx["tmpfs"]:  # no tmpfs to fill: the writer fails as safetensors does on a full disk
            import symmerge.store.io as io
            import symmerge.training.trainer as train

            def full(*args, **kwargs):
                raise SafetensorError(f"Error while serializing: I/O error: {os.strerror(errno.ENOSPC)} (os error 28)")

            monkeypatch.setattr(io, "save_file", full)
            monkeypatch.setattr(train, "save_file", full)  # training's resumable state
        return ctx["full"] / "out"
    if fault == "full-write":  # a report cut short by a full disk: half of it written, then ENOSPC
        def cut(self, text, *args, **kwargs):
            with open(self, "w") as f:
                f.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

        monkeypatch.setattr(Path, "write_text", cut)
        return ctx["root"] / "out"
    if fault in ("offline", "no-network"):  # hf:NAME that no cache holds: refused at once, not after retries
        pytest.importorskip("datasets", reason="hf:NAME needs the optional datasets package")
        import symmerge.store.hub as hub

        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            monkeypatch.delenv(var, raising=False)
        if fault == "offline":
            monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        else:  # this machine may have a network: the probe answers as it would without one
            monkeypatch.setattr(hub, "_reachable", lambda url, timeout: False)
        return ctx["root"] / "out"
    if fault in ("hub", "gated", "401"):
        _hub_fault(ctx, fault, monkeypatch)
        return ctx["root"] / "out"
    if fault == "locked":  # root may write anywhere: os.access answers as it would an ordinary user
        locked = ctx["root"] / "locked"
        locked.mkdir(exist_ok=True)
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
        return locked / "out"
    return ctx["root"] / "out"


def _hub_fault(ctx, fault, monkeypatch) -> None:
    """Ids resolve offline from the catalogue's hub cache; "gated" / "401": the Hub answers as it does for a
    gated repository, or a private one, asked without a token (huggingface_hub's errors, raised by its download)."""
    import httpx2
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(ctx["hub"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if fault == "hub":
        return
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("symmerge.store.hub._reachable", lambda url, timeout: True)
    response = httpx2.Response(401 if fault == "401" else 403, request=httpx2.Request("GET", "https://huggingface.co"))
    error = (GatedRepoError("Access to model org/gated is restricted", response=response) if fault == "gated" else
             HfHubHTTPError("401 Client Error: Unauthorized", response=response))

    def refuse(*args, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


ALL = [(*c, None) for c in CASES] + FAULTS


@pytest.mark.parametrize("case", ALL, ids=[c[0] for c in ALL])
def test_bad_input_is_refused_with_one_line(case, ctx, capsys, monkeypatch):
    _, argv_of, words, fault = case
    out = _out(ctx, fault, monkeypatch)
    inputs = {k: digest(ctx[k]) for k in (*folders(ctx), "text", "unseen", "empty", "binary", "latin1", "short", "file")}
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
    for o in (out, out.with_name(out.name + "-aligned")):
        assert not o.exists() and not leftovers(o), f"output or temporary folder left behind: {o}"
    assert {k: digest(ctx[k]) for k in inputs} == inputs, "an input was modified"


#: a narrower first input (A narrower than B) for every command that takes two widths: handled, not refused.
#: The narrower is expanded into the wider one's config; every output is a checkpoint of that config.
NARROW_FIRST = [
    ("align-narrow-first", lambda c, o: ["align", _p(c, "a"), _p(c, "wide"), "-o", o]),
    ("align-activation-narrow-first", lambda c, o: ["align", _p(c, "a"), _p(c, "wide"), "-o", o, "--method",
                                                    "activation", "--data", _p(c, "text"), "--max-batches", "1"]),
    *[(f"align-{m}-narrow-first", lambda c, o, m=m: ["align", _p(c, "a"), _p(c, "wide"), "-o", o, "--method", m,
                                                     "--data", _p(c, "text"), "--recipe", "quick", "--steps", "2"])
      for m in ("learned", "dual")],
    ("interpolate-narrow-first", lambda c, o: ["interpolate", _p(c, "a"), _p(c, "wide"), "--lam", "0.5", "-o", o]),
    ("barrier-narrow-first", lambda c, o: ["barrier", _p(c, "a"), _p(c, "wide"), "--data", _p(c, "text"), "--points",
                                           "3", "--max-batches", "1"]),
    ("merge-narrow-first", lambda c, o: ["merge", _p(c, "a"), _p(c, "wide"), "-o", o, "--aligned", o + "-aligned"]),
    ("barrier3-narrow-first", lambda c, o: ["barrier", _p(c, "a"), _p(c, "wide"), _p(c, "b"), "--data", _p(c, "text"),
                                            "--max-batches", "1", "--simplex-points", "2"]),
]


@pytest.mark.parametrize("case", NARROW_FIRST, ids=[c[0] for c in NARROW_FIRST])
def test_a_narrower_first_input_is_expanded(case, ctx, capsys):
    name, argv_of = case
    out = ctx["root"] / name
    inputs = {k: digest(ctx[k]) for k in folders(ctx)}
    capsys.readouterr()
    code = main(argv_of(ctx, str(out)))
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err[-2000:]
    written = [p.parent for p in [out, out.with_name(out.name + "-aligned")] if p.exists()
               for p in p.rglob("config.json")]
    assert bool(written) == (not name.startswith("barrier")), written
    wide = json.loads((ctx["wide"] / "config.json").read_text())["n_embd"]
    for folder in written:
        assert json.loads((folder / "config.json").read_text())["n_embd"] == wide, folder
    assert {k: digest(ctx[k]) for k in inputs} == inputs, "an input was modified"


def test_the_catalogue_covers_the_issue(ctx):
    """Issue 16 asked for at least its 21 reported cases plus the 78 that already passed: 99."""
    assert len(ALL) >= 99 and len({c[0] for c in ALL}) == len(ALL)

