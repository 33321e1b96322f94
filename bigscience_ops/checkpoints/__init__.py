"""A run's checkpoints: where they are, what to keep, and what they become outside the trainer."""
