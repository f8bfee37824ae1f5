"""What the figures' registry (`readme_figures.py`) holds: a `Figure`, a measured number printed on one page
(README.md unless it names another, a path from the repository root), found there by its pattern, and where
it comes from; a `NotFigure`, a number of a page that is no result, with its reason; and a `Ref`, one number
of one cell of a benchmark's result file (`benchmarks/results/NAME.json`, schema in `record.py`).

A `Ref` names the result file, the record (its `key`), the table (its index in the record), the row (the
start of its cells joined by " | ", which must pick exactly one row), the column (its heading) and which
number of the cell (`k`, counted from 0: "0.0423 ± 0.0046 seeds ± 0.0047 test" holds three). A figure a page
derives from recorded ones says how: `(x - minus) * scale`, `minus` a number or another `Ref` (a percentage of
a ratio: minus 1, scale 100; a difference of two cells), `Mean`, the mean of several references' numbers (a
mean over pairs), or `Sum`, their sum times a scale (a run's minutes from its timed parts). A printed value
agrees with its reference when they differ by at most half a unit of the printed value's last digit (0.694 for
0.6943, "1e-6" for 8e-7): a page may round, never change, a figure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).resolve().parent / "results"
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?")
#: the page an entry is on unless it names another
README = "README.md"


def load(folder: Path = RESULTS) -> dict[str, dict]:
    """Every result file by its name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


@dataclass(frozen=True)
class Ref:
    result: str
    record: str
    row: str
    column: str
    k: int = 0
    table: int = 0
    scale: float = 1.0
    minus: Ref | float = 0.0

    def __str__(self) -> str:
        derived = "" if self.minus == 0 and self.scale == 1 else f" (x - {self.minus}) * {self.scale:g}"
        return (f"results/{self.result}.json «{self.record}» table {self.table}, row «{self.row}», "
                f"column «{self.column}», number {self.k}{derived}")

    def cell(self, results: dict[str, dict]) -> str:
        """The cell's text; LookupError when the reference does not name exactly one cell."""
        try:
            rec = next(r for r in results[self.result]["records"] if r["key"] == self.record)
            table = rec["tables"][self.table]
            col = table["columns"].index(self.column)
        except (KeyError, StopIteration, IndexError, ValueError) as e:
            raise LookupError(f"{self}: no such result, record, table or column") from e
        rows = [r for r in table["rows"] if " | ".join(r).startswith(self.row)]
        if len(rows) != 1:
            raise LookupError(f"{self}: the row matches {len(rows)} rows (must be one)")
        return rows[0][col]

    def value(self, results: dict[str, dict]) -> float:
        numbers = NUMBER.findall(self.cell(results))
        if self.k >= len(numbers):
            raise LookupError(f"{self}: the cell holds {len(numbers)} numbers")
        minus = self.minus.value(results) if isinstance(self.minus, Ref) else self.minus
        return (float(numbers[self.k].replace(",", "")) - minus) * self.scale


@dataclass(frozen=True)
class Sum:
    """The sum of several references' numbers, all of one result file, times `scale` (a total of a run's
    timed parts in minutes: each part's seconds, scale 1/60)."""

    refs: tuple[Ref, ...]
    scale: float = 1.0

    def __post_init__(self) -> None:
        assert len({r.result for r in self.refs}) == 1, f"a {type(self).__name__}'s references are of one result file"

    @property
    def result(self) -> str:
        return self.refs[0].result

    def __str__(self) -> str:
        return f"{self.scale:g} x the sum of {len(self.refs)} cells: " + "; ".join(map(str, self.refs))

    def value(self, results: dict[str, dict]) -> float:
        return sum(r.value(results) for r in self.refs) * self.scale


@dataclass(frozen=True)
class Mean(Sum):
    """The mean of several references' numbers, all of one result file."""

    def __str__(self) -> str:
        return f"the mean of {len(self.refs)} cells: " + "; ".join(map(str, self.refs))

    def value(self, results: dict[str, dict]) -> float:
        return super().value(results) / len(self.refs)


def half_unit(printed: str) -> float:
    """Half a unit of the printed value's last digit."""
    mantissa, _, exponent = printed.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals)


def agrees(printed: str, recorded: float) -> bool:
    return abs(recorded - float(printed)) <= half_unit(printed) * (1 + 1e-9) + 1e-12


def row(result: str, record: str, row: str, columns: list[str], table: int = 0) -> tuple[Ref, ...]:
    """One reference per column of one row (the first number of each cell)."""
    return tuple(Ref(result, record, row, c, table=table) for c in columns)


# --- the registry's entries ---------------------------------------------------------------------------------

#: a value of a pattern, its sign included, whole: a figure ending a sentence ("{}.") takes all of "0.0500." and
#: cannot stop at its "0"
NUM = r"(-?\d+(?:\.\d+)?)(?!\.?\d)"


def P(template: str) -> str:
    """A pattern from a page's text: `{}` for each value, any run of whitespace matching any other (the
    pages wrap their prose)."""
    parts = template.split("{}")
    esc = [r"\s+".join(re.escape(w) for w in p.split()) if p.strip() else "" for p in parts]
    # keep a boundary's whitespace where the literal begins or ends with it
    for i, p in enumerate(parts):
        if p.strip():
            esc[i] = (r"\s+" if p[0].isspace() else "") + esc[i] + (r"\s+" if p[-1].isspace() else "")
        elif p:
            esc[i] = r"\s+"
    return NUM.join(esc)


@dataclass(frozen=True)
class Tol:
    """How a fresh value is compared with the page's: `digits` (the default) the same printed digits
    (deterministic at one thread on one machine); `rel`: within that fraction (timings under load)."""

    rel: float | None = None

    def agrees(self, old: str, new: str) -> bool:
        if self.rel is None:
            return old == new
        return abs(float(new) - float(old)) <= self.rel * abs(float(old))

    def __str__(self) -> str:
        return "the printed digits" if self.rel is None else f"within {self.rel:.0%}"


DIGITS = Tol()
KINDS = ("test", "script", "benchmark")


@dataclass(frozen=True)
class Figure:
    name: str
    #: matches the page's text of the figure; its groups are the values
    pattern: str
    kind: str  # "test" | "script" | "benchmark"
    #: test/script: the run giving the values as the page prints them, in the pattern's group order
    run: Callable[[Path], list[str]] | None = None
    #: benchmark: the result cell each value comes from, in the pattern's group order
    refs: tuple[Ref | Sum, ...] = ()
    #: the command (script) that produces it; benchmark: the section holds the full command lines
    command: str = ""
    #: one for every value, or one per value
    tol: Tol | tuple[Tol, ...] = DIGITS
    #: the page that prints it, from the repository root
    page: str = README

    def tols(self, n: int) -> tuple[Tol, ...]:
        return self.tol if isinstance(self.tol, tuple) else (self.tol,) * n


@dataclass(frozen=True)
class NotFigure:
    """Numbers of a page that are not measured results."""

    pattern: str
    reason: str
    many: bool = False  # may match several times
    page: str = README


def not_figures(texts_by_reason: dict[str, tuple[str, ...]], page: str = README) -> tuple[NotFigure, ...]:
    """One `NotFigure` for each text of the page (`P` templates without values), found once, by reason."""
    return tuple(NotFigure(P(text), reason, page=page) for reason, texts in texts_by_reason.items() for text in texts)
