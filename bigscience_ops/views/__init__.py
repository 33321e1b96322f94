"""What people look at most: the run's log (tail, follow) and its loss curve (a PNG from TensorBoard events)."""
