"""Watch: whether a training is running, scheduled, stuck or gone (status.py), where its run folder says it
stands (lifecycle.py), and one watchdog run putting them together with training health (ops/health.py), the
cron chains and the evaluation results (watchdog.py), declared as an hourly job in hourly.py. Its alerts are raised
from ops/alerts.py."""
