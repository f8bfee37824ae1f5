"""docs/extending/ done once, as printed: the matcher page's FFN matching and the architecture page's Arcee
adapter are run from the pages' code blocks (the `symmerge` lines through `cli.main`, in an empty folder), and
what the pages say they do is checked, each with a negative control:

- the matcher is reachable as `symmerge align --method ffn` and `symmerge.api.align(method="ffn")`, its option
  is a flag in a section of its own with its default, and it undoes a planted FFN permutation (not a planted
  residual rotation, which it does not match); before the page runs, `--method ffn` is refused;
- the adapter's transforms keep the stock forward, family by family, and weight matching finds a planted
  element again; an adapter that forgets to fold a norm changes the logits; unregistered, the class is refused.

Registrations are undone after each test (the registries are replaced by copies).
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path

import pytest
import torch

from checks import assert_different_function, assert_same_function, stock
from doc_blocks import code_blocks
from factories import make_model, rel_distance, save_model, stock_logits
from symmerge import adapters
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.cli import main
from symmerge.errors import SymmergeError
from symmerge.match import registry
from symmerge.store.model import load_model

DOCS = Path(__file__).resolve().parents[1] / "docs" / "extending"
MATCHER = (DOCS / "matcher.md").read_text()
ARCHITECTURE = (DOCS / "architecture.md").read_text()


def _cli(*argv) -> int:
    """The CLI's exit status (argparse refuses unknown choices itself, exiting with 2)."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def _run(text: str, section: str, ns: dict) -> str:
    """Every Python block of the page's `section`, executed as printed into `ns`; what they printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for code in code_blocks(text, section, "python"):
            exec(compile(code, f"docs/extending ({section})", "exec", dont_inherit=True), ns)  # as a reader runs it
    return out.getvalue()


def _shell(text: str, section: str) -> None:
    """Every `symmerge` line of the section's shell blocks, through `cli.main`."""
    (shell,) = code_blocks(text, section, "bash")
    lines = [shlex.split(line, comments=True) for line in shell.splitlines()]
    assert lines and all(argv[0] == "symmerge" for argv in lines if argv)
    for argv in filter(None, lines):
        assert _cli(*argv[1:]) == 0, argv


