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
