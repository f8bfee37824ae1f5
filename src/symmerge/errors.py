"""The one exception of user errors. A leaf module: everything imports it, it imports nothing."""


class SymmergeError(Exception):
    """An error caused by the user's input; the CLI prints its message on one line and exits 2."""
