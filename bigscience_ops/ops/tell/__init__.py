"""Tell: what the alerts say (alert_text.py, from the words ops/alerts.py registers), when one is due and the state
between runs (notify.py), an hourly job's run with its failure told (job_alerts.py), and the channels that carry
them: the Channel protocol and the Message (message.py), the registry and the Outbox that sends on an alerts
section's channels (channels.py), email (email.py) and a chat webhook (webhook.py)."""
