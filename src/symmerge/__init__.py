"""symmerge: align and merge independently trained Transformers modulo their weight-space symmetries."""

__version__ = "0.1.0"


class SymmergeError(Exception):
    """An error caused by the user's input; the CLI prints its message on one line and exits 2."""
