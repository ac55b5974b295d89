"""Script mode: Ray Train's trainers and configs on the worker group, one fit() run, elastic decisions, results."""
