"""Training health from the log: each signal found at its iteration, and a normal run's noise quiet.

Logs are written with the trainer's own line writer (iteration_log.iteration_line) and the markers it
prints between iteration lines; the real-run checks (a clean run and an injected fault) are with the
trainer runs.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

from pathlib import Path

import pytest

from bigscience_ops.run.iterations import IterationStats, iteration_line
from bigscience_ops.ops import health
from bigscience_ops.schema import HealthConfig
from tests.fixtures_runs import commit_checkpoint

Tweak = Callable[[int, IterationStats], None]
FLOPS_PER_TOKEN, GPUS = 2e9, 8


def _tflops(s: IterationStats, gpus: int = GPUS) -> float:
    """TFLOPs per GPU as the trainer logs them: from the line's own throughput (trainer/metrics.py)."""
    return s.samples_per_second * (s.curriculum_seqlen or 128) * FLOPS_PER_TOKEN / gpus / 1e12


def _log(n: int = 300, *, seed: int = 0, tweak: Tweak | None = None, fp16: bool = False, rampup: bool = True,
         curriculum: bool = True, resume_at: int | None = 150, resume_gpus: int = GPUS) -> list[str]:
    """A normal run's log: LR warmup's fast fall, then noise; rampup; curriculum steps; saves every 50
    lines (slow); evaluations every 100; fp16's initial loss-scale search and an isolated overflow; a
    resume that logs again from its checkpoint on other nodes (another speed; `resume_gpus` of them)."""
    rng = random.Random(seed)
    lines = ["task 1_1 begins at iteration 0"]
    scale = 2.0**32 if fp16 else 1.0
    it, gpus = 0, GPUS
    while it < n:
        it += 1
        if resume_at and it == resume_at + 1 and "task 1_2" not in "".join(lines):
            lines += ["task 1_2 begins at iteration 140", "> resumed from /ckpt/global_step140"]
            it, gpus = 141, resume_gpus
        gbs = (16 if it < 40 else 32 if it < 80 else 64) if rampup else 64
        seqlen = (64 if it < 60 else 128) if curriculum else None
        loss = 3.0 + 7.0 * math.exp(-it / 15) + rng.gauss(0, 0.05) + (0.3 if seqlen == 128 else 0)
        skipped = 0
        if fp16 and it <= 2:  # the initial search: 2^32 -> 2^16 over the first lines
            scale, skipped = scale / 256, 8
        elif fp16 and it == 200:  # an isolated overflow
            scale, skipped = scale / 2, 1
        speed = gbs * (12.0 if it > 140 else 10.0) * rng.uniform(0.9, 1.1) * gpus / GPUS
        if it % 50 == 0:
            lines.append(f"  successfully saved checkpoint at iteration {it} to /ckpt (3000.0 ms)")
            speed *= 0.2
        if it % 100 == 0:
            lines.append(f" validation loss at iteration {it} | lm loss value: {loss:.6E} |")
        stats = IterationStats(it, n, it * gbs, it * gbs * 128, 1000 * gbs / speed, 1e-4, gbs, loss, scale,
                               abs(rng.gauss(1.0, 0.2)) + 5 * math.exp(-it / 10), 100.0, skipped, 0, speed, 1.0,
                               curriculum_seqlen=seqlen)
        if tweak:
            tweak(it, stats)
        stats.tflops = _tflops(stats, gpus)
        lines.append(iteration_line(stats))
    return lines


def _found(lines: list[str], **settings) -> list[health.Finding]:
    return health.check(health.entries(lines), HealthConfig(**settings))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fp16", [False, True])
def test_a_normal_run_raises_nothing(seed, fp16):
    assert _found(_log(seed=seed, fp16=fp16)) == []


def test_nan_loss_and_nan_iterations():
    def tweak(it, s):
        if it == 230:
            s.lm_loss, s.nan = float("nan"), 1
    [finding] = _found(_log(tweak=tweak))
    assert (finding.kind, finding.iteration) == ("nan", 230) and "nan" in finding.message
    assert "roll back" in finding.next_step


