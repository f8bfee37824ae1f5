"""The figures of the docs pages (`readme_figures.PAGES` after README.md): each measured number a page of
docs/ prints, as a `Figure` naming its page and the result cells it comes from, and each number there that
is no result, as a `NotFigure` with its reason. `readme_figures.py` adds them to its registry and checks
them as README.md's."""

from __future__ import annotations

from figure_refs import Figure, NotFigure

FIGURES: dict[str, Figure] = {}
NOT_FIGURES: tuple[NotFigure, ...] = ()
