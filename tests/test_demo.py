"""`symmerge demo` end to end on a short schedule: every method reported, endpoints keep their functions."""

from __future__ import annotations

import json

import torch

from checks import stock, tolerance
from factories import logits
from symmerge.cli import main
from symmerge.data.batches import load_batches


def test_demo_runs_every_method_and_reuses_the_pair(tmp_path, capsys):
    out = tmp_path / "demo"
    args = ["demo", "-o", str(out), "--train-steps", "20", "--match-iters", "2", "--test-batches", "1", "--learn-steps", "3"]
    assert main(args) == 0
    table = capsys.readouterr().out
    report = json.loads((out / "demo-report.json").read_text())
    # the endpoints' changes are measured in float64 on canonical parameters: float64's tolerance at the
    # largest logit either trained ViT gives on the test images
    test = {k: v for k, v in load_batches(out / "seed0", "digits", "test", batch_size=180)[0].items() if k != "labels"}
    tol = max(tolerance(torch.float64, logits(stock(out / f"seed{s}"), test)) for s in (0, 1))
    methods = [r["method"] for r in report["results"]]
    assert methods == ["plain", "weight", "activation", "learned", "dual"]
    for r in report["results"]:
        assert r["label"] in table
        assert r["max_endpoint_logit_change"] <= tol, (tol, r)  # aligned endpoints compute their inputs' functions
        assert len(r["lambdas"]) == 11 and r["lambdas"][0] == 0.0 and r["lambdas"][-1] == 1.0
    plain, weight = report["results"][0], report["results"][1]
    assert abs(plain["loss"][0] - weight["loss"][0]) < 1e-6 and abs(plain["loss"][-1] - weight["loss"][-1]) < 1e-4
    assert abs(plain["loss"][5] - weight["loss"][5]) > 1e-3  # negative control: the midpoints, other models
    assert (out / "demo-barriers.png").read_bytes()[:4] == b"\x89PNG"

    # a second run with the same settings reuses the trained pair; other settings need --force
    stamp = (out / "seed0" / "model.safetensors").stat().st_mtime_ns
    assert main(args[:-2] + ["--learn-steps", "2", "--methods", "plain"]) == 0
    assert (out / "seed0" / "model.safetensors").stat().st_mtime_ns == stamp
    capsys.readouterr()
    assert main(["demo", "-o", str(out), "--train-steps", "21", "--methods", "plain"]) == 2
    assert "--force" in capsys.readouterr().err
