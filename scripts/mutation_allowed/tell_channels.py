"""Allow-list lines of the tell group's channels (email, webhook, channels, job_alerts, message; scripts/mutation.py
runs this file with allow, ALLOWED, EQUIVALENT and NOT_WORTH given): each survivor that no test should kill, with
why. The older lines of email.py and webhook.py are in tell.py."""

# --- email.py
_SMTP = "super().__init__(host, port, timeout=deadline.seconds, **options)  # type: ignore[arg-type]"
allow("ops/tell/email.py", "_Smtp.__init__", EQUIVALENT + "the connection is made by _get_socket with the "
      "deadline, which ignores smtplib's timeout (and smtplib reads it nowhere else)",
      (_SMTP, _SMTP.replace("timeout=deadline.seconds", "timeout=None")),
      (_SMTP, _SMTP.replace("timeout=deadline.seconds, ", "")))
_LOOKUP = 'return in_time(smtplib_rule, Deadline(deadline.remaining() / 2), "looking up this host\'s name")'
allow("ops/tell/email.py", "_local_hostname", EQUIVALENT + "the step's name is only in in_time's thread name and "
      "its DeadlineExceeded, which the except below drops (the plain host name is said instead)",
      (_LOOKUP, _LOOKUP.replace('"looking up this host\'s name"', "None")))
allow("ops/tell/email.py", "EmailChannel.email", EQUIVALENT + "an email's header field names are case-insensitive "
      "(RFC 5322 1.2.2); the email package and every server read `from:` as `From:`",
      *[(f'msg["{name}"] = {value}', f'msg["{case(name)}"] = {value}')
        for name, value in (("From", "message.sender"), ("To", '", ".join(self.settings.recipients)'),
                            ("Subject", "message.subject"), ("Date", "format_datetime(message.date)"),
                            ("Message-ID", "message.message_id"))
        for case in (str.lower, str.upper)])
allow("ops/tell/email.py", "EmailChannel.send", EQUIVALENT + "the password is only read when there is a user (and "
      "then set from the environment) and only tested for being empty",
      ("password = None", 'password = ""'))
_DETAIL = 'detail = header_text(scrub(f"{type(exc).__name__}: {exc}", [password] if password else []), 500)'
allow("ops/tell/email.py", "EmailChannel.send", EQUIVALENT + "scrub leaves out empty and None secrets: [None] is []",
      (_DETAIL, _DETAIL.replace("if password else", "if (password) or True else")))

# --- webhook.py
_CONN = ("conn = http.client.HTTPSConnection(*target, timeout=deadline.remaining(), "
         "context=tls_context(ca_file, deadline))")
allow("ops/tell/webhook.py", "_exchange", EQUIVALENT + "http.client makes its connection with _create_connection, "
      "replaced by the deadline's connect, which ignores the connection's timeout (read nowhere else)",
      (_CONN, _CONN.replace("timeout=deadline.remaining()", "timeout=None")),
      (_CONN, _CONN.replace("timeout=deadline.remaining(), ", "")))
_READ = "while size <= MAX_ANSWER_BYTES and (chunk := response.read(MAX_ANSWER_BYTES + 1 - size)):"
allow("ops/tell/webhook.py", "_read_answer", EQUIVALENT + "http.client's read(n) returns n bytes unless the answer "
      "ends first (its Content-Length, its last chunk, or the server closing): the first read either holds "
      "MAX_ANSWER_BYTES + 1 bytes (too long, whatever the rest asks) or the whole answer, so the loop's second read "
      "only ever finds the end",
      (_READ, _READ.replace("size <= MAX", "size < MAX")),
      (_READ, _READ.replace("+ 1 - size", "+ 1 + size")),
      (_READ, _READ.replace("+ 1 - size", "+ 2 - size")),
      ("size += len(chunk)", "size = len(chunk)"))
_SECRETS = "secrets = [url, *(p for p in (parts.path, parts.query) if len(p) > 1)]"
allow("ops/tell/webhook.py", "post", EQUIVALENT + "scrub leaves out secrets shorter than redact.MIN_SECRET_LEN (4): a "
      "path or query of 1 to 3 characters is never replaced, whichever of them the list holds",
      (_SECRETS, _SECRETS.replace("len(p) > 1", "len(p) >= 1")),
      (_SECRETS, _SECRETS.replace("len(p) > 1", "len(p) > 2")))
allow("ops/tell/webhook.py", "post", EQUIVALENT + "a 300 is a redirect, raised by the branch before",
      ("if not 200 <= status < 300:", "if not 200 <= status <= 300:"),
      ("if not 200 <= status < 300:", "if not 200 <= status < 301:"))
_BASIC = 'headers["Proxy-Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")'
allow("ops/tell/webhook.py", "proxy_for", EQUIVALENT + "codec names are case-insensitive",
      (_BASIC, _BASIC.replace('"ascii"', '"ASCII"')))
_HALF = 'return in_time(smtplib_rule, Deadline(deadline.remaining() / 2), "looking up this host\'s name")'
allow("ops/tell/email.py", "_local_hostname", NOT_WORTH + "which fraction of the deadline the name lookup gets (a half, "
      "not a third): a test telling them apart races a sleeping resolver with a fraction of a second to spare, and "
      "fails on a busy machine; that the lookup is given up and the email still goes is tested",
      (_HALF, _HALF.replace("/ 2)", "/ 3)")))
