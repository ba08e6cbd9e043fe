"""Checkpoints: what they hold, when they are written, restoring them, model-only weights."""
