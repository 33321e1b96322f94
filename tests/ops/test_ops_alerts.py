"""The alerts' vocabulary (ops/alerts.py): a new kind is a registration and a raise, mailed by the real path to a
real SMTP server; the registry refuses what would break a cooldown key; every kind the code raises is registered;
the hourly jobs' run_alerting; and no two folders of ops/ import each other."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bigscience_ops.config.loading import load_experiment
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops import alerts
from bigscience_ops.ops.alerts import DEFAULT_CONTACT, EXIT_ALERT, Condition, StatusReport, raise_alert
from bigscience_ops.ops.tell import notify
from bigscience_ops.ops.tell.job_alerts import Teller, run_alerting
from bigscience_ops.ops.tell.quoting import quote_untrusted
from bigscience_ops.ops.watch import status
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_smtp import T0, alerts_yaml, plain_outbox
from tests.fixtures_status import seed_job

OPS = Path(__file__).resolve().parents[2] / "bigscience_ops" / "ops"

# --- the worked example of docs/ARCHITECTURE.md: a new kind of alert, in two places ---------------------------------

# 1. Its words, once: a registration (in ops/alerts.py, or beside the check that raises it).
SCRATCH_FULL = Condition(
    "scratch-full",
    headline="free scratch space: {percent}% full",
    advice="Scratch is almost full and the next save will fail: delete checkpoints that have a verified backup, "
           "or move them off, then check `bsops status EXP`.",
    says="{job} saves into {folder}, which is {percent}% full",
)


# 2. Where it is detected: raise it from the registry and add it to the watchdog's report.
def with_scratch_alert(report: StatusReport, folder: Path, percent: int, contact: str = DEFAULT_CONTACT) -> StatusReport:
    if percent < 95:
        return report
    where = quote_untrusted(str(folder), 400, mark=False)  # a folder's name is the run's: never a link
    return report.adding([raise_alert("scratch-full", contact=contact, job=report.job_name, folder=where,
                                      percent=percent)])


@pytest.fixture
def scratch_full() -> Iterator[Condition]:
    """SCRATCH_FULL registered for one test (the registry is the process's)."""
    yield alerts.register(SCRATCH_FULL)
    del alerts.CONDITIONS[SCRATCH_FULL.kind]


def test_a_new_alert_kind_is_mailed_cooled_down_and_recovered(scratch_full, plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    outbox, state = plain_outbox(port), tmp_path / "alerts.json"
    folder = tmp_path / 'scratch <a href="http://evil.example/x">'
    job = [seed_job(start_time=T0 - timedelta(hours=1), elapsed_s=3600)]

    def check(minutes: int, percent: int) -> list[notify.Notice]:
        now = T0 + timedelta(minutes=minutes)
        report = with_scratch_alert(status.evaluate("tr1-13B-round3", job, now=now), folder, percent)
        assert report.exit_code == (EXIT_ALERT if percent >= 95 else status.EXIT_HEALTHY)
        return notify.notify(report, outbox, state, experiment="tr1-13B", cooldown_minutes=60, now=now)

    first = check(0, 97)
    assert [(n.kind, n.conditions) for n in first] == [("alert", ("scratch-full",))]
    mail = inbox.messages[0]
    body = mail.get_content()
    assert mail["Subject"] == "[ALERT] tr1-13B: free scratch space: 97% full"
    assert "***ALERT: tr1-13B-round3 saves into " in body and "which is 97% full! Alert someone at the on-call" in body
    assert "- Scratch is almost full and the next save will fail" in body and "`bsops status tr1-13B`" in body
    assert "http://" not in body and "evil.example" not in body  # the folder's name, defanged
    assert check(30, 98) == [] and len(inbox.messages) == 1  # within the cooldown: the same key, held back
    assert [n.kind for n in check(45, 50)] == ["recovery"]
    assert inbox.messages[1]["Subject"] == "[RECOVERED] tr1-13B: scratch-full cleared"


# --- the registry -------------------------------------------------------------------------------------------------

def test_the_registry_refuses_a_kind_twice_and_a_key_with_a_colon(scratch_full) -> None:
    with pytest.raises(ValueError, match="'scratch-full' is registered already"):
        alerts.register(SCRATCH_FULL)
    with pytest.raises(ValueError, match="'disk:full'.*no colon"):
        alerts.register(Condition("disk:full", "h", "a", "s"))
    assert "disk:full" not in alerts.CONDITIONS


def test_an_unknown_kind_or_a_missing_fact_or_subject_names_what_is_allowed() -> None:
    with pytest.raises(alerts.UnknownCondition, match="'stalld' is not registered; registered: .*stalled"):
        raise_alert("stalld", job="j")
    with pytest.raises(ValueError, match="no fact 'ids'"):
        raise_alert("never-starts", job="j")
    with pytest.raises(ValueError, match="eval-drop: subject None; allowed: one metric"):
        raise_alert("eval-drop", finding="f")
    with pytest.raises(ValueError, match="stalled: subject 'x'; allowed: none"):
        raise_alert("stalled", subject="x", job="j", what="w", span="1 h", limit=5)


def test_a_parametrised_kind_keys_its_cooldown_per_subject_and_keeps_its_words() -> None:
    one = raise_alert("eval-drop", subject="lambada/acc", finding="lambada/acc 0.1 at step 3")
    other = raise_alert("eval-drop", subject="piqa/acc", finding="piqa/acc 0.2 at step 3")
    assert (one.condition, other.condition, one.kind) == ("eval-drop:lambada/acc", "eval-drop:piqa/acc", "eval-drop")
    assert one.headline == other.headline == alerts.CONDITIONS["eval-drop"].headline
    assert one.message == ("***ALERT: evaluation: lambada/acc 0.1 at step 3! Alert someone at "
                           f"{DEFAULT_CONTACT}***")


def test_every_kind_raised_is_registered_and_every_registered_kind_is_raised() -> None:
    """Each `raise_alert("kind", ...)` (or status.evaluate's `alert("kind", ...)`) with a literal kind names a
    registered condition (a typo fails here, not in an hourly run), and each registered kind is named by the code that
    raises it (a literal outside alerts.py, a run file's kind, a health finding's `health-<kind>`): no dead words."""
    from bigscience_ops.ops import health
    from bigscience_ops.ops.watch import watchdog

    raised, named = set(), set()
    for path in OPS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            called = getattr(node, "func", None)
            if isinstance(node, ast.Call) and getattr(called, "id", getattr(called, "attr", "")) in ("raise_alert", "alert") \
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                raised.add(node.args[0].value)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and path.name != "alerts.py":
                named.add(node.value)
    assert len(raised) > 8 and raised <= set(alerts.CONDITIONS), raised - set(alerts.CONDITIONS)
    named |= {f"health-{kind}" for kind in (*health.ROLLBACK_KINDS, "slow")} | set(watchdog.RUN_FILES.values())
    assert set(alerts.CONDITIONS) <= raised | named, set(alerts.CONDITIONS) - raised - named


# --- the hourly jobs' failures: run_alerting --------------------------------------------------------------------

def _teller(exp) -> Teller:
    return Teller(exp.name, exp.alerts, exp.paths.logs, (exp.hub.token_env, exp.alerts.smtp_password_env))


@pytest.fixture
def mailing_exp(trainings: Path, tmp_path: Path, plain_server):
    inbox, port = plain_server
    (trainings / "kept.yaml").write_text(tiny_yaml(tmp_path / "run", alerts_yaml(port, cooldown_minutes=60)))
    return load_experiment("kept", trainings), inbox


def test_run_alerting_mails_a_failure_and_its_recovery(mailing_exp, monkeypatch) -> None:
    exp, inbox = mailing_exp
    monkeypatch.setenv(exp.hub.token_env, "hf_secret_token_123")

    def failing() -> None:
        raise BsopsError("git push refused with hf_secret_token_123")

    failed = run_alerting(_teller(exp), True, "hub-sync", "bsops hub-sync kept", failing)
    assert failed.failed and failed.told and "hf_secret_token_123" not in failed.error
    assert failed.lines[0] == f"error: {failed.error}" and failed.lines[1].startswith("alert email sent to")
    mail = inbox.messages[0]
    assert mail["Subject"] == "[bsops] kept: hub-sync failed"
    assert "run `bsops hub-sync kept` by hand" in mail.get_content() and "hf_secret" not in mail.get_content()
    worked = run_alerting(_teller(exp), True, "hub-sync", "bsops hub-sync kept", lambda: None)
    assert not worked.failed and worked.error is None and worked.lines[0].startswith("recovery email sent to")
    assert inbox.messages[1]["Subject"] == "[RECOVERED] kept: hub-sync works again"


def test_run_alerting_without_alert_only_says_the_error(mailing_exp) -> None:
    exp, inbox = mailing_exp

    def failing() -> None:
        raise OSError(28, "No space left on device")

    outcome = run_alerting(_teller(exp), False, "backup", "bsops backup kept", failing)
    assert outcome.failed and outcome.lines == (f"error: {outcome.error}",) and "No space left" in outcome.error
    assert inbox.messages == []


def test_run_alerting_fails_when_the_alert_cannot_be_sent(trainings: Path, tmp_path: Path) -> None:
    from bigscience_ops.launch.local import free_port

    (trainings / "dark.yaml").write_text(tiny_yaml(tmp_path / "run", alerts_yaml(free_port())))  # nobody listens
    exp = load_experiment("dark", trainings)

    def failing() -> None:
        raise BsopsError("backup store unreachable")

    outcome = run_alerting(_teller(exp), True, "backup", "bsops backup dark", failing)
    assert outcome.failed and not outcome.told
    assert outcome.lines[-1].startswith("***ALERT: the backup alert email could not be sent (the next run tries again)")


# --- no folder of ops/ imports another that imports it back -------------------------------------------------------

def _ops_unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["bigscience_ops", "ops"] or len(parts) < 3:
        return None
    return parts[2] if (OPS / parts[2]).is_dir() or (OPS / f"{parts[2]}.py").is_file() else None


def ops_edges(root: Path = OPS) -> dict[tuple[str, str], str]:
    """(importer, imported) -> where, for the folders and top-level modules of ops/ (every import: inside
    functions and TYPE_CHECKING blocks too)."""
    edges: dict[tuple[str, str], str] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        unit = rel.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                other = _ops_unit(name)
                if other is not None and other != unit and unit != "__init__":
                    edges.setdefault((unit, other), f"{rel}:{node.lineno}")
    return edges


def test_no_two_folders_of_ops_import_each_other() -> None:
    edges = ops_edges()
    both = [f"{a} <-> {b} ({edges[a, b]}, {edges[b, a]})" for a, b in edges if (b, a) in edges and a < b]
    assert ("watch", "alerts") in edges and ("tell", "alerts") in edges  # the checker sees imports at all
    assert not any(a == "alerts" for a, _ in edges), "alerts.py stands below every folder of ops/"
    assert both == []
