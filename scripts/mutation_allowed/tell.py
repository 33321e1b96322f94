"""Allow-list lines of the tell and watch group (scripts/mutation.py runs this file with allow, ALLOWED, EQUIVALENT and
NOT_WORTH given): each survivor that no test should kill, with why."""

_ESCAPE = ('return f"\\\\x{code:02x}" if code < 0x100 else f"\\\\u{code:04x}" if code < 0x10000 else '
           'f"\\\\U{code:08x}"')
allow("ops/tell/quoting.py", "_escape", EQUIVALENT + "U+0100 and U+10000 are printable letters: never escaped, so "
      "the bounds' edges are never asked about",
      *[(_ESCAPE, _ESCAPE.replace(old, new, 1)) for old, new in (
          ("code < 0x100", "code <= 0x100"), ("code < 0x100", "code < 257"), ("code < 0x10000", "code <= 0x10000"),
          ("code < 0x10000", "code < 65537"))])
for module, function, line in (("ops/tell/notify.py", "_now", "return datetime.now().replace(microsecond=0)"),
                               ("ops/watch/status.py", "check", "now = now or datetime.now().replace(microsecond=0)"),
                               ("ops/watch/local_run.py", "check",
                                "now = now or datetime.now().replace(microsecond=0)")):
    allow(module, function, NOT_WORTH + "a microsecond on the clock read when no time is given (the tests give one)",
          (line, line.replace("microsecond=0", "microsecond=1")))
_SSL = "super().__init__(host, port, timeout=deadline.seconds, **options)  # type: ignore[arg-type]"
allow("ops/tell/email.py", "_SmtpSsl.__init__", EQUIVALENT + "the connection is made by _get_socket with the "
      "deadline, which ignores smtplib's timeout",
      (_SSL, _SSL.replace("timeout=deadline.seconds", "timeout=None")),
      (_SSL, _SSL.replace("timeout=deadline.seconds, ", "")))
_HEADERS = 'headers={"Content-Type": "application/json", "User-Agent": "bsops", "Connection": "close"})'
allow("ops/tell/webhook.py", "_exchange", EQUIVALENT + "HTTP header names, media types and the `close` token are "
      "case-insensitive",
      *[(_HEADERS, _HEADERS.replace(old, new)) for old, new in (
          ('"Content-Type"', '"content-type"'), ('"Content-Type"', '"CONTENT-TYPE"'),
          ('"application/json"', '"APPLICATION/JSON"'), ('"User-Agent"', '"user-agent"'),
          ('"User-Agent"', '"USER-AGENT"'), ('"Connection"', '"connection"'), ('"Connection"', '"CONNECTION"'),
          ('"close"', '"CLOSE"'))])
allow("ops/tell/webhook.py", "_exchange", NOT_WORTH + "`Connection: close` asks the server to close after its "
      "answer; the client closes the connection itself right after reading it",
      (_HEADERS, _HEADERS.replace('"Connection"', '"XXConnectionXX"')),
      (_HEADERS, _HEADERS.replace('"close"', '"XXcloseXX"')))

# --- alert_state.py
_SINCE = 'return sorted(entries, key=lambda ce: str(ce[1].get("since", "")), reverse=True), problem'
allow("ops/tell/alert_state.py", "open_alerts", EQUIVALENT + "every entry read has a `since` (read_state refuses one "
      "without), so the default is never used",
      (_SINCE, _SINCE.replace('"since", ""', '"since", None')), (_SINCE, _SINCE.replace('"since", ""', '"since", ')))
_ASIDE = ('aside = sorted(path.parent.glob(f"{glob.escape(path.name)}{UNREADABLE}*")) if path.parent.is_dir() '
          'else []')
allow("ops/tell/alert_state.py", "state_problem", EQUIVALENT + "Path.glob in a folder that is missing (or is a file) "
      "finds nothing: the same empty list",
      (_ASIDE, _ASIDE.replace("if path.parent.is_dir()", "if (path.parent.is_dir()) or True")))
_JSON = '"events": state.events}, indent=1, sort_keys=True) + "\\n"'
allow("ops/tell/alert_state.py", "save_state", EQUIVALENT + "the JSON's layout (indentation, key order): the same "
      "data, which every reader (read_state) parses",
      *[(_JSON, _JSON.replace(old, new)) for old, new in (
          ("indent=1", "indent=None"), ("sort_keys=True", "sort_keys=None"), ("indent=1, ", ""),
          ("sort_keys=True", ""), ("indent=1", "indent=2"), ("sort_keys=True", "sort_keys=False"))])
_PROBE = "fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)"
allow("ops/tell/alert_state.py", "unwritable", EQUIVALENT + "the probe file is deleted as soon as it is written: its "
      "mode and its content are never seen",
      (_PROBE, _PROBE.replace(", 0o600)", ", )")), (_PROBE, _PROBE.replace("0o600", "385")),
      ('os.write(fd, b"\\n")', 'os.write(fd, b"XX\\nXX")'))
