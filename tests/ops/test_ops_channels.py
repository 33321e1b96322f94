"""The alert channels as a protocol (ops/tell/channels.py): the registry builds an alerts section's channels, and a
channel of its own, given one registration, gets the cooldown state, the delivery and the watchdog's lines with
no other change."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import ClassVar

import pytest

from bigscience_ops.ops.tell import channels, email, notify, webhook
from bigscience_ops.ops.tell.channels import Outbox
from bigscience_ops.ops.tell.email import EmailChannel
from bigscience_ops.ops.tell.message import ChannelError, Message, NotifyError
from bigscience_ops.ops.tell.webhook import WebhookChannel, WebhookSettings
from bigscience_ops.ops.watch import status, watchdog
from bigscience_ops.schema import AlertsConfig
from tests.fixtures_smtp import SmtpScript, plain_settings
from tests.fixtures_status import seed_job
from tests.hang import ends_within

NOW = datetime(2026, 11, 22, 12, 0, 0)


@dataclass(frozen=True)
class Pager:
    """A channel of the test's own: it keeps what it was sent, or fails while `down` holds True."""

    number: str
    sent: list[Message] = field(default_factory=list, compare=False)
    down: list[bool] = field(default_factory=lambda: [False], compare=False)
    name: ClassVar[str] = "pager"

    @classmethod
    def from_alerts(cls, alerts: AlertsConfig) -> Pager | None:
        return cls("555-0100") if alerts.email_to else None

    @property
    def secret_envs(self) -> tuple[str, ...]:
        return ("BSOPS_TEST_PAGER_PIN",)

    def destination(self) -> str:
        return f"the pager {self.number}"

    def send(self, message: Message, env: Mapping[str, str]) -> None:
        if self.down[0]:
            raise ChannelError(self.name, f"the pager {self.number} did not answer")
        self.sent.append(message)


def test_an_alerts_section_gets_the_registered_channels_in_order() -> None:
    alerts = AlertsConfig(email_to=["oncall@example.org", "lead@example.org"], webhook_url_env="TEAM_HOOK",
                          email_from="bot@example.org")
    outbox = channels.outbox_from_alerts(alerts)
    assert outbox is not None and outbox.names == channels.NAMES == ("email", "webhook")
    assert isinstance(outbox.channels[0], EmailChannel) and isinstance(outbox.channels[1], WebhookChannel)
    assert outbox.sender == "bot@example.org" and outbox.channels[1].settings.url_env == "TEAM_HOOK"
    assert outbox.destinations() == "oncall@example.org, lead@example.org and the webhook in $TEAM_HOOK"
    assert outbox.destinations(["webhook"]) == "the webhook in $TEAM_HOOK"
    assert channels.outbox_from_alerts(AlertsConfig()) is None
    assert channels.send_alert(AlertsConfig(), "s", "b") == "no alert email: alerts.email_to is empty"


def test_one_registration_line_makes_a_channel(monkeypatch) -> None:
    monkeypatch.setattr(channels, "CHANNELS", (*channels.CHANNELS, Pager))
    outbox = channels.outbox_from_alerts(AlertsConfig(email_to=["oncall@example.org"], email_from="bot@example.org"))
    assert outbox is not None and outbox.names == ("email", "pager")
    assert outbox.destinations(["pager"]) == "the pager 555-0100"


