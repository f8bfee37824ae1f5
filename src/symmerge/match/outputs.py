"""Write the outputs of learned / dual matching and measure that each computes its input's function."""

from __future__ import annotations

from pathlib import Path

import torch

from ..apply import apply
from ..io import AtomicFolder, prepare_output
from ..model import Model, hf_class, save_model
from .learned import Result


def save_outputs(result: Result, a: Model, b: Model, out, force: bool = False) -> list[tuple[Path, Path]]:
    """learned: OUT = g·B. dual: OUT/A = gA·A and OUT/B = gB·B. Returns (input, output) folder pairs."""
    meta = {"align": {k: v for k, v in result.report.items() if k != "history"}}
    out = prepare_output(out, force)
    if result.report["method"] == "learned":
        save_model(b, apply(b.spec, result.elements["B"], b.params), out, force=force, extra=meta)
        return [(b.path, out)]
    with AtomicFolder(out) as tmp:
        save_model(a, apply(a.spec, result.elements["A"], a.params), tmp / "A", extra=meta)
        save_model(b, apply(b.spec, result.elements["B"], b.params), tmp / "B", extra=meta)
    return [(a.path, out / "A"), (b.path, out / "B")]


def _stock(folder, class_name: str):
    return hf_class(class_name).from_pretrained(folder, dtype=torch.float64).eval()


@torch.no_grad()
def logit_gap(source, output, class_name: str, batch: dict) -> float:
    """Largest |logit difference| between two checkpoints loaded by stock transformers (in float64,
    so that it measures the stored weights, not the arithmetic)."""
    inputs = {k: (v.to(torch.float64) if v.is_floating_point() else v) for k, v in batch.items() if k != "labels"}
    x = _stock(source, class_name)(**inputs).logits
    y = _stock(output, class_name)(**inputs).logits
    return float((x - y).abs().max())


def output_report(pairs: list[tuple[Path, Path]], class_name: str, batch: dict) -> list[dict]:
    """For every output, its input and the largest logit difference from it."""
    return [{"input": str(i), "output": str(o), "max_logit_diff": logit_gap(i, o, class_name, batch)} for i, o in pairs]
