"""symmerge: align and merge independently trained Transformers modulo their weight-space symmetries.

`import symmerge` loads only this file, `errors` and `version`. The library (`symmerge.api`: one function
per operation, typed options, results) is imported as `from symmerge import api`; its names that no
submodule shares (`align`, `interpolate`, `transform`, `load`, the options and `Result`) are also
exported here, loading `symmerge.api` on first use. `barrier`, `merge`, `expand` and `evaluate` are
submodules of the package too, so their functions are reached as `api.barrier` and so on: an export of the
same name would be replaced by the submodule as soon as that is imported.
"""

from .errors import SymmergeError
from .version import __version__

#: the library names exported here (lazily, from symmerge.api)
_API = ("align", "interpolate", "transform", "load", "Result", "Options", "WeightOptions", "ActivationOptions",
        "LearnedOptions", "DualOptions", "ManyOptions")

__all__ = ["SymmergeError", "__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'symmerge' has no attribute {name!r}")
