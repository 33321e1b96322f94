"""What the cron jobs and the on-call person run, one subpackage per thing the on-call person does:

- watch/: is the training running, scheduled, stuck, finished or unhealthy (the status watchdog);
- tell/: what an alert says and where it goes (email, webhook), at most once per cooldown;
- schedule/: the self-respawning cron chains and the experiment's hourly jobs;
- keep/: getting a run's logs and checkpoints off the cluster (Hub sync, backup) and its chronicle.

Nothing here imports torch or deepspeed: these run on CPU nodes and must answer in well under a second.
"""
