"""--device and --dtype (`symmerge.runtime.devices`): the checks, and what bfloat16/float16 change and do not.

Tolerance of a bfloat16 forward against float32: bfloat16 keeps 8 significant bits, so every weight and
activation is rounded by at most eps/2 relative (eps = finfo(bfloat16).eps = 2^-7). A token's loss then
moves by about eps·max(1, |L|); those errors have no common sign, so a mean over the N >= 256 tokens of
these tests moves by about eps·max(1, |L|)/sqrt(N) <= eps·max(1, |L|)/16 (measured here: at most 0.017 of
eps·max(1, |L|), a quarter of the tolerance), and a barrier, a difference of losses, by at most twice
that. Each comparison has a negative control a real bug would trip (the same checkpoint read with its
LayerNorm eps at 1e-3 instead of 1e-5 lies 11-13 tolerances away, where it lay within the former
eps·max(1, |L|)) and a check that bfloat16 really ran (the figures are not bit-equal).

No GPU here: the CUDA paths are tested by their refusals (and by the index check with a GPU count
pretended), nothing is skipped.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from factories import nudged_copy
from symmerge import SymmergeError
from symmerge.cli import main
from symmerge.match.learn_config import LearnConfig
from symmerge.runtime import devices
from symmerge.training.trainer import TrainArgs, train

EPS = torch.finfo(torch.bfloat16).eps
WRONG_EPS = 1e-3  # the negative controls' LayerNorm eps (the checkpoints': 1e-5)
SRC = Path(__file__).resolve().parents[1] / "src" / "symmerge"


def _text(seed: int = 0, words: int = 4000) -> str:
    gen = torch.Generator().manual_seed(seed)
    vocab = "the cat sat on a mat and then it ran to see what the dog did with its red ball in the sun".split()
    return " ".join(vocab[int(i)] for i in torch.randint(0, len(vocab), (words,), generator=gen)) + "\n"


def _train(out: Path, data: Path, seed: int, **kw) -> Path:
    return train(TrainArgs(arch="gpt2", preset="tiny", data=str(data), seed=seed, out=str(out), steps=kw.pop("steps", 30),
                           progress=False, **kw))


def _wrong_eps(src: Path, out: Path) -> Path:
    """`src` with its LayerNorms' eps at WRONG_EPS instead of 1e-5: the kind of bug a dtype path could have."""
    shutil.copytree(src, out, ignore=shutil.ignore_patterns(".train_state"))
    config = json.loads((out / "config.json").read_text())
    config["layer_norm_epsilon"] = WRONG_EPS
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("devices")
    (root / "text.txt").write_text(_text())
    c = {"root": root, "text": root / "text.txt", "a": _train(root / "a", root / "text.txt", 0),
         "b": _train(root / "b", root / "text.txt", 1)}
    c["a_eps"] = _wrong_eps(c["a"], root / "a_eps")
    c["b_eps"] = _wrong_eps(c["b"], root / "b_eps")
    return c


def _json(argv: list[str], path: Path) -> dict:
    assert main([*argv, "--json", str(path)]) == 0
    return json.loads(path.read_text())


def _loss_tol(loss: float) -> float:
    return EPS * max(1.0, abs(loss)) / 16


def test_eval_in_bfloat16_agrees_with_float32_and_a_wrong_eps_does_not(lab, tmp_path):
    run = ["eval", str(lab["a"]), "--data", str(lab["text"]), "--device", "cpu"]
    f32 = _json([*run, "--dtype", "float32"], tmp_path / "f32.json")
    b16 = _json([*run, "--dtype", "bfloat16"], tmp_path / "b16.json")
    default = _json(run, tmp_path / "default.json")  # the checkpoint's own dtype: float32
    far = _json(["eval", str(lab["a_eps"]), "--data", str(lab["text"]), "--dtype", "bfloat16"], tmp_path / "far.json")
    assert (b16["dtype"], f32["dtype"], default["dtype"], b16["device"]) == ("bfloat16", "float32", "float32", "cpu")
    assert default["loss"] == f32["loss"]
    tol = _loss_tol(f32["loss"])
    assert abs(b16["loss"] - f32["loss"]) <= tol, (b16["loss"], f32["loss"], tol)
    assert b16["loss"] != f32["loss"], "bfloat16 did not run: the figures are float32's to the bit"
    assert abs(far["loss"] - f32["loss"]) > 3 * tol, "negative control: a wrong eps within the tolerance"


