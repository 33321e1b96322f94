"""hub_remote: the remotes and hosts Hub sync accepts (the refused ones are rows of test_ops_hub_hostile.py)."""

from __future__ import annotations

import pytest

from bigscience_ops.errors import ConfigError
from bigscience_ops.hub_remote import check_host, check_template, offers_token, remote_problem

GOOD = ["https://huggingface.co/{repo}", "https://hub.example.org:8443/{repo}.git", "ssh://git@hub.example/{repo}.git",
        "git@hub.example:{repo}.git", "file:///srv/mirror/{repo}.git", "/srv/mirror/{repo}.git"]


@pytest.mark.parametrize("template", GOOD)
def test_usual_remotes_are_accepted(template: str) -> None:
    check_template(template, "exp.yaml")
    assert remote_problem(template.replace("{repo}", "bs/tiny-logs")) is None


def test_the_token_is_offered_to_https_on_the_hub_host_only() -> None:
    check_host("huggingface.co", "x")
    check_host("127.0.0.1:8443", "x")
    for bad in ("HuggingFace.co", "huggingface.co:99999", "", "-x.example"):
        with pytest.raises(ConfigError):
            check_host(bad, "x")
    assert offers_token("https://huggingface.co/bs/x", "huggingface.co")
    assert not offers_token("http://huggingface.co/bs/x", "huggingface.co")
    assert not offers_token("https://huggingface.co.evil.org/bs/x", "huggingface.co")
    assert not offers_token("https://huggingface.co:8443/bs/x", "huggingface.co")
