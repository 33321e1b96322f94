"""Text from a run's files, made fit for an alert: printable, bounded, never a link, marked as quoted data.

Whoever can write a run's files (a record, eval/jobs.jsonl, a result file, a log line, a task name) can put a
phishing link in front of the on-call person through a genuine alert. So every value that comes from those files
goes through `quote_untrusted` before it reaches a mail, a webhook or a console alert line:

- folded: every dot look-alike a browser, a mail client or a linkifier may take for a dot (DOT_LOOKALIKES: U+3002,
  U+FF0E, U+FF61, U+2024, U+FE52, ...) is a dot, then NFKC (fullwidth `ｈｔｔｐｓ：` is `https:`, `＠` is `@`);
- printable only: every character str.isprintable() refuses
  (controls, CR/LF, VT, FF, U+001C-U+001E, U+0085, U+2028/U+2029, bidi overrides, zero-width characters, NUL)
  becomes a visible escape (`\\u2028`), and a backslash becomes `\\\\`, so an escape cannot be forged;
- bounded: at most `limit` characters of the value are shown, with how long it was when cut;
- scheme-less: `http://` becomes `hxxp[:]//`, `https` `hxxps`, `ftp` `fxp`; every other `scheme://` and the
  schemes that need no slashes (`javascript:`, `data:`, `mailto:`, ...) get `[:]`; the dots of a host after a
  scheme or `//`, of `www.` names and IPv4 addresses become `[.]`, and so does every other dot that a letter of any
  script follows: a host's last dot is the one before its top-level domain, which is letters (or `xn--`), whatever
  that domain is (`evil.support`, `paypal.bank`, `пример.рф`), so no bare name, address or punycode stays a
  link (a file name's dot too, `run[.]sh`, unless the name is a path's segment, `/runs/x/run.sh`, which no
  linkifier takes for a host; numbers and versions keep their dots); square and angle brackets
  become ⟦ ⟧ and ‹ ›, so no markdown link
  (`[text](url)`), Slack link (`<url|text>`) or HTML tag (`<a href=...>`, `<img ...>`) stays whole (with
  `mark=False`, square brackets stay, as in a node range `r7i4n[1-7]`, and markdown's `](` is broken instead);
- marked: the result is in double quotes (a quote inside is `\\"`), so a reader sees where the file's words begin
  and end. `mark=False` is for a text that mixes bsops' words with a file's (a record's problem, an error).

`defang_block` is the net under it, which message.compose lays over every subject and body, whatever built them:
each line printable and cut at LINE_MAX, and the same scheme, `www.` and host rules, with markdown's `](` broken;
a dot or `@` look-alike (which no bsops word holds) becomes `[.]` or `[@]` before NFKC, which would otherwise make
`evil．com` or `a＠evil.com` of a text no quoting reached a live name or address. It keeps the rest as it is (bsops'
own host names, addresses, paths and brackets), and running it twice changes nothing.
"""

from __future__ import annotations

import re
import unicodedata

from bigscience_ops.redact import REDACTED

QUOTE_MAX = 200
"""Characters of one value shown in an alert at most (a job id, a log path, a task name, a log line)."""
LINE_MAX = 4000
"""Characters of one line of an alert's body at most."""

_RENAMED = {"http": "hxxp", "https": "hxxps", "ftp": "fxp", "ftps": "fxps", "sftp": "sfxp"}
# Schemes a client may follow without `//`: their colon is defanged wherever one is followed by something.
_BARE_SCHEMES = (r"https?|s?ftps?|wss?|file|javascript|vbscript|livescript|data|blob|mailto|tel|callto|sms|skype|"
                 r"irc|ircs|news|nntp|telnet|ssh|git|svn|ldaps?|smb|afp|nfs|about|view-source|chrome|jar|intent|"
                 r"market|steam|itms[a-z-]*|ms-[a-z-]+|feed|webcal|magnet|xmpp|sip|facetime")
_SCHEME = re.compile(rf"(?i)\b({_BARE_SCHEMES}):(?=\S)")
_ANY_SCHEME = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,30}):(?=//|\\\\|/\\|\\/)")
# A host: what follows a scheme's slashes (or a protocol-relative `//`), up to a path, a query or a space.
_HOST = r"[^\s/\\?#\"'‹›<>()\[\]⟦⟧|,;`]+"
_AFTER_SCHEME = re.compile(rf"(\[:\](?:[/\\]{{1,4}}|(?=\S)))({_HOST})")
_PROTOCOL_RELATIVE = re.compile(rf"(?:^|(?<=[\s\"'(=:,;‹]))((?://|\\{{2,4}})\s*)({_HOST})")
_WWW = re.compile(rf"(?i)\b(www\d{{0,3}}\.{_HOST})")
_MARKDOWN = re.compile(r"\]\(")
DOT_LOOKALIKES = ("\u3002\uff0e\uff61"  # the label separators of IDNA (browsers, Python's idna codec)
                  "\ufe12\u2024\ufe52"  # what NFKC folds to one of them or to `.`
                  "\u0701\u0702\u06d4\u0589\u1362\u1803\u166e\ua4ff\ua60e\u2e3c")  # the full stops of other scripts
"""Characters a browser, a mail client or a linkifier may take for the dot between two labels of a host name."""
AT_LOOKALIKES = "\uff20\ufe6b"
"""Characters NFKC folds to `@` (fullwidth, small commercial at)."""
_DOT_LOOKALIKE = re.compile(f"[{DOT_LOOKALIKES}](?=\\S)")
_AT_LOOKALIKE = re.compile(f"[{AT_LOOKALIKES}](?=\\S)")
# Quoted values only: a name (letters, digits, marks, `-`, `_`, dots: what ASCII punctuation and spaces delimit) not
# right after a `/` (a path's segment, which no linkifier takes for a host); and in it, a dot a letter of any script
# follows (after NFKC), which may end a host before its top-level domain.
_NAME = re.compile(r"[^\s!-,/:-@\[-^`{-~]+")
_HOST_DOT = re.compile(r"(?<=.)\.(?=[^\W\d_])")
_IPV4 = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3})(?![\w.])")
_BRACKETS = str.maketrans({"[": "⟦", "]": "⟧", "<": "‹", ">": "›"})
_REDACTED_QUOTED = REDACTED.replace("<", "‹").replace(">", "›")


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _printable(text: str, keep: str = "") -> str:
    """`text` with every character isprintable() refuses (but those in `keep`) escaped."""
    return "".join(c if c.isprintable() or c in keep else _escape(c) for c in text)


