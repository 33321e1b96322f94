"""Allow-list lines of the watch group (scripts/mutation.py runs this file with allow, ALLOWED, EQUIVALENT and
NOT_WORTH given): each survivor that no test should kill, with why."""

# --- ops/watch/watchdog.py
allow("ops/watch/watchdog.py", "watch", EQUIVALENT + "`extra` is still empty there: adding to it and setting it are "
      "the same",
      ('extra += [f"{stamp} ***ALERT: the alert email could not be sent: {e}***" for e in errors]',
       'extra = [f"{stamp} ***ALERT: the alert email could not be sent: {e}***" for e in errors]'))
allow("ops/watch/watchdog.py", "watch", EQUIVALENT + "a notice comes only from the outbox: in the loop the outbox is "
      "never None",
      ('shown = outbox.destinations(n.channels) if outbox is not None else ""',
       'shown = outbox.destinations(n.channels) if (outbox is not None) or True else ""'))
_MOVED = 'if where.moved is None or any(a.kind == "watch-files-moved" for a in report.alerts):'
allow("ops/watch/watchdog.py", "_with_moved_alert", EQUIVALENT + "watch asks a second time only when the first "
      "place was the usual one (no alert added then), so the report never holds the kind yet",
      (_MOVED, _MOVED.replace('"watch-files-moved"', '"XXwatch-files-movedXX"')),
      (_MOVED, _MOVED.replace('"watch-files-moved"', '"WATCH-FILES-MOVED"')))
allow("ops/watch/watchdog.py", "_with_moved_alert", EQUIVALENT + "alert_state.place sets `usual` whenever it sets "
      "`moved`: the first branch is never taken here",
      ('what = ("beside the run\'s log" if where.usual is None',
       'what = ("beside the run\'s log" if (where.usual is None) and False'))
_SUBJECT = 'subject = f"{re.sub(r\'[^A-Za-z0-9_]\', \'?\', record.tag)[:64]}@{int(record.time)}"'
allow("ops/watch/watchdog.py", "_with_set_aside_alerts", EQUIVALENT + "a set-aside record's tag is at most 64 "
      "characters (set_aside._RULES refuses a longer one): the cut never cuts",
      (_SUBJECT, _SUBJECT.replace("[:64]", "[:65]")))

# --- ops/watch/lifecycle.py
allow("ops/watch/lifecycle.py", "_iteration", EQUIVALENT + "None and [] are both read only as false (`if saved`)",
      ("saved = []", "saved = None"))
allow("ops/watch/lifecycle.py", "_ledger_and_output_state", EQUIVALENT + "None and \"\" are both read only as false "
      "(`or match`, `if match`)",
      ("match = None", 'match = ""'))
_READ = 'for line in handle.read(65536).decode(errors="replace").split("\\n"):'
allow("ops/watch/lifecycle.py", "_ledger_and_output_state", EQUIVALENT + "the seek leaves at most 65536 bytes before "
      "the end: reading them all, or one more, reads the same",
      (_READ, _READ.replace("read(65536)", "read(None)")),
      (_READ, _READ.replace("read(65536)", "read(65537)")))
allow("ops/watch/lifecycle.py", "run_state", NOT_WORTH + "sacct's default timeout by a second (the watchdog passes its "
      "own; a test passing one checks it is kept)",
      ("def run_state(exp: Experiment, timeout: float = 30.0) -> RunState:",
       "def run_state(exp: Experiment, timeout: float = 31.0) -> RunState:"))

# --- ops/watch/local_run.py
_ALERT = "alerts.append(raise_alert(kind, contact=contact, headline=headline, advice=advice, job=job_name, **facts))"
allow("ops/watch/local_run.py", "evaluate", EQUIVALENT + "no caller passes an advice (status.not_running and the stall "
      "give a headline and facts): an empty advice, None and none given all take the condition's",
      (_ALERT, _ALERT.replace("advice=advice", "advice=None")),
      (_ALERT, _ALERT.replace("advice=advice, ", "")))