def _help(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"])
    return out.getvalue()


@pytest.fixture
def walk(tmp_path, monkeypatch):
    """An empty working folder, and registries that forget what the pages add."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "MATCHERS", dict(registry.MATCHERS))
    monkeypatch.setattr(adapters, "ADAPTERS", dict(adapters.ADAPTERS))
    return tmp_path


def test_the_matcher_page_adds_a_matcher_that_align_and_the_api_reach(walk):
    save_model(make_model("llama", 0), walk / "runs/a")
    assert _cli("align", "runs/a", "runs/a", "-o", "runs/x", "--method", "ffn") == 2  # not yet a method
    ns = {"__name__": "matcher_page"}
    _run(MATCHER, "## Walk-through: FFN matching", ns)
    assert registry.get("ffn").options is ns["FfnOptions"]

    text = _help("align")
    section = text[text.index("\nffn matching:"):]
    assert "--unit-score {inner,cosine}" in section and "(default: inner)" in section
    assert "ffn: FFN units by one assignment per layer" in " ".join(text.split())
    with pytest.raises(SymmergeError, match="unit_score"):
        ns["FfnOptions"](unit_score="l2")

    _shell(MATCHER, "## Use it")
    a, moved, back = (load_model(walk / "runs" / n) for n in ("a", "a-moved", "a-back"))
    assert rel_distance(moved.params, a.params) > 0.1, "the planted permutation must move the weights"
    assert rel_distance(back.params, a.params) <= 1e-12
    report = json.loads((walk / "runs/ffn.json").read_text())
    assert report["method"] == "ffn" and report["objective"][0] < 0.9
    assert report["objective"][-1] == pytest.approx(1.0, abs=1e-12)

    printed = _run(MATCHER, "## Use it", ns).splitlines()
    before, after = json.loads(printed[0])
    assert before < 0.9 and after == pytest.approx(1.0, abs=1e-12)
    assert json.loads(printed[1].replace("'", '"'))["units_moved"] == report["families"]["ffn_perm"]["units_moved"] > 0

    # negative control: a residual rotation planted beside the permutation is not undone (FFN matching
    # leaves every other group at the identity)
    assert _cli("transform", "runs/a", "-o", "runs/a-turned", "--groups", "ffn_perm,residual_rotation", "--seed", 3) == 0
    assert _cli("align", "runs/a", "runs/a-turned", "-o", "runs/a-still", "--method", "ffn") == 0
    assert rel_distance(load_model(walk / "runs/a-still").params, a.params) > 0.1


def _arcee(walk: Path) -> dict:
    ns = {"__name__": "architecture_page"}
    for section in ("## 1. The adapter", "## 2. The factory", "## 3. Check it"):
        _run(ARCHITECTURE, section, ns)
    assert (walk / "runs/arcee-a/config.json").is_file()
    return ns


def test_the_architecture_page_adds_an_adapter_whose_transforms_keep_the_stock_forward(walk):
    ns = _arcee(walk)
    _shell(ARCHITECTURE, "## 3. Check it")
    a, moved, back = (walk / "runs" / n for n in ("arcee-a", "arcee-moved", "arcee-back"))
    x = {"input_ids": torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))}
    ref = stock(a)
    assert type(ref).__name__ == "ArceeForCausalLM"
    assert_same_function(stock(moved), ref, x, dtype=torch.float32, what="Arcee transformed")  # RMSNorm in float32
    A = load_model(a)
    assert rel_distance(load_model(moved).params, A.params) > 0.1
    assert rel_distance(load_model(back).params, A.params) <= 1e-5
    assert A.spec.families() == ["residual_rotation", "residual_scale", "head_perm", "qk_map", "ov_map", "ffn_perm"]

    # family by family, as tests/test_symmetry.py does for the factories' architectures
    logits = stock_logits(A, A.params, x)
    for i, family in enumerate(A.spec.families()):
        g = random_element(A.spec, torch.Generator().manual_seed(i), [family])
        assert_same_function(stock_logits(A, apply(A.spec, g, A.params), x), logits, dtype=torch.float32, what=family)

    # negative control: an adapter that reads the MLP's norm as unit weights computes another function
    class Unfolded(ns["ArceeAdapter"]):
        def block_to_canonical(self, get, s, i):
            ones = lambda name, *default: (torch.ones(s.d_model, dtype=torch.float64)  # noqa: E731
                                           if name.endswith("post_attention_layernorm.weight") else get(name, *default))
            return super().block_to_canonical(ones, s, i)

    adapters.ADAPTERS["ArceeForCausalLM"] = Unfolded()
    assert _cli("transform", a, "-o", walk / "runs/arcee-wrong", "--seed", 4) == 0
    assert_different_function(stock(walk / "runs/arcee-wrong"), ref, x, dtype=torch.float32, what="norm not folded")

    # ... and without the registration the class is refused
    del adapters.ADAPTERS["ArceeForCausalLM"]
    assert _cli("inspect", a) == 2


SRC = Path(__file__).resolve().parents[1] / "src" / "symmerge"


def source_map(text: str) -> list[str]:
    """The paths the architecture page's source map names: the leading `*.py` words of its entry lines (at most
    two spaces in; deeper lines continue a description)."""
    (block,) = code_blocks(text, "## The source, layer by layer", "")
    names = []
    for line in block.splitlines():
        if not line.startswith("   "):
            for word in line.split():
                if not word.endswith(".py"):
                    break
                names.append(word)
    return names


def map_problems(text: str) -> list[str]:
    """Entries of the source map that match no module, and modules under src/symmerge that no entry covers
    (`adapters/*.py` covers a package's modules)."""
    named = source_map(text)
    problems = [f"{n}: no such module" for n in named if not list(SRC.glob(n))]
    covered = {p for n in named for p in SRC.glob(n)}
    problems += [f"{p.relative_to(SRC)}: not in the source map" for p in sorted(SRC.rglob("*.py"))
                 if p not in covered and p.name != "__init__.py"]
    return problems


def test_the_source_map_names_every_module_and_only_modules():
    assert len(source_map(ARCHITECTURE)) > 60
    assert map_problems(ARCHITECTURE) == []
    # negative controls: a module left out, and a module that does not exist
    assert map_problems(ARCHITECTURE.replace("  store/parts.py ", "  ")) == ["store/parts.py: not in the source map"]
    assert map_problems(ARCHITECTURE.replace("  store/parts.py ", "  store/part.py ")) == [
        "store/part.py: no such module", "store/parts.py: not in the source map"]