def test_barrier_in_bfloat16_agrees_with_float32_and_a_wrong_eps_does_not(lab, tmp_path):
    def curve(b: Path, dtype: str, name: str) -> dict:
        return _json(["barrier", str(lab["a"]), str(b), "--data", str(lab["text"]), "--points", "5", "--dtype", dtype,
                      "--max-batches", "2"], tmp_path / name)

    f32, b16 = curve(lab["b"], "float32", "f32.json"), curve(lab["b"], "bfloat16", "b16.json")
    far = curve(lab["b_eps"], "bfloat16", "far.json")
    assert b16["dtype"] == "bfloat16" and f32["lambdas"] == b16["lambdas"]
    gaps = [abs(x - y) / _loss_tol(y) for x, y in zip(b16["loss"], f32["loss"])]
    assert max(gaps) <= 1, gaps
    assert abs(b16["barrier"] - f32["barrier"]) <= 2 * _loss_tol(max(f32["loss"]))
    assert b16["loss"] != f32["loss"], "bfloat16 did not run"
    far_gaps = [abs(x - y) / _loss_tol(y) for x, y in zip(far["loss"][1:], f32["loss"][1:])]
    assert max(far_gaps) > 3, f"negative control: a wrong eps within the tolerance {far_gaps}"


def test_barrier_of_three_models_in_bfloat16_agrees_with_float32(lab, tmp_path):
    def many(dtype: str, third: Path, name: str) -> dict:
        return _json(["barrier", str(lab["a"]), str(lab["b"]), str(third), "--data", str(lab["text"]), "--points", "3",
                      "--simplex-points", "2", "--max-batches", "1", "--dtype", dtype], tmp_path / name)

    f32, b16 = many("float32", lab["a_eps"], "f32.json"), many("bfloat16", lab["a_eps"], "b16.json")
    far = many("bfloat16", lab["a"], "far.json")  # A for its wrong-eps copy: another third vertex
    assert b16["dtype"] == "bfloat16"
    def gaps(r: dict) -> list[float]:
        ref = f32["endpoint_losses"] + [f32["average_loss"]]
        return [abs(x - y) / _loss_tol(y) for x, y in zip(r["endpoint_losses"] + [r["average_loss"]], ref)]

    assert max(gaps(b16)) <= 1, gaps(b16)
    assert b16["average_loss"] != f32["average_loss"], "bfloat16 did not run"
    assert max(gaps(far)) > 3, f"negative control: another third model within the tolerance {gaps(far)}"


def test_train_in_bfloat16_is_deterministic_keeps_float32_weights_and_differs_from_float32(lab, tmp_path):
    out = tmp_path / "cli"
    argv = ["train", "--arch", "gpt2", "--data", str(lab["text"]), "--seed", "0", "--steps", "30", "--dtype", "bfloat16",
            "--device", "cpu", "-o", str(out)]
    assert main(argv) == 0
    again = _train(tmp_path / "again", lab["text"], 0, dtype="bfloat16", steps=30)
    w, w2, w32 = (load_file(str(p / "model.safetensors")) for p in (out, again, lab["a"]))
    assert all(torch.equal(w[k], w2[k]) for k in w), "the same seed gave other weights"
    assert {v.dtype for v in w.values()} == {torch.float32}, "the master weights are written, in float32"
    assert any(not torch.equal(w[k], w32[k]) for k in w), "bfloat16 autocast did not run: float32's weights to the bit"
    rec = json.loads((out / "symmerge.json").read_text())["train"]
    first32 = json.loads((lab["a"] / "symmerge.json").read_text())
    losses32 = json.loads((lab["a"] / ".train_state" / "state.json").read_text())["losses"]
    losses16 = json.loads((out / ".train_state" / "state.json").read_text())["losses"]
    assert rec["dtype"] == "bfloat16" and first32["train"]["dtype"] == "float32"
    assert abs(losses16[0] - losses32[0]) <= _loss_tol(losses32[0]) and losses16[0] != losses32[0]  # same weights


