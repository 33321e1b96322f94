"""Evaluate: downstream evaluation of checkpoints (lm-eval tasks and bits per byte) in the run's own layout,
its result files (results.py) and the hourly job's decision (schedule.py)."""
