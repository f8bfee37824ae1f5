"""symmerge: align and merge independently trained Transformers modulo their weight-space symmetries.

`import symmerge` loads only this file, `errors` and `version`. The library (`symmerge.api`: one function
per operation, typed options, results) is exported here, loading `symmerge.api` on first use:
`from symmerge import align, merge, barrier, evaluate` is `from symmerge.api import ...`. No submodule
shares a name with an export (the modules behind them are `compatible`, `barrier_pair`, `expansion` and
`evaluation`), so an export is never replaced by a submodule when that is imported.
"""

from .errors import SymmergeError
from .version import __version__

#: the library names exported here (lazily, from symmerge.api)
_API = ("load", "align", "merge", "barrier", "interpolate", "expand", "transform", "evaluate", "Result", "Options",
        "WeightOptions", "ActivationOptions", "LearnedOptions", "DualOptions", "ManyOptions")

__all__ = ["SymmergeError", "__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'symmerge' has no attribute {name!r}")
