"""redact.scrub: what a credential looks like is removed, the rest of the text stays as it was."""

from __future__ import annotations

import pytest

from bigscience_ops.redact import REDACTED, env_secrets, has_credentials, scrub

TOKEN = "hf_" + "aB3dE6" * 6

# text -> the scrubbed text
CASES = {
    f"https://bot:{TOKEN}@huggingface.co/x": f"https://{REDACTED}@huggingface.co/x",
    "https://ghp_abcdefghijklmnopqrstuv@github.com/x": f"https://{REDACTED}@github.com/x",
    "HTTPS://user@hub.example/x": f"HTTPS://{REDACTED}@hub.example/x",
    "ssh://git@hub.example/x": "ssh://git@hub.example/x",  # a user name, no secret
    "ssh://git:pw@hub.example/x": f"ssh://{REDACTED}@hub.example/x",
    "fetch https://h/x?access_token=abc123&ref=main": f"fetch https://h/x?access_token={REDACTED}&ref=main",
    "https://h/x?X-Amz-Signature=deadbeef": f"https://h/x?X-Amz-Signature={REDACTED}",
    "> Authorization: Basic Ym90OnNlY3JldA==\n< HTTP/1.1 401": f"> Authorization: {REDACTED}\n< HTTP/1.1 401",
    "header authorization=Bearer abc.def.ghi sent": f"header authorization={REDACTED} sent",
    "protocol=https\nhost=h\npassword=sekrit\n": f"protocol=https\nhost=h\npassword={REDACTED}\n",
    f"denied for {TOKEN}.": f"denied for {REDACTED}.",
    "api_org_0123456789abcdef here": f"{REDACTED} here",
    "git push origin main: rejected (non-fast-forward)": "git push origin main: rejected (non-fast-forward)",
    "/runs/tr1/hub/logs: 3 file(s)": "/runs/tr1/hub/logs: 3 file(s)",
}


@pytest.mark.parametrize("text", CASES)
def test_scrub_removes_credentials_and_keeps_the_rest(text: str) -> None:
    assert scrub(text) == CASES[text]
    assert has_credentials(text) is (CASES[text] != text)


def test_known_secrets_are_removed_wherever_they_are_and_short_ones_left() -> None:
    assert scrub("pw is Pa55-word! and Pa55-word", ["Pa55-word", None, "ab"]) == f"pw is {REDACTED}! and {REDACTED}"
    assert scrub("abc def", ["abc"]) == "abc def"  # too short to be a secret worth garbling the text for
    assert env_secrets(["A", "B", None, "C"], {"A": "x1", "C": ""}) == ["x1"]
