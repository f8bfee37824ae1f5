"""Progress bars: tqdm's, shown only where someone can watch them.

A bar is shown when the caller asks for one (`disable=False`, the commands' default) and
- `TQDM_DISABLE` is unset or empty and the bar's stream (stderr) is a terminal or a notebook
  (a log file or a pipe gets no bar: tqdm's carriage returns would fill it with one line per update);
- `TQDM_DISABLE` is set to a false value (`envvars.FALSE`: `0`, `false`, `no`, `off`): bars even into a file;
- `TQDM_DISABLE` set to anything else (`1`, `true`, ...) shows none.

tqdm reads `TQDM_*` variables only as defaults of arguments not passed, and every symmerge bar passes
`disable`, so without this the variable was ignored. `tqdm.write` (the lines the commands print between
bar updates) is unaffected.
"""

from __future__ import annotations

import sys

from tqdm.auto import tqdm as _tqdm

from .envvars import flag


def shown(file=None) -> bool:
    """Whether a bar that was asked for is shown on `file` (default: stderr), by the rules above."""
    disabled = flag("TQDM_DISABLE")
    if disabled is not None:
        return not disabled
    stream = sys.stderr if file is None else file
    return "ipykernel" in sys.modules or bool(getattr(stream, "isatty", lambda: False)())


class tqdm(_tqdm):  # noqa: N801  (tqdm's own name, so that call sites read as tqdm's)
    """tqdm with `disable` resolved by `shown` (see the module docstring)."""

    def __init__(self, *args, disable: bool | None = False, **kwargs):
        super().__init__(*args, disable=bool(disable) or not shown(kwargs.get("file")), **kwargs)
