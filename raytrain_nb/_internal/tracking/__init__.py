"""Experiment tracking (MLflow, Weights & Biases) on the driver: one tracked run per run, steps that never repeat."""
