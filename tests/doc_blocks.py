"""The code blocks of a Markdown page, by section: what the tests that run documentation as written read."""

from __future__ import annotations

import re


def code_blocks(text: str, section: str, language: str) -> list[str]:
    """The ```language code blocks of the section (a heading line, `## Title` or `### Title`) titled
    `section`, up to the next heading of any level from ## down."""
    start = text.index(section + "\n")
    end = re.search(r"\n##+ ", text[start + len(section):])
    body = text[start: start + len(section) + (end.start() if end else len(text))]
    return re.findall(rf"```{language}\n(.*?)```", body, re.S)
