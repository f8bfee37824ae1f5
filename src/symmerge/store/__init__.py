"""Checkpoints on disk and in memory as canonical parts, their exports, reports and model cards."""