def test_a_channel_of_its_own_gets_its_own_cooldown_state_and_watchdog_lines(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BSOPS_TEST_PAGER_PIN", "pin-8231")
    pager = Pager("555-0100")
    outbox = Outbox((pager,), "bot@example.org")
    log = tmp_path / "logs" / "main_log.txt"
    log.parent.mkdir()
    state = log.parent / ".bsops-alerts.json"

    def watch(jobs, minutes: int) -> watchdog.WatchResult:
        settings = watchdog.WatchSettings("tr1-13B-round3", log_path=log, outbox=outbox, cooldown_minutes=60)
        return watchdog.watch(settings, query=lambda **_: jobs, now=NOW + timedelta(minutes=minutes))

    pager.down[0] = True
    failed = watch([], 0)
    assert failed.exit_code == status.EXIT_ERROR and pager.sent == []
    assert "could not be sent to the pager 555-0100" in "\n".join(failed.lines)
    entry = json.loads(state.read_text())["active"]["tr1-13B-round3::not-scheduled"]
    assert entry["sent"] == {} and "did not answer" in entry["failed"]["pager"]
    pager.down[0] = False
    sent = watch([], 5)
    assert sent.exit_code == status.EXIT_ALERT and len(pager.sent) == 1
    assert f"alert email sent to the pager 555-0100 {pager.sent[0].message_id}" in "\n".join(sent.lines)
    assert watch([], 10).exit_code == status.EXIT_ALERT and len(pager.sent) == 1  # within its cooldown
    assert watch([seed_job(start_time=NOW, elapsed_s=60)], 20).exit_code == status.EXIT_HEALTHY
    assert len(pager.sent) == 2 and pager.sent[1].subject.startswith("[RECOVERED]")
    assert json.loads(state.read_text())["active"] == {}
    # Its secret is no message's: the channel's secret_envs are scrubbed like the SMTP password.
    outcome = notify.notify_job(outbox, state, "backup", "mount said pin-8231", experiment="tiny", command="c",
                                now=NOW)
    assert outcome.kind == "alert" and "pin-8231" not in pager.sent[-1].body


def test_an_outbox_names_each_channel_once_and_a_sender_on_one_line() -> None:
    email = EmailChannel(plain_settings(25))
    with pytest.raises(NotifyError, match=r"alert channels: got \['email', 'email'\]"):
        Outbox((email, email), "bot@example.org")
    with pytest.raises(NotifyError, match="alert channels: got \\[\\]"):
        Outbox((), "bot@example.org")
    with pytest.raises(NotifyError, match="smtp.sender"):
        Outbox((email,), "bot@example.org\u2028Bcc: x@example.org")


def test_a_state_file_written_before_the_protocol_keeps_each_channels_keys(tmp_path: Path) -> None:
    """A version-2 state file with the email and webhook keys, as the code before the channel protocol wrote it."""
    stamp = NOW.isoformat()
    state = tmp_path / "alerts.json"
    backup = {"since": stamp, "message": "disk full", "sent": {"email": stamp}, "failed": {"webhook": "HTTP 500"}}
    state.write_text(json.dumps({"version": 2, "finished": {"job-b": {"email": 120, "webhook": 120}},
                                 "jobs": {"backup": backup}, "active": {}}))
    pager = Pager("555-0100")
    outbox = Outbox((pager,), "bot@example.org")
    assert notify.notify_job(outbox, state, "backup", "disk full", experiment="tiny", command="c",
                             now=NOW + timedelta(minutes=1)).kind == "alert"  # the pager never told of it
    saved = json.loads(state.read_text())
    assert saved["jobs"]["backup"]["sent"] == {"email": stamp, "pager": (NOW + timedelta(minutes=1)).isoformat()}
    assert saved["jobs"]["backup"]["failed"] == {"webhook": "HTTP 500"} and saved["finished"]["job-b"]["webhook"] == 120


# --- each channel's send has a total time, not a time per read ----------------------------------------------

def test_an_smtp_server_that_drips_its_banner_fails_the_email_alone_within_its_timeout(scripted_smtp, webhook_server,
                                                                                       cert, monkeypatch) -> None:
    """`220-` continuation lines every DRIP_S (0.1 s) for ever: the email is a failed channel at its timeout, and the
    webhook after it still gets the alert. Without a timeout for the whole exchange the delivery would never end:
    tests/hang.py's deadline fails it then."""
    port = scripted_smtp(SmtpScript(drips={"banner": b"220-still here\r\n"}))
    monkeypatch.setenv("BSOPS_TEST_WEBHOOK", webhook_server.url)
    outbox = Outbox((EmailChannel(plain_settings(port, timeout_s=0.5)),
                     WebhookChannel(WebhookSettings("BSOPS_TEST_WEBHOOK", ca_file=cert[0]))), "bot@example.org")
    failed = ends_within(lambda: outbox.deliver(outbox.compose("[ALERT] tiny: not running", "body")),
                         "a banner dripped for ever, the email's timeout not kept")
    assert set(failed) == {"email"}
    assert len(webhook_server.posts) == 1


def test_an_smtp_server_that_answers_every_command_slowly_is_cut_off_at_the_total(scripted_smtp) -> None:
    """0.4 s before each reply is far within any time per read, but banner to end of data takes 7 of them (2.8 s):
    past the 1 s the whole email may take, so the channel fails then, before the end of the data (with a time per
    read the email would go out, slowly, and no ChannelError would be raised)."""
    script = SmtpScript(pause_s=0.4)
    channel = EmailChannel(plain_settings(scripted_smtp(script), timeout_s=1.0))
    with pytest.raises(ChannelError) as failed:
        channel.send(channels.Outbox((channel,), "bot@example.org").compose("[ALERT] x", "b"), {})
    assert failed.value.channel == "email" and "." not in script.commands
    script.pause_s = 0.0
    channel.send(channels.Outbox((channel,), "bot@example.org").compose("[ALERT] x", "b"), {})  # prompt: it goes
    assert script.commands[-2:] == [".", "QUIT"]


def test_the_channels_an_alerts_section_builds_have_the_modules_total_timeouts() -> None:
    alerts = AlertsConfig(email_to=["oncall@example.org"], webhook_url_env="TEAM_HOOK", email_from="bot@example.org")
    outbox = channels.outbox_from_alerts(alerts)
    assert outbox is not None
    assert [c.settings.timeout_s for c in outbox.channels] == [email.TIMEOUT_S, webhook.TIMEOUT_S] == [30.0, 30.0]


def test_a_message_holds_no_live_link_and_no_raw_control_character_whoever_built_it() -> None:
    """message.compose's net (quoting.defang_block) over a subject and body no quoting reached: schemes and `www.`
    names dead, markdown's `](` broken, every control or separator character a visible escape, a tab and the line
    breaks kept; a text already quoted goes through unchanged."""
    from bigscience_ops.ops.tell.quoting import quote_untrusted

    outbox = Outbox((EmailChannel(plain_settings(25)),), "bot@example.org")
    body = ("see [here](https://evil.example/login)\u2028or www.evil.example\tnow\r\nnext line\x00\n"
            + quote_untrusted("https://evil.example/x") + "\n")
    message = outbox.compose("[bsops] x: HTTPS://evil.example/a\u202e", body)
    assert "://" not in message.subject and "\u202e" not in message.subject and len(message.subject) <= 120
    lines = message.body.split("\n")
    assert lines[0] == ("see [here] (hxxps[:]//evil[.]example/login)\\u2028or www[.]evil[.]example\tnow")
    assert lines[1] == "next line\\x00"
    assert lines[2] == quote_untrusted("https://evil.example/x") == '"hxxps[:]//evil[.]example/x"'
    assert lines[3:] == [""]
    again = outbox.compose(message.subject, message.body)
    assert (again.subject, again.body) == (message.subject, message.body)


def test_the_net_turns_a_dot_or_at_look_alike_into_a_dead_one_before_nfkc_could_make_it_live() -> None:
    """A text no quoting reached: NFKC alone would make `evil．com` `evil.com` and `a＠evil.com` an address; the net
    makes each look-alike `[.]` or `[@]` first (bsops' own words hold none), and running it again changes nothing."""
    from linkify_it import LinkifyIt

    from bigscience_ops.ops.tell.quoting import DOT_LOOKALIKES, defang_block

    body = " ".join(f"evil{dot}com" for dot in DOT_LOOKALIKES) + " a\uff20b.c a\ufe6bb.c node1.example.org\n"
    message = Outbox((EmailChannel(plain_settings(25)),), "bot@example.org").compose("s", body)
    words = message.body.split()
    assert words[:len(DOT_LOOKALIKES)] == ["evil[.]com"] * len(DOT_LOOKALIKES)
    assert words[len(DOT_LOOKALIKES):] == ["a[@]b.c", "a[@]b.c", "node1.example.org"]  # bsops' own words kept
    assert [m.raw for m in LinkifyIt().match(message.body) or []] == ["node1.example.org"]
    assert defang_block(message.body) == message.body


@pytest.mark.parametrize(("value", "limit", "shown"), [
    ("x" * 1000, 50, 50), ("https://a.example/" + "b" * 500, 100, 100), ("short", 200, 5)])
def test_a_quoted_value_is_bounded_and_says_how_long_it_was(value: str, limit: int, shown: int) -> None:
    from bigscience_ops.ops.tell.quoting import quote_untrusted

    quoted = quote_untrusted(value, limit)
    inside, _, rest = quoted[1:].partition('"')
    assert len(inside) <= shown + 8  # the defanging's [:] and [.] at most
    assert (str(len(value)) in rest) == (len(value) > limit)


def test_a_quoted_value_cannot_forge_an_escape_or_its_end() -> None:
    from bigscience_ops.ops.tell.quoting import quote_untrusted

    assert quote_untrusted('a\\u2028" fake end \u2028') == '"a\\\\u2028\\" fake end \\u2028"'
    assert quote_untrusted("r7i4n[1-7] <redacted>", mark=False) == "r7i4n[1-7] <redacted>"
    assert quote_untrusted("r7i4n[1-7]") == '"r7i4n⟦1-7⟧"'


def test_the_webhook_url_is_a_secret_no_message_carries(monkeypatch) -> None:
    """A job error that quotes the webhook URL (a failed curl, a config dump) reaches neither the email nor the
    webhook's own post: the URL's variable is a secret of the outbox, scrubbed like the SMTP password."""
    url = "https://hooks.example.org/services/T0001/B0002/abcdefSECRET"
    monkeypatch.setenv("BSOPS_TEST_HOOK", url)
    hook = WebhookChannel(WebhookSettings("BSOPS_TEST_HOOK"))
    assert hook.secret_envs == ("BSOPS_TEST_HOOK",)
    outbox = Outbox((EmailChannel(plain_settings(25)), hook), "bot@example.org")
    message = outbox.compose("backup failed", f"curl: (22) {url} returned 500", now=NOW)
    assert url not in message.subject + message.body and "abcdefSECRET" not in message.body
    assert "curl: (22)" in message.body
