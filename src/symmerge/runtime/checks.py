"""Report and plot files checked before any work: `check_report_file` and `check_plot_file` refuse a
`--json`/`--plot` path that would otherwise fail only after the whole computation (the value parsers for
numbers and seeds are `symmerge.runtime.values`)."""

from __future__ import annotations

from pathlib import Path

from ..errors import SymmergeError


def check_report_file(path: str | None, flag: str, outputs=()) -> None:
    """Refuse, before any work, a report path that names a folder, lies in a missing folder, or is one of
    the folders the command writes (`outputs`: OUT, --aligned; they do not exist yet when checked)."""
    if path is None:
        return
    p = Path(path)
    for out in outputs:
        if out is not None and p.absolute() == Path(out).absolute():
            raise SymmergeError(f"{flag} {path} is the output folder; give a file beside it, e.g. {p}.json")
    if p.is_dir():
        raise SymmergeError(f"{flag} {path} is a folder; give a file name, e.g. {p / 'report.json'}")
    if not p.absolute().parent.is_dir():
        raise SymmergeError(f"{flag} {path}: the folder {p.absolute().parent} does not exist; create it first")


def check_plot_file(path: str | None, report: str | None = None, flag: str = "--plot") -> None:
    """`check_report_file`, a file type matplotlib can write (known by the name's suffix) and not the `report`
    file (--json) too: refused before the computation, which otherwise ends in matplotlib's ValueError."""
    check_report_file(path, flag)
    if path is None:
        return
    if report is not None and Path(report).absolute() == Path(path).absolute():
        raise SymmergeError(f"{flag} and --json both name {path}; give each its own file")
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in kinds:
        raise SymmergeError(f"{flag} {path}: matplotlib cannot write {'.' + suffix if suffix else 'a file without a suffix'}; "
                            f"name a .png, .pdf or .svg file (or any of {', '.join(sorted(kinds))})")
