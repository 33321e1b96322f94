"""Tell: what the alerts say (alert_text.py), when one is due and the state between runs (notify.py), and the
channels that carry them: email (email.py) and a chat webhook (webhook.py)."""
