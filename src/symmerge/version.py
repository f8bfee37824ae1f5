"""The package's version, read from one source: pyproject.toml."""

from importlib import metadata as _metadata
from pathlib import Path as _Path


def _version() -> str:
    """The version pyproject.toml states, the one source: read from the installed package's metadata, or,
    for a source tree run without installing (`PYTHONPATH=src`), from the checkout's pyproject.toml."""
    try:
        return _metadata.version("symmerge")
    except _metadata.PackageNotFoundError:
        import tomllib

        pyproject = _Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


__version__ = _version()
