"""Checkpoints in storage: Checkpoint, the manager and its index, the run directory, staging and commit."""
