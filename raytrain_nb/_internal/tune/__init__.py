"""Ray Tune around the trainer: reporting to Tune, trials as runs, warm starts (driver side)."""
