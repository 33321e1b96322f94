"""What the cron jobs and the on-call person run: the status watchdog, alert emails, the cron runner.

Nothing here imports torch or deepspeed: these run on CPU nodes and must answer in well under a second.
"""
