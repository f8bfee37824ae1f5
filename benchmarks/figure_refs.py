"""Where a figure printed in README.md comes from: one number of one cell of a benchmark's result file
(`benchmarks/results/NAME.json`, schema in `record.py`), and whether the README prints it.

A `Ref` names the result file, the record (its `key`), the table (its index in the record), the row (the
start of its cells joined by " | ", which must pick exactly one row), the column (its heading) and which
number of the cell (`k`, counted from 0: "0.0423 ± 0.0046 seeds ± 0.0047 test" holds three). A figure the
README derives from recorded ones says how: `(x - minus) * scale`, `minus` a number or another `Ref` (a
percentage of a ratio: minus 1, scale 100; a difference of two cells). A printed value agrees with its
reference when they differ by at most half a unit of the printed value's last digit (0.694 for 0.6943,
"1e-6" for 8e-7): the README may round, never change, a figure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?")


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
