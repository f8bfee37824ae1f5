"""Whole operations over checkpoints: align a pair, merge many, the demo."""
