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