def test_a_loss_spike_names_its_iteration_and_values():
    def tweak(it, s):
        if it == 240:
            s.lm_loss *= 2.5
    [finding] = _found(_log(tweak=tweak))
    assert (finding.kind, finding.iteration) == ("loss-spike", 240)
    assert "median" in finding.message and "bsops rollback" in finding.next_step


def test_a_small_bump_is_noise():
    def tweak(it, s):
        if it == 240:
            s.lm_loss *= 1.05
    assert _found(_log(tweak=tweak)) == []


def test_grad_norm_explosion():
    def tweak(it, s):
        if it == 260:
            s.grad_norm = 19767.052
    [finding] = _found(_log(tweak=tweak))
    assert (finding.kind, finding.iteration) == ("grad-norm", 260) and "19767" in finding.message


def test_fp16_loss_scale_collapse_and_skipped_iterations():
    def tweak(it, s):
        if it >= 250:  # overflows every step from here: the scale halves and halves
            s.loss_scale, s.skipped = 2.0**16 / 2 ** (3 * (it - 249)), 3
    kinds = {f.kind: f for f in _found(_log(fp16=True, tweak=tweak))}
    assert set(kinds) == {"loss-scale", "skipped"}
    assert kinds["skipped"].iteration == 300 and kinds["loss-scale"].iteration >= 253


@pytest.mark.parametrize("lines, expected", [(3, ["slow"]), (2, [])])
def test_throughput_well_below_the_median_for_several_lines(lines, expected):
    def tweak(it, s):
        if 270 <= it < 270 + lines:
            s.samples_per_second *= 0.3
    assert [f.kind for f in _found(_log(tweak=tweak))] == expected


def _resumed(change: Tweak) -> Tweak:
    """`change` applied to the lines the resumed task logs (from iteration 141 again), not the first task's."""
    seen: set[int] = set()

    def tweak(it, s):
        if it in seen or it > 150:
            change(it, s)
        seen.add(it)
    return tweak


def test_a_task_that_lands_on_a_bad_node_is_slow_against_the_tasks_before_it():
    """Slow from its first line: its own lines were never a fair median (the old window compared a task
    with itself); the run's earlier lines of the same batch size on as many GPUs are."""
    def slow(it, s):
        s.samples_per_second *= 0.3
    found = health.check(health.entries(_log(tweak=_resumed(slow))), every=True)
    assert {f.kind for f in found} == {"slow"}
    first = 141 + health.TASK_WARMUP_LINES + HealthConfig().slow_lines - 1  # start-up lines are not judged
    assert found[0].iteration == first and "of the run's median" in found[0].message


def test_a_node_phase_on_fewer_gpus_is_not_slow():
    """Half the GPUs, half the samples/s at the same batch size: as many TFLOPs per GPU, another configuration."""
    assert _found(_log(resume_gpus=4)) == []
    assert _found(_log(resume_gpus=16, seed=3)) == []


@pytest.mark.parametrize("kind, change", [
    ("loss-spike", lambda s: setattr(s, "lm_loss", s.lm_loss * 2.5)),
    ("grad-norm", lambda s: setattr(s, "grad_norm", 19767.052)),
])
def test_a_resume_keeps_the_window_so_its_first_lines_are_checked(kind, change):
    """The resumed task trains on from its checkpoint at the same batch size: the lines before it are
    its history, so a spike in its third line is found (the window used to restart, blind for min_window lines)."""
    found = _found(_log(tweak=_resumed(lambda it, s: change(s) if it == 143 else None)))
    assert [(f.kind, f.iteration) for f in found] == [(kind, 143)]
    # Lines the first task logged after the checkpoint the second resumed from are not history.
    log = health.entries(_log())
    resumed = next(i for i, e in enumerate(log) if e.task_start and e.stats.iteration == 141)
    carried = health._carried([e.stats for e in log[:resumed]], log[resumed], 50)
    assert carried[-1].iteration == 140 and len(carried) == 50


