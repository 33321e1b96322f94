"""Schedule: the self-respawning runner chains over cron.hourly/ and cron.daily/ (cron.py), the same runs as
scrontab entries (scrontab.py), and the experiment's hourly jobs (hourly_jobs.py)."""