def test_train_in_float16_scales_the_loss_and_resumes_bit_exactly(lab, tmp_path):
    kw = dict(steps=12, save_every=4)
    whole = _train(tmp_path / "whole", lab["text"], 0, dtype="float16", **kw)
    _train(tmp_path / "cut", lab["text"], 0, dtype="float16", stop_after=6, **kw)
    state = json.loads((tmp_path / "cut" / ".train_state" / "state.json").read_text())
    assert state["scaler"]["scale"] > 0 and state["run"]["dtype"] == "float16"
    with pytest.raises(SymmergeError, match="different settings"):  # another dtype is another run
        _train(tmp_path / "cut", lab["text"], 0, resume=True, **kw)
    nudged = nudged_copy(tmp_path / "cut", tmp_path / "nudged")
    cut = _train(tmp_path / "cut", lab["text"], 0, dtype="float16", resume=True, **kw)
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(cut / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # negative control: the saved state moved, the resumed run ends elsewhere (it continues from its state)
    moved = load_file(str(_train(nudged, lab["text"], 0, dtype="float16", resume=True, **kw) / "model.safetensors"))
    assert any(not torch.equal(a[k], moved[k]) for k in a)


def test_align_learned_in_bfloat16_runs_there_and_writes_the_inputs_dtype(lab, tmp_path):
    out = tmp_path / "out"
    rep = _json(["align", str(lab["a"]), str(lab["b"]), "-o", str(out), "--method", "learned", "--data", str(lab["text"]),
                 "--steps", "2", "--eval-every", "1", "--max-batches", "1", "--val-batches", "1", "--val-points", "3",
                 "--dtype", "bfloat16", "--device", "cpu"], tmp_path / "align.json")
    assert rep["settings"]["dtype"] == "bfloat16"
    assert {v.dtype for v in load_file(str(out / "model.safetensors")).values()} == {torch.float32}


# --- the checks ---------------------------------------------------------------------------------------

def test_device_syntax_and_the_gpu_checks(monkeypatch):
    assert devices.resolve_device("cpu") == torch.device("cpu")
    # the default: the CPU where no GPU is visible, else the current GPU
    assert devices.resolve_device(None) == (torch.device("cuda", torch.cuda.current_device())
                                            if torch.cuda.is_available() else torch.device("cpu"))
    for bad in ("gpu", "cuda:", "cuda:-1", "cpu:0", "mps"):
        with pytest.raises(Exception, match="not cpu, cuda or cuda:N"):
            devices.device_name(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no GPU visible (also on a machine with one)
    with pytest.raises(SymmergeError, match="no CUDA GPU is visible"):
        devices.resolve_device("cuda")
    assert devices.resolve_device(None) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # pretend one GPU: the index check
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert devices.resolve_device("cuda:0") == torch.device("cuda", 0)
    assert devices.resolve_device(None) == torch.device("cuda", 0)
    with pytest.raises(SymmergeError, match=r"only 1 GPU\(s\) visible \(cuda:0 to cuda:0\)"):
        devices.resolve_device("cuda:3")


def test_the_probe_refuses_a_dtype_the_device_cannot_run():
    for dtype in devices.DTYPES.values():
        devices.check_dtype(torch.device("cpu"), dtype)
    with pytest.raises(SymmergeError, match="float8_e4m3fn does not run on cpu"):  # CPU kernels lack float8
        devices.check_dtype(torch.device("cpu"), torch.float8_e4m3fn)


@pytest.mark.parametrize("command", ["train", "eval", "barrier", "align"])
def test_a_dtype_the_probe_refuses_stops_the_command_before_any_work(command, lab, tmp_path, monkeypatch, capsys):
    def cannot(device, dtype):
        if dtype == torch.bfloat16:
            raise RuntimeError('"addmm" not implemented for \'BFloat16\'')

    monkeypatch.setattr(devices, "probe", cannot)
    out, text = tmp_path / "out", str(lab["text"])
    argv = {"train": ["train", "--arch", "gpt2", "--data", text, "-o", str(out)],
            "eval": ["eval", str(lab["a"]), "--data", text, "--json", str(out)],
            "barrier": ["barrier", str(lab["a"]), str(lab["b"]), "--data", text, "--json", str(out)],
            "align": ["align", str(lab["a"]), str(lab["b"]), "-o", str(out), "--method", "dual", "--data", text]}[command]
    capsys.readouterr()
    assert main([*argv, "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    where = devices.device_name(devices.resolve_device(None))  # the default device: a GPU where one is visible
    assert err[-1] == (f"symmerge {command}: error: --dtype bfloat16 does not run on {where} (\"addmm\" not "
                       "implemented for 'BFloat16'); choose another --dtype or --device")
    assert not out.exists()


def test_learn_config_takes_the_working_dtypes_and_a_device():
    for dtype in ("float32", "float64", "bfloat16", "float16"):
        LearnConfig(dtype=dtype, device="cuda:1").validate()
    with pytest.raises(SymmergeError, match="dtype must be one of"):
        LearnConfig(dtype="float8").validate()
    with pytest.raises(SymmergeError, match="device must be cpu, cuda or cuda:N"):
        LearnConfig(device="gpu").validate()
    assert "device" not in LearnConfig(device="cuda").settings()  # a run may resume on another device


NUMPY = re.compile(r"\.numpy\(\)")
ON_HOST = re.compile(r"\.cpu\(\)[^\n]*\.numpy\(\)")


def numpy_on_device(text: str) -> list[str]:
    """Lines calling .numpy() on a tensor not brought to the host (.cpu()) first on that line."""
    return [line.strip() for line in text.splitlines() if NUMPY.search(line) and not ON_HOST.search(line)]


def test_no_numpy_call_can_meet_a_device_tensor():
    found = {p.name: numpy_on_device(p.read_text()) for p in SRC.rglob("*.py")}
    assert not {k: v for k, v in found.items() if v}
    assert numpy_on_device("x = t.detach().numpy()") == ["x = t.detach().numpy()"]  # negative control
    assert numpy_on_device("x = t.detach().cpu().numpy()") == []
