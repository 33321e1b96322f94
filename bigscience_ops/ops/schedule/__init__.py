"""Schedule: the self-respawning runner chains over cron.hourly/ and cron.daily/ (cron.py), the same runs as
scrontab entries (scrontab.py), and the experiment's hourly jobs: their interface (hourly.py; each job is declared
beside its library code) and their registry and rendering (hourly_jobs.py)."""
