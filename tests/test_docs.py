"""The documentation site (mkdocs.yml, docs/) covers what the command line offers and nothing is left out of it.

`mkdocs build --strict` itself runs in CI (`.ci/run`, with the `docs` extra): it fails on a broken link, a
page missing from disk or an API reference to a module that does not exist. These checks need no mkdocs:
every command and every option of it is named somewhere in docs/, and every page is in the navigation."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from symmerge.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def undocumented(text: str) -> list[str]:
    """`CMD --option` for every option (by any of its names) of every command that `text` never names."""
    named = lambda flag: re.search(re.escape(flag) + r"(?![\w-])", text)  # noqa: E731
    missing = []
    for command, parser in _subparsers().items():
        for action in parser._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                if not any(named(f) for f in action.option_strings):
                    missing.append(f"{command} {action.option_strings[-1]}")
    return missing


def _pages() -> str:
    return "\n".join(p.read_text() for p in sorted(DOCS.rglob("*.md")))


def test_every_command_and_option_is_documented():
    text = _pages()
    assert [c for c in COMMANDS if f"`{c}`" not in text] == []
    assert undocumented(text) == []
    # negative control: a page set that never names --sweep-workers is caught
    assert "align --sweep-workers" in undocumented(text.replace("--sweep-workers", "--sweep"))


def test_every_page_is_in_the_navigation():
    nav = re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert set(nav) == pages


def test_the_changelog_page_is_the_changelog():
    """One source: docs/changelog.md includes CHANGELOG.md (pymdownx.snippets) instead of copying it."""
    assert (DOCS / "changelog.md").read_text().strip() == '--8<-- "CHANGELOG.md"'


SRC = ROOT / "src" / "symmerge"


def _spans(text: str) -> list[str]:
    """The inline code spans of Markdown `text` (fenced blocks left out)."""
    return re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


def missing_modules(text: str, here: Path = ROOT) -> list[str]:
    """Module paths and dotted `symmerge.` names in `text`'s code spans that name nothing: a path is looked up
    from the repository root, from the page's folder `here`, under src/symmerge, and as the tail of a path
    under it; a dotted name is
    imported (its longest module prefix), the rest looked up as attributes."""
    import importlib

    modules = [p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")]
    missing = []
    for span in _spans(text):
        for path in re.findall(r"(?<![\w<>/.-])((?:[\w.-]+/)*\w+\.py)\b", span):
            if not ((ROOT / path).is_file() or (here / path).is_file() or any(m == path or m.endswith("/" + path) for m in modules)):
                missing.append(path)
        for name in re.findall(r"^(symmerge(?:\.\w+)+)", span):
            if name == "symmerge.json":  # the file every output holds
                continue
            parts, obj = name.split("."), None
            for k in range(1, len(parts) + 1):  # the longest prefix that imports
                try:
                    obj, rest = importlib.import_module(".".join(parts[:k])), parts[k:]
                except ImportError:
                    break
            for attr in rest:
                obj = getattr(obj, attr, None)
            if obj is None:
                missing.append(name)
    return missing


def test_every_module_the_docs_name_exists():
    pages = {p: p.read_text() for p in [*sorted(DOCS.rglob("*.md")), ROOT / "README.md", ROOT / "benchmarks/README.md"]}
    missing = {p.relative_to(ROOT).as_posix(): missing_modules(text, p.parent) for p, text in pages.items()}
    assert {p: m for p, m in missing.items() if m} == {}
    # negative controls: a moved module, a renamed function and a path with a typo are found
    assert missing_modules("`symmerge/barrier.py`, `match/registy.py`, `symmerge.api.aligned`, `match/options.py`, "
                           "`symmerge.match.registry.Data`") == ["symmerge/barrier.py", "match/registy.py", "symmerge.api.aligned"]
