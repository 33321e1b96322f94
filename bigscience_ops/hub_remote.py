"""The git remotes Hub sync may push to, and the one host the Hub token is offered to.

A remote comes from untrusted places (an inherited `hub.remote_template`, `--remote`, an old
clone's config), so it is checked before git sees it: https://, ssh:// (or scp-like
`user@host:path`), file:// or an absolute path; never plain http (the data would travel in the
clear), git://, or git's `ext::`/`fd::` transports (`ext::` runs a command); no credential inside
the URL (user-info with a password, or any user-info over https, or a query: the token belongs in
the environment variable `hub.token_env` names); no control character, space or leading `-`. Errors
name the field and show the URL scrubbed.

`hub.host` is where the token goes: the Hub's endpoint is https://<host>, and git's credential
helper answers for that host over https only (gitlfs.py).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from bigscience_ops.errors import ConfigError
from bigscience_ops.redact import has_credentials, scrub
from bigscience_ops.schema import HubConfig

DEFAULT_HOST = "huggingface.co"
# A lower-case DNS name or IPv4 address, and an optional port: what git hands its credential helper as host=.
_HOST = re.compile(r"(?=.{1,253}(?::|$))[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*"
                   r"(?::(?:6553[0-5]|655[0-2]\d|65[0-4]\d\d|6[0-4]\d{3}|[1-5]\d{4}|[1-9]\d{0,3}))?")
_SCP_LIKE = re.compile(r"(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9.-]+:(?!//)[^\s]+")
SCHEMES = ("https", "ssh", "file")
ALLOWED = ("allowed: an https://, ssh:// or file:// git URL (or user@host:path, or an absolute path) with no "
           "credential in it: the token is read from the environment variable hub.token_env names")
TEMPLATE_ALLOWED = "a git URL with {repo} exactly once, e.g. https://huggingface.co/{repo} or file:///srv/mirror/{repo}.git"
HOST_ALLOWED = ("allowed: a lower-case host name and an optional port, such as huggingface.co or "
                "hub.example.org:8443 (the Hub token goes only there, over https)")


def remote_problem(url: str) -> str | None:
    """What is wrong with `url` as a remote to push to, or None when it is usable."""
    if not url:
        return "an empty remote"
    if any(not c.isprintable() or c.isspace() for c in url):
        return "a control character, line break or space"
    if url.startswith("-"):
        return "a leading '-' (git would read it as an option)"
    if has_credentials(url):
        return "a credential inside the URL (a user-info password or token, a token in the query)"
    transport = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)::", url)
    if transport:
        return f"git's {transport.group(1)}:: transport, which runs a command or helper instead of fetching a URL"
    if url.startswith("/"):
        return None
    if "://" not in url:
        return None if _SCP_LIKE.fullmatch(url) else "neither a URL nor an absolute path"
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        plain = " (plain http sends everything in the clear; use https://)" if scheme == "http" else ""
        return f"the scheme {scheme}://{plain}"
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return "a ?query or #fragment (a place for credentials, never part of a git remote)"
    if scheme != "file" and not parts.hostname:
        return "no host"
    if (parts.hostname or "").startswith("-"):
        return "a host starting with '-' (ssh would read it as an option)"
    return None


def check_remote(url: str, field: str, source: str = "hub") -> None:
    """Raise ConfigError naming `field` (its value scrubbed) when `url` is not a remote to push to."""
    problem = remote_problem(url)
    if problem is not None:
        raise ConfigError(source, field, scrub(url), f"it holds {problem}; {ALLOWED}")


def check_template(template: str | None, source: str) -> None:
    """hub.remote_template: {repo} exactly once, and a remote check_remote accepts once it is filled in."""
    if template is None:
        return
    if template.count("{repo}") != 1 or "{" in template.replace("{repo}", ""):
        raise ConfigError(source, "hub.remote_template", scrub(template), TEMPLATE_ALLOWED)
    check_remote(template.replace("{repo}", "org/name"), "hub.remote_template", source)


def check_host(host: str, source: str) -> None:
    if not _HOST.fullmatch(host):
        raise ConfigError(source, "hub.host", scrub(host), HOST_ALLOWED)


def check_hub(hub: HubConfig, source: str) -> None:
    """The hub section's host and remote template (hub.token_env is an environment variable's name: the schema's)."""
    check_host(hub.host, source)
    check_template(hub.remote_template, source)


def endpoint(host: str) -> str:
    """The Hub's base URL for hub.host."""
    return f"https://{host}"


def offers_token(url: str, host: str) -> bool:
    """Whether git's credential helper hands the token to `url`: https on exactly hub.host."""
    parts = urlsplit(url)
    return parts.scheme.lower() == "https" and parts.netloc.lower() == host
