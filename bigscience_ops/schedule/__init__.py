"""What a run does over time, computed from the experiment alone: the batch-size rampup and learning-rate
schedules (batch_lr.py), the node phases (nodes.py), and the RunSchedule that holds them all, computed once
(run.py)."""