def _scheme(match: re.Match[str]) -> str:
    name = match.group(1)
    return _RENAMED.get(name.lower(), name) + "[:]"


def _dots(match: re.Match[str]) -> str:
    """The match with every dot of its last group made `[.]`."""
    head = match.group(0)[:match.start(match.lastindex) - match.start(0)] if match.lastindex else ""
    return head + match.group(match.lastindex or 0).replace(".", "[.]")


def _host_dots(match: re.Match[str]) -> str:
    """The name `match` found with each dot before a letter made `[.]`, unless it is a path's segment."""
    if match.start() and match.string[match.start() - 1] == "/":
        return match.group(0)
    return _HOST_DOT.sub("[.]", match.group(0))


def _defang(text: str) -> str:
    """Schemes, their hosts, protocol-relative hosts and `www.` names made dead (the rules both modes share)."""
    text = _SCHEME.sub(_scheme, text)
    text = _ANY_SCHEME.sub(_scheme, text)
    text = _AFTER_SCHEME.sub(_dots, text)
    text = _PROTOCOL_RELATIVE.sub(_dots, text)
    return _WWW.sub(_dots, text)


def quote_untrusted(value: object, limit: int = QUOTE_MAX, *, mark: bool = True) -> str:
    """`value` (a run's file's text; anything else is str()'d) fit for an alert: printable, at most `limit` of its
    characters, no link, in double quotes (`mark=False`: without them, for a text that already mixes bsops' words
    with the file's). See the module for the rules."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) > limit
    shown = unicodedata.normalize("NFKC", _DOT_LOOKALIKE.sub(".", text[:limit]))
    if mark:
        shown = shown.replace("\\", "\\\\").replace('"', '\\"')
        shown = "".join(c if c.isprintable() else _escape(c) for c in shown)
    else:
        shown = _printable(shown)  # a backslash kept: a record's problem quotes its excerpt as repr() does
    if mark:
        shown = shown.translate(_BRACKETS)
    else:  # bsops' words keep their brackets (a node range r7i4n[1-7], <redacted>): no link or tag stays whole
        shown = shown.replace("<", "‹").replace(">", "›").replace(_REDACTED_QUOTED, REDACTED)
    shown = _defang(shown)
    shown = _NAME.sub(_host_dots, _IPV4.sub(_dots, shown))
    shown = _MARKDOWN.sub("] (", shown)  # also after a `[:]` made of `javascript:(...)`
    if len(shown) > 4 * limit + 16:  # escapes and [.] make it longer: still bounded
        shown = shown[:4 * limit]
    more = f"... ({len(text)} characters)" if cut else ""
    return f'"{shown}"{more}' if mark else f"{shown}{more}"


def defang_names(text: str) -> str:
    """A name that bsops' words are built with (an experiment's, a Slurm job's, an alert condition's) with the link
    rules of quote_untrusted alone: its schemes, `www.` names, IPv4 addresses and host-like names made dead (dot
    and `@` look-alikes included); nothing else changed (`tr1-13B` stays as it is), its control characters left to
    the subject's and the body's own rules (message.header_text, defang_block)."""
    text = _AT_LOOKALIKE.sub("[@]", _DOT_LOOKALIKE.sub("[.]", text))
    return _NAME.sub(_host_dots, _IPV4.sub(_dots, _defang(text)))


def defang_block(text: str, line_max: int = LINE_MAX) -> str:
    """The net under every message (message.compose): each line of `text` printable (a tab kept), cut at `line_max`
    characters, its schemes, their hosts and `www.` names made dead and markdown's `](` broken; the line breaks
    (`\\n`) stay; a dot or `@` look-alike becomes `[.]` or `[@]` (before NFKC would make it `.` or `@`). Idempotent."""
    lines = []
    for line in text.split("\n"):
        cut = len(line) > line_max
        line = _AT_LOOKALIKE.sub("[@]", _DOT_LOOKALIKE.sub("[.]", line[:line_max]))
        line = unicodedata.normalize("NFKC", line)
        line = _printable(line, keep="\t")
        line = _MARKDOWN.sub("] (", _defang(line))
        lines.append(line + ("..." if cut else ""))
    return "\n".join(lines)
