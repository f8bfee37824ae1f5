"""How symmerge reads a yes/no environment variable: one rule for every variable it consults.

A value is *false* when, stripped and lower-cased, it is one of `FALSE` (`0`, `false`, `no`, `off`);
*unset* when the variable is missing or empty; *true* otherwise (`1`, `yes`, anything else). Callers
decide what unset means for their variable (`TQDM_DISABLE` unset: bars only on a terminal;
`HF_HUB_OFFLINE` unset: online).
"""

from __future__ import annotations

import os

FALSE = ("0", "false", "no", "off")


def flag(name: str) -> bool | None:
    """The variable `name` read by the rule above: False, True, or None when unset or empty."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return None
    return value not in FALSE
