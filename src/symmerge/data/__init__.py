"""Evaluation and training data: text and image batches for the stock forward."""