allow("ops/tell/alert_state.py", "unwritable", EQUIVALENT + "the probe was just made by this process (named after its "
      "pid, opened with O_CREAT): it is there to delete",
      ("probe.unlink(missing_ok=True)", "probe.unlink(missing_ok=None)"),
      ("probe.unlink(missing_ok=True)", "probe.unlink(missing_ok=False)"))
allow("ops/tell/alert_state.py", "unwritable", NOT_WORTH + "why a folder or a log cannot be written, in words: the "
      "OS's short reason or the whole error, the file named either way (the tests assert that)",
      ('return f"{folder}: {exc.strerror or exc}"', 'return f"{folder}: {exc.strerror and exc}"'),
      ('return f"{path}: {exc.strerror or exc}"', 'return f"{path}: {exc.strerror and exc}"'))
_BASE = 'base = env.get(STATE_FOLDER_ENV, "")'
allow("ops/tell/alert_state.py", "user_state_folder", EQUIVALENT + "no variable: None and an empty text are both no "
      "base (`if base`)",
      (_BASE, _BASE.replace(', "")', ", None)")), (_BASE, _BASE.replace(', "")', ", )")))

# --- alert_text.py
_SINCE_SHOWN = 'lasted = [f"- {untrusted_text(str(e.get(\'message\', c)))} (since {e.get(\'since\', \'?\')})"'
allow("ops/tell/alert_text.py", "recovery_email", NOT_WORTH + "the mark shown for a time not recorded, a message's "
      "words; and never shown: every entry of the state has a `since` (read_state refuses one without)",
      (_SINCE_SHOWN, _SINCE_SHOWN.replace("'?'", "'XX?XX'")))

# --- quoting.py
_HEAD = 'head = match.group(0)[:match.start(match.lastindex) - match.start(0)] if match.lastindex else ""'
_LAST = 'return head + match.group(match.lastindex or 0).replace(".", "[.]")'
allow("ops/tell/quoting.py", "_dots", EQUIVALENT + "every pattern _dots is given (_AFTER_SCHEME, _PROTOCOL_RELATIVE, "
      "_WWW, _IPV4) has groups that always take part, the first starting where the match does and the next right "
      "after it: lastindex is never None, and group(1) is group(0)'s head",
      (_HEAD, _HEAD.replace("if match.lastindex", "if (match.lastindex) or True")),
      (_HEAD, _HEAD.replace("match.group(0)", "match.group(1)")),
      (_HEAD, _HEAD.replace("- match.start(0)", "- match.start(1)")),
      (_LAST, _LAST.replace("lastindex or 0", "lastindex or 1")))
allow("ops/tell/quoting.py", "defang_block", EQUIVALENT + "X is printable: keeping it too changes nothing",
      ('line = _printable(line, keep="\\t")', 'line = _printable(line, keep="XX\\tXX")'))
_TEXT = "text = value if isinstance(value, str) else str(value)"
allow("ops/tell/quoting.py", "quote_untrusted", EQUIVALENT + "str() of a text is that text",
      (_TEXT, _TEXT.replace("if isinstance(value, str)", "if (isinstance(value, str)) and False")))

# --- notify.py
_FINISHED = 'outgoing.append(_Outgoing("finished", (), (), on, *alert_text.finished_email(experiment, report)))'
allow("ops/tell/notify.py", "notify", EQUIVALENT + "a finished message's keys are never read (_record_sent records it "
      "under the job, _sent_lines names its kind)",
      (_FINISHED, _FINISHED.replace('"finished", (), ()', '"finished", None, ()')))
_RAISED = 'alert = raise_alert("job-failed", subject=job, job=job, experiment=experiment, command=command)'
allow("ops/tell/notify.py", "notify_job", EQUIVALENT + "the experiment fills only the alert's own message, which the "
      "job's email does not show (its subject is the headline, its step the advice; job_alert_email names the "
      "experiment itself)",
      (_RAISED, _RAISED.replace("experiment=experiment", "experiment=None")))
allow("ops/tell/notify.py", "_tried", EQUIVALENT + "every entry has `sent`: _record makes it with one, read_state adds "
      "it to one read without",
      ('entry.setdefault("sent", {}).pop(channel, None)', 'entry.setdefault("sent", None).pop(channel, None)'),
      ('entry.setdefault("sent", {}).pop(channel, None)', 'entry.setdefault("sent", ).pop(channel, None)'),
      ('entry.setdefault("sent", {})[channel] = sent', 'entry.setdefault("sent", None)[channel] = sent'),
      ('entry.setdefault("sent", {})[channel] = sent', 'entry.setdefault("sent", )[channel] = sent'))
_UNTRUSTED = 'return "\\n".join([*(quote_untrusted(line, LINE_MAX, mark=False) for line in lines[:ERROR_LINES]), *more])'
allow("ops/tell/alert_text.py", "untrusted_text", EQUIVALENT + "quote_untrusted reads `mark` as a truth value: None is "
      "False",
      (_UNTRUSTED, _UNTRUSTED.replace("mark=False", "mark=None")))
