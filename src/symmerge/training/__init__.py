"""Training small stock models from scratch."""
