"""Schedule: the self-respawning runner chains over cron.hourly/ and cron.daily/ (cron.py) and the same runs as
scrontab entries (scrontab.py). The jobs they run are the experiments' hourly jobs: their interface is ops/hourly_job.py
(below every folder of ops/, as alerts.py), each job is declared beside its library code, and the registry that
renders them into the cron folder is ops/hourly_registry.py (above the folders whose jobs it registers)."""
