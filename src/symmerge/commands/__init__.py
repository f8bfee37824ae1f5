"""One module per CLI command; see `symmerge.cli`."""
