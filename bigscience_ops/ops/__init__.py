"""What the cron jobs and the on-call person run, one subpackage per thing the on-call person does:

- alerts.py: the vocabulary below them all: the Alert and StatusReport types and the registry of conditions (each
  kind's cooldown key, headline, advice and ALERT sentence, once);
- health.py: whether the run trains well, read from its log (the watchdog alerts on it, the chronicle lists it);
- watch/: is the training running, scheduled, stuck, finished or unhealthy (the status watchdog);
- tell/: what an alert says and where it goes (email, webhook), at most once per cooldown;
- schedule/: the self-respawning cron chains and the experiment's hourly jobs;
- keep/: getting a run's logs and checkpoints off the cluster (Hub sync, backup) and its chronicle.

No two of them import each other: alerts.py and health.py stand below the folders, tell/ below watch/, keep/ below
watch/. Nothing here imports torch or deepspeed: these run on CPU nodes and must answer in well under a second.
"""
