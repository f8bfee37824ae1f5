"""The README's quickstart runs on a pair laid out as the demo leaves it, and its table of supported classes
lists exactly the families each class's symmetry spec has.

The quickstart's pair is the demo's (`symmerge-demo/seed0`, `seed1`); here two tiny ViTs trained on the same
data stand in for it (the commands do not depend on the preset), so the test takes seconds."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from factories import ARCHS, make_config
from symmerge.adapters import adapter_for
from symmerge.algebra.spec import build_spec
from symmerge.cli import main

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start: end if end > 0 else len(README)]


def test_the_quickstart_runs_on_the_demo_pair(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for seed in (0, 1):
        assert main(["train", "--arch", "vit", "--preset", "tiny", "--data", "digits", "--seed", str(seed),
                     "--steps", "20", "-o", f"symmerge-demo/seed{seed}"]) == 0
    shell = re.search(r"```bash\n(.*?)```", section("Quickstart"), re.S).group(1)
    lines = [argv for argv in (shlex.split(line, comments=True) for line in shell.splitlines()) if argv]
    assert [argv[0] for argv in lines] == ["symmerge"] * 4 and [a[1] for a in lines] == ["align", "barrier", "merge", "eval"]
    for argv in lines:
        assert main(argv[1:]) == 0, argv
    assert (tmp_path / "runs/merged/model.safetensors").is_file() and (tmp_path / "runs/barrier.png").is_file()


def families_table() -> dict[str, set[str]]:
    """class -> the families the README's table marks ✓."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section("Supported models and their groups")
            .splitlines() if line.startswith("| `")]
    header = next(line for line in section("Supported models and their groups").splitlines() if line.startswith("| class"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    return {re.match(r"`(\w+)`", r[0]).group(1): {columns[i] for i, c in enumerate(r) if c == "✓"} for r in rows}


def spec_families() -> dict[str, set[str]]:
    """class -> the union of the families of every test configuration of that class."""
    out: dict[str, set[str]] = {}
    for arch in ARCHS:
        config = make_config(arch)
        out.setdefault(config.architectures[0], set()).update(build_spec(adapter_for(config).shape(config)).families())
    return out


def test_the_families_table_is_what_each_class_spec_has():
    table = families_table()
    assert table == spec_families()
    # negative control: a class that gained a family, or lost one, no longer matches
    changed = dict(table, LlamaForCausalLM=table["LlamaForCausalLM"] - {"glu_scale"})
    assert changed != spec_families()
