"""Watch: whether a training is running, scheduled, stuck or gone (status.py), where its run folder says it
stands (lifecycle.py), whether it trains well (health.py), and one watchdog run putting them together
(watchdog.py)."""
