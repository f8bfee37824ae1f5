"""What every library operation (`symmerge.api`) returns: its report, and what it made.

`report` is the command's JSON payload (`report.py` lists each command's keys); `save(path)` writes it
stamped with the schema, the command and the package version, as `--json` does. `out` is the folder
written (None where nothing was written); `elements` the group elements found (align: by side, "B" and,
for dual, "A"; merge: one per model); `models` the outputs held in memory (align without `out`: each
side's input re-parameterised, a `model.Model` computing its input's function).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Result:
    command: str
    report: dict
    out: Path | None = None
    elements: dict | list | None = None
    models: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)  # what the command's printed line needs beside the report

    def __getitem__(self, key: str):
        return self.report[key]

    def save(self, path) -> Path:
        """The report as a stamped JSON file at `path` (complete or absent); returns the path."""
        from .report import write

        write(path, self.command, self.report)
        return Path(path)

    def json(self) -> str:
        """The report as stamped JSON text."""
        from .report import dumps

        return dumps(self.command, self.report)