def test_the_next_step_names_the_experiment_checkpoint_and_skip_range(tmp_path):
    import json

    for step in (100, 200, 240):
        (tmp_path / f"global_step{step}").mkdir()
        (tmp_path / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
        commit_checkpoint(tmp_path / f"global_step{step}")
    (tmp_path / "latest").write_text("global_step240")
    spike = health.Finding("loss-spike", 240, "lm loss 9", "generic", "read the samples: loss spike at iteration 240")
    exact = health.advise(spike, "tr1 13B", tmp_path)
    # The checkpoint saved at 240 already holds that iteration's update: the target is the one before.
    assert "`bsops samples 'tr1 13B' --iteration 240`" in exact.next_step
    assert "`bsops rollback 'tr1 13B' --step 200 --skip 201-240`" in exact.next_step
    assert exact.headline == "read iteration 240's samples, roll back to 200, skip 201-240 if it stays: loss spike"
    nan = health.advise(dataclasses.replace(spike, kind="nan", iteration=150, headline="roll back: NaN loss at "
                                            "iteration 150"), "tr1-13B", tmp_path)
    assert nan.headline == "roll back to 100, skip 101-150: NaN loss at iteration 150"
    assert "`bsops rollback tr1-13B --step 100 --skip 101-150`" in nan.next_step
    early = health.advise(dataclasses.replace(nan, iteration=90), "tr1-13B", tmp_path)
    assert "no complete checkpoint before iteration 90" in early.next_step and "--step" not in early.next_step
    slow = health.Finding("slow", 240, "slow", "exclude it", "find and exclude the slow node: 30% at iteration 240")
    assert health.advise(slow, "tr1-13B", tmp_path) == slow


def test_only_the_recent_lines_are_reported():
    def tweak(it, s):
        if it == 240:
            s.lm_loss *= 2.5
    log = health.entries(_log(tweak=tweak))
    assert health.check(log, recent=20) == [] and [f.iteration for f in health.check(log, recent=80)] == [240]


def test_settings_change_what_is_a_spike():
    def tweak(it, s):
        if it == 240:
            s.lm_loss *= 1.4
    assert [f.kind for f in _found(_log(tweak=tweak))] == ["loss-spike"]
    assert _found(_log(tweak=tweak), spike_ratio=1.5) == []


# --------------------------------------------------------------------------- in the watchdog

def test_the_watchdog_alerts_a_spike_once_and_mails_the_recovery(tmp_path, plain_server):
    from datetime import datetime, timedelta

    from bigscience_ops.ops.watch import status, watchdog
    from tests.fixtures_smtp import plain_outbox
    from tests.fixtures_status import seed_job

    inbox, port = plain_server
    now = datetime(2026, 11, 22, 12, 0, 0)
    running = seed_job(start_time=now - timedelta(hours=2), elapsed_s=7200)
    log = tmp_path / "logs" / "main_log.txt"
    log.parent.mkdir()

    def tweak(it, s):
        if it == 280:
            s.lm_loss *= 2.5
    log.write_text("\n".join(_log(tweak=tweak)) + "\n")

    def watch(at: datetime) -> watchdog.WatchResult:
        settings = watchdog.WatchSettings("tr1-13B-round3", log_path=log, outbox=plain_outbox(port),
                                          cooldown_minutes=60, health=HealthConfig(recent=30))
        return watchdog.watch(settings, query=lambda **_: [running], now=at)

    first = watch(now)
    [alert] = first.report.alerts
    assert alert.condition == "health-loss-spike" and "iteration 280" in alert.message
    assert first.exit_code == status.EXIT_ALERT and any("training health" in line for line in first.lines)
    assert watch(now + timedelta(minutes=10)).exit_code == status.EXIT_ALERT  # within the cooldown: no second mail
    assert len(inbox.messages) == 1 and "iteration 280" in inbox.messages[0].get_content()
    # 40 more normal lines: the spike is no longer among the recent ones.
    more = [iteration_line(IterationStats(it, 400, 0, 0, 100.0, 1e-4, 64, 3.3 + 0.01 * (it % 3), 1.0, 1.0, 1.0, 0, 0,
                                          640.0, 1.0, curriculum_seqlen=128)) for it in range(301, 341)]
    with open(log, "a") as handle:
        handle.write("\n".join(more) + "\n")
    recovered = watch(now + timedelta(minutes=70))
    assert recovered.exit_code == status.EXIT_HEALTHY and len(inbox.messages) == 2
    assert "recover" in inbox.messages[1]["Subject"].lower()


def test_the_alert_for_an_experiments_spike_says_the_exact_commands(tmp_path, trainings, plain_server):
    import json
    from datetime import datetime, timedelta

    from bigscience_ops.config.loading import load_experiment
    from bigscience_ops.ops.watch import lifecycle, watchdog
    from tests.fixtures_experiments import tiny_yaml
    from tests.fixtures_smtp import plain_outbox
    from tests.fixtures_status import seed_job

    inbox, port = plain_server
    (trainings / "spiky.yaml").write_text(tiny_yaml(tmp_path / "run"))
    exp = load_experiment("spiky", trainings)
    checkpoints, log = Path(exp.paths.checkpoints), Path(exp.paths.logs) / "main_log.txt"
    for step in (200, 250):
        (checkpoints / f"global_step{step}").mkdir(parents=True)
        (checkpoints / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
        commit_checkpoint(checkpoints / f"global_step{step}")
    (checkpoints / "latest").write_text("global_step250")
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(_log(tweak=lambda it, s: setattr(s, "lm_loss", s.lm_loss * 2.5) if it == 280 else None))
                   + "\n")
    now = datetime(2026, 11, 22, 12, 0, 0)
    running = seed_job(name=exp.slurm.job_name, start_time=now - timedelta(hours=2), elapsed_s=7200)
    settings = watchdog.WatchSettings(exp.slurm.job_name, log_path=log, outbox=plain_outbox(port), experiment=exp.name,
                                      health=HealthConfig(recent=30))
    result = watchdog.watch(settings, query=lambda **_: [running], now=now, run=lifecycle.run_state(exp))
    [alert] = result.report.alerts
    [mail] = inbox.messages
    assert mail["Subject"] == ("[ALERT] spiky: read iteration 280's samples, roll back to 250, skip 251-280 if it "
                               "stays: loss spike")
    todo = mail.get_content().replace("\r\n", "\n").split("What to do:\n", 1)[1]
    assert "`bsops samples spiky --iteration 280`" in todo and "`bsops rollback spiky --step 250 --skip 251-280`" in todo
    assert "EXP" not in todo and "STEP" not in todo and "A-B" not in todo
    assert "bsops rollback spiky --step 250" in alert.message  # `bsops status` prints it too


def test_the_watchdog_skips_health_when_switched_off(tmp_path):
    from datetime import datetime

    from bigscience_ops.ops.watch import watchdog
    from tests.fixtures_status import seed_job

    log = tmp_path / "main_log.txt"
    log.write_text("\n".join(_log(tweak=lambda it, s: setattr(s, "nan", 1) if it == 290 else None)) + "\n")
    running = seed_job()

    def conditions(settings):
        result = watchdog.watch(watchdog.WatchSettings("tr1-13B-round3", log_path=log, health=settings),
                                query=lambda **_: [running], now=datetime(2026, 1, 1))
        return [a.condition for a in result.report.alerts]
    assert conditions(HealthConfig()) == ["health-nan"]
    assert conditions(HealthConfig(enabled=False)) == [] and conditions(None) == []


def test_an_eval_metric_that_falls_is_an_alert_with_the_rollback_and_a_bad_result_file_is_named(
        tmp_path, trainings, plain_server):
    import json
    from datetime import datetime, timedelta

    from bigscience_ops.config.loading import load_experiment
    from bigscience_ops.ops.watch import lifecycle, status, watchdog
    from tests.fixtures_experiments import tiny_yaml
    from tests.fixtures_smtp import plain_outbox
    from tests.fixtures_status import seed_job
    from tests.evaluate.test_ops_evaluate_results import write_results

    inbox, port = plain_server
    (trainings / "evals.yaml").write_text(tiny_yaml(tmp_path / "run"))
    exp = load_experiment("evals", trainings)
    exp = dataclasses.replace(exp, eval=dataclasses.replace(exp.eval, alert_drop={"smoke_choice/acc": 0.05,
                                                                                  "cc/bits_per_byte": 0.5}))
    checkpoints, output = Path(exp.paths.checkpoints), Path(exp.paths.output)
    log = Path(exp.paths.logs) / "main_log.txt"
    for step in (100, 200, 300):
        (checkpoints / f"global_step{step}").mkdir(parents=True)
        (checkpoints / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
        commit_checkpoint(checkpoints / f"global_step{step}")
    (checkpoints / "latest").write_text("global_step300")
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(_log()) + "\n")
    write_results(output, {100: {"smoke_choice/acc": 0.40}, 200: {"smoke_choice/acc": 0.50},
                           300: {"smoke_choice/acc": 0.42}}, bpb={s: {"cc": 1.5} for s in (100, 200, 300)})
    (output / "eval" / "global_step250.json").write_text('{"results": {"x": ')  # torn
    now = datetime(2026, 11, 22, 12, 0, 0)
    running = seed_job(name=exp.slurm.job_name, start_time=now - timedelta(hours=2), elapsed_s=7200)

    def watch(at: datetime) -> watchdog.WatchResult:
        settings = watchdog.WatchSettings(exp.slurm.job_name, log_path=log, outbox=plain_outbox(port),
                                          experiment=exp.name, health=HealthConfig(recent=30), cooldown_minutes=60)
        return watchdog.watch(settings, query=lambda **_: [running], now=at, run=lifecycle.run_state(exp))

    first = watch(now)
    assert sorted(a.condition for a in first.report.alerts) == ["eval-drop:smoke_choice/acc", "eval-result-file"]
    assert first.exit_code == status.EXIT_ALERT
    [mail] = inbox.messages
    assert "roll back to 200" in mail["Subject"]
    body = mail.get_content().replace("\r\n", "\n")
    todo = body.split("What to do:\n", 1)[1]
    assert "`bsops samples evals --iteration N` for N from 201 to 300" in todo
    assert "`bsops rollback evals --step 200 --skip 201-300`" in todo and "EXP" not in todo
    assert str(output / "eval" / "global_step250.json") in body
    assert watch(now + timedelta(minutes=10)).exit_code == status.EXIT_ALERT and len(inbox.messages) == 1  # cooldown
    (output / "eval" / "global_step250.json").unlink()
    write_results(output, {400: {"smoke_choice/acc": 0.48}}, bpb={400: {"cc": 1.5}})  # back within the margin...
    uncounted = watch(now + timedelta(minutes=15))  # ...but step 400 was never saved: the drop stays
    assert [a.condition for a in uncounted.report.alerts] == ["eval-drop:smoke_choice/acc"]
    assert len(inbox.messages) == 2 and "eval-result-file" in inbox.messages[1]["Subject"]  # the torn file's recovery
    (checkpoints / "global_step400").mkdir()
    (checkpoints / "global_step400" / "bsops.json").write_text(json.dumps({"iteration": 400}))
    commit_checkpoint(checkpoints / "global_step400")
    recovered = watch(now + timedelta(minutes=70))
    assert recovered.exit_code == status.EXIT_HEALTHY and len(inbox.messages) == 3
    assert all("recover" in m["Subject"].lower() for m in inbox.messages[1:])


def test_an_eval_drop_finding_without_a_checkpoint_to_roll_back_to(tmp_path):
    found = health.eval_drop(300, 300, "t/ppl", float("nan"), 12.0, 200, 1.0, "run", tmp_path)
    assert found.kind == "eval-drop" and found.iteration == 300
    assert "no complete checkpoint at or before step 200" in found.next_step and "--step" not in found.next_step


def test_an_eval_alert_without_words_of_its_own_takes_its_kinds():
    from bigscience_ops.ops import alerts
    from bigscience_ops.ops.alerts import Alert
    from bigscience_ops.ops.tell import alert_text

    assert alert_text.headline(Alert("eval-drop:t/acc", "m")) == alerts.CONDITIONS["eval-drop"].headline
