"""`--device cpu --dtype bfloat16` for every method that computes in a working dtype: `merge` by activation,
learned and dual matching, and `align --method activation`.

Planted models (A, g1·A, g2·A: tiny GPT-2s with a character tokenizer, stored in float32) are merged
(aligned) once in the default precision (activation: float64 forwards; learned/dual: the checkpoint's
float32) and once with bfloat16 forwards. What a method computes in the working dtype, the losses in its
report (activation: the weighted average's loss per round; learned/dual: the endpoints' validation
losses), differs from the default run by bf16 rounding: more than float32's eps could explain (negative
control: the flag took effect), less than `LOSS_ULPS` bf16 eps relative. The outputs compute the same
function: their losses (float64 forward) agree to `LOSS_ULPS` bf16 eps. Activation matching finds the
planted elements from bf16 activations summed in float64: its outputs' weights agree to `WEIGHT_ULPS`
bf16 eps. (Learned and dual weights are not compared: their steps follow bf16 gradients and their best
state is chosen on bf16 losses, so the path taken differs while its function does not.)
"""

from __future__ import annotations

import json

import pytest
import torch

from dist_common import CHARS
from factories import make_model, save_model

BF16, F32 = torch.finfo(torch.bfloat16).eps, torch.finfo(torch.float32).eps
#: the measured relative loss differences (bf16 vs default forwards, reports and outputs) are at most 0.2 bf16
#: eps: 1 eps leaves room for another machine's rounding, while a wrong element costs far more (A and g1·A
#: averaged unaligned: 6.7 eps)
LOSS_ULPS = 1
#: activation matching's output weights: measured 0.33 bf16 eps relative (merge) and 4.1 (align: B's rotation
#: estimated from bf16 activations); a wrong permutation moves them by about sqrt(2), 180 eps
WEIGHT_ULPS = 16


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    from symmerge.algebra.apply import apply
    from symmerge.algebra.elements import random_element
    from symmerge.data.tokenizers import char_tokenizer
    from symmerge.store.model import load_model
    from symmerge.store.model import save_model as save_canonical

    d = tmp_path_factory.mktemp("trio")
    tok = char_tokenizer(CHARS)
    a = save_model(make_model("gpt2", 0), d / "a")
    model = load_model(a)
    paths = [a]
    for s in (1, 2):
        g = random_element(model.spec, torch.Generator().manual_seed(s), model.spec.default_families())
        paths.append(save_canonical(model, apply(model.spec, g, model.params), d / f"g{s}a"))
    for p in paths:
        tok.save_pretrained(p)
    ids = torch.randint(0, len(CHARS), (4000,), generator=torch.Generator().manual_seed(0))
    (d / "text.txt").write_text("".join(CHARS[i] for i in ids))
    return paths, d / "text.txt"


@pytest.fixture(scope="module")
def plain_loss(trio, tmp_path_factory) -> float:
    """The loss of A and g1·A averaged without alignment (another function than A's)."""
    from symmerge.cli import main

    plain = tmp_path_factory.mktemp("plain") / "out"
    assert main(["interpolate", str(trio[0][0]), str(trio[0][1]), "-o", str(plain), "--lam", "0.5"]) == 0
    return _output_loss(plain, trio[1])


def _merge(trio, out, method: str, *extra) -> dict:
    from symmerge.cli import main

    paths, text = trio
    argv = ["merge", *map(str, paths), "-o", str(out), "--method", method, "--data", str(text), "--batch-size", "4",
            "--max-batches", "2", "--max-rounds", "2", "--json", f"{out}.json", *extra]
    if method != "activation":
        argv += ["--steps", "2", "--val-batches", "1", "--eval-every", "1"]
    assert main(argv) == 0
    return json.loads(open(f"{out}.json").read())


def _losses(method: str, rep: dict) -> torch.Tensor:
    key = "average_loss" if method == "activation" else "validation_endpoint_losses"
    return torch.tensor(rep[key], dtype=torch.float64)


def _weights(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _rel_weights(x, y) -> float:
    a, b = _weights(x), _weights(y)
    return max(float((a[k].double() - b[k].double()).norm() / b[k].double().norm().clamp_min(1e-30)) for k in b)


def _output_loss(folder, text) -> float:
    from symmerge.data.batches import load_batches
    from symmerge.evaluation.forward import StockForward
    from symmerge.store.model import load_model

    m = load_model(folder)
    return StockForward(m, torch.float64).mean_loss(m.params, load_batches(folder, str(text), "validation", 4, None, 1))


@pytest.mark.parametrize("method", ["activation", "learned", "dual"])
def test_merge_in_bfloat16(trio, plain_loss, tmp_path, method):
    ref = _merge(trio, tmp_path / "ref", method)
    bf = _merge(trio, tmp_path / "bf", method, "--device", "cpu", "--dtype", "bfloat16")
    assert (bf["dtype"] if method == "activation" else bf["settings"]["dtype"]) == "bfloat16"
    x, y = _losses(method, bf), _losses(method, ref)
    rel = float(((x - y).abs() / y.abs()).max())
    assert 4 * F32 < rel < LOSS_ULPS * BF16, (method, rel / BF16)
    ref_loss = _output_loss(tmp_path / "ref", trio[1])
    assert abs(_output_loss(tmp_path / "bf", trio[1]) - ref_loss) < LOSS_ULPS * BF16 * ref_loss
    if method == "activation":
        assert _rel_weights(tmp_path / "bf", tmp_path / "ref") < WEIGHT_ULPS * BF16
    assert abs(plain_loss - ref_loss) > 4 * LOSS_ULPS * BF16 * ref_loss  # negative control: an unaligned average


def test_align_activation_in_bfloat16(trio, tmp_path):
    from symmerge.cli import main

    paths, text = trio
    base = ["align", str(paths[0]), str(paths[1]), "--method", "activation", "--data", str(text), "--batch-size", "4",
            "--max-batches", "2"]
    assert main([*base, "-o", str(tmp_path / "ref"), "--json", str(tmp_path / "ref.json")]) == 0
    assert main([*base, "-o", str(tmp_path / "bf"), "--json", str(tmp_path / "bf.json"), "--device", "cpu",
                 "--dtype", "bfloat16"]) == 0
    rep = json.loads((tmp_path / "bf.json").read_text())
    assert (rep["device"], rep["dtype"]) == ("cpu", "bfloat16")
    assert 4 * F32 < _rel_weights(tmp_path / "bf", tmp_path / "ref") < WEIGHT_ULPS * BF16
