"""Credentials out of text: the one scrub every error, alert state, alert email and git message goes through.

`scrub` removes what a credential looks like wherever it sits in a text: the user-info of a URL
(`https://user:TOKEN@host/` -> `https://<redacted>@host/`), credential-like query parameters
(`?token=...`), `Authorization:` header values, `password=` lines of git's credential protocol,
Hugging Face (`hf_...`, `api_org_...`) and GitHub (`ghp_...`) tokens, and, when the caller knows
them, the secret values themselves. It only ever shortens what it finds; the rest of the text
stays as it was, so an error still says what went wrong.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"

# scheme://userinfo@ : any user-info with a password, and any at all over http(s), where a bare
# user name is often the token itself (https://TOKEN@host/).
_USERINFO = re.compile(r"(?i)\b(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<info>[^/\s@?#]*)@")
_QUERY_SECRET = re.compile(
    r"(?i)(?P<key>[?&;](?:[a-z0-9_.-]*(?:token|secret|passw(?:or)?d|pwd|key|auth|sig|signature|credential)"
    r"[a-z0-9_.-]*)=)(?P<value>[^&#\s'\"]+)")
_AUTH_HEADER = re.compile(r"(?im)^(?P<key>[ \t>*<]*(?:proxy-)?authorization[ \t]*:)[^\r\n]*")
_AUTH_INLINE = re.compile(r"(?i)(?P<key>(?:proxy-)?authorization[ \t]*[:=][ \t]*)(?:basic|bearer|token)[ \t]+[^\s'\"]+")
_PASSWORD_LINE = re.compile(r"(?im)^(?P<key>[ \t]*password[ \t]*=)[^\r\n]*")
_TOKENS = re.compile(r"\b(?:hf_[A-Za-z0-9]{8,}|api_org_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{16,}"
                     r"|github_pat_[A-Za-z0-9_]{16,})\b")
MIN_SECRET_LEN = 4  # shorter known values are left alone: replacing "abc" everywhere garbles the text


def _userinfo(match: re.Match[str]) -> str:
    scheme, info = match.group("scheme"), match.group("info")
    if ":" in info or scheme.lower() in ("http://", "https://"):
        return f"{scheme}{REDACTED}@"
    return match.group(0)  # ssh://git@host: a user name, no secret


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """`text` with every credential it holds replaced by <redacted>; `secrets` are values known to be secret."""
    for secret in sorted({s for s in secrets if s and len(s) >= MIN_SECRET_LEN}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _USERINFO.sub(_userinfo, text)
    text = _QUERY_SECRET.sub(lambda m: m.group("key") + REDACTED, text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group('key')} {REDACTED}", text)
    text = _AUTH_INLINE.sub(lambda m: m.group("key") + REDACTED, text)
    text = _PASSWORD_LINE.sub(lambda m: m.group("key") + REDACTED, text)
    return _TOKENS.sub(REDACTED, text)


def has_credentials(text: str) -> bool:
    """Whether `text` holds something scrub() would remove (a URL's password or token, a token, a header)."""
    return scrub(text) != text


def env_secrets(names: Iterable[str | None], env: Mapping[str, str] | None = None) -> list[str]:
    """The values of those environment variables (the Hub token, the SMTP password) that are set."""
    env = os.environ if env is None else env
    return [env[name] for name in names if name and env.get(name)]
