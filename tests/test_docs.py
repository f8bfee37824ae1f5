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
