"""`bsops eval` (run, next, prefetch, table) and `bsops cron add --jobs eval` at the command line: refusals, the
table, the hourly job's pass and its dry run, JSON, and the last release's spelling (`bsops eval EXP --step N`).

The ranks never start here: launcher.run_local is a stand-in that leaves what the real ranks left for the same
request (the result files and exit codes recorded in tests/assets/eval/worker/, its record.py re-records them); the
evaluation itself is tested with the worker's own tests and, on the Slurm cluster, by tests/cluster/test_cluster_evaluate.py.
The hourly pass submits to the session's real Slurm cluster; its dry run and an old cron script's pass answer with
recorded real squeue and sbatch output (tests/fixtures_slurm.py's stand-ins, whose calls are counted).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from bigscience_ops import slurm
from bigscience_ops.cli import EXIT_ERROR, main
from bigscience_ops.ops.evaluate import launcher, results, next_eval
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_runs import commit_checkpoint
from tests.fixtures_slurm import SlurmCluster, replay_sbatch, replay_squeue, sbatch_calls, wait_until

WORKER = Path(__file__).parents[1] / "assets" / "eval" / "worker"
RECORDED = json.loads((WORKER / "exits.json").read_text())
"""What the real ranks left (tests/assets/eval/worker/record.py): the step they evaluated, and each request's exit."""


def replay_worker(case: str, calls: list[tuple]) -> Callable[..., int]:
    """A stand-in for launcher.run_local that leaves what the real ranks left for request `case` of the recording:
    its result file (where the ranks write it, for the step recorded) and its exit code; each call's (step, tensor,
    pipeline, experiment, keep_cache) is appended to `calls`."""
    def run_local(exp, step, tensor=None, pipeline=None, trainings_dir=None, experiment=None, env=None,
                  log_samples=False, keep_cache=False, ranks_stdout_to_stderr=False) -> int:
        calls.append((step, tensor, pipeline, experiment, keep_cache))
        assert step == RECORDED["step"], f"the recording is of global_step{RECORDED['step']}, not {step}"
        path = results.result_path(exp, f"global_step{step}")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(WORKER / f"{case}.json", path)
        return RECORDED[case]
    return run_local


def _write(trainings: Path, tmp_path: Path, evaluation: str | None = "sources: {held: HELD}", *extra: str,
           name: str = "ev") -> str:
    """NAME.yaml: tiny with its run in tmp_path/run, this eval section and `extra` sections; None: tiny without one (a
    whole copy, as a base's eval: section cannot be emptied by a mapping that merges into it)."""
    held = tmp_path / "held.jsonl"
    held.write_text('{"text": "held out"}\n')
    if evaluation is None:
        data = yaml.safe_load((trainings / "tiny.yaml").read_text())
        data.pop("eval", None)
        data["paths"] = {"output": str(tmp_path / "run")}
        (trainings / f"{name}.yaml").write_text(yaml.safe_dump(data))
        return name
    section = f"eval: {{{evaluation.replace('HELD', json.dumps(str(held)))}}}\n"
    (trainings / f"{name}.yaml").write_text(tiny_yaml(tmp_path / "run", section, *extra))
    return name


def _saved(tmp_path: Path, *steps: int, latest: int, meta: bool = True) -> Path:
    checkpoints = tmp_path / "run" / "checkpoints"
    for step in steps:
        (checkpoints / f"global_step{step}").mkdir(parents=True)
        if meta:
            (checkpoints / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
            commit_checkpoint(checkpoints / f"global_step{step}")
    (checkpoints / "latest").write_text(f"global_step{latest}")
    return checkpoints


def _eval(trainings: Path, subcommand: str, *args: str, name: str = "ev"):
    return CliRunner().invoke(main, ["eval", subcommand, name, *args, "--trainings-dir", str(trainings)])


def _old(trainings: Path, *args: str, name: str = "ev"):
    """The last release's spelling: `bsops eval EXP --step N` (--latest, --next, --prefetch)."""
    return CliRunner().invoke(main, ["eval", name, *args, "--trainings-dir", str(trainings)])


def _one_error(result) -> str:
    assert result.exit_code == EXIT_ERROR, result.output
    assert "Traceback" not in result.output
    [line] = [line for line in result.output.split("\n") if line.startswith("error: ")]
    return line


def test_nothing_configured_is_refused_naming_the_section(trainings: Path, tmp_path: Path) -> None:
    _write(trainings, tmp_path, evaluation=None)
    _saved(tmp_path, 50, latest=50)
    for args in (["run", "--step", "50"], ["run", "--latest"], ["next"], ["prefetch"]):
        line = _one_error(_eval(trainings, *args))
        assert "ev.yaml: eval: got {}" in line and "eval.tasks" in line and "eval.sources" in line


@pytest.mark.parametrize(("args", "named"), [
    (["run"], "exactly one of --step N, --latest"), (["run", "--step", "50", "--latest"], "--step and --latest"),
    (["run", "--latest", "--alert"], "bsops eval next"), (["next", "--tensor", "2"], "bsops eval run"),
    (["next", "--keep-cache"], "bsops eval run"), (["prefetch", "--log-samples"], "bsops eval run"),
    (["table", "--mirror", "m"], "bsops eval prefetch"), (["next", "--alert", "--dry-run"], "--alert and --dry-run"),
])
def test_a_subcommand_refuses_what_is_not_its_own(args: list[str], named: str, trainings: Path,
                                                  tmp_path: Path) -> None:
    _write(trainings, tmp_path)
    line = _one_error(_eval(trainings, *args))
    assert named in line and f"eval {args[0]} --help" in line


@pytest.mark.parametrize("first", ["ev", "--run"])
def test_no_subcommand_is_a_usage_error_naming_the_subcommands(first: str, trainings: Path, tmp_path: Path) -> None:
    _write(trainings, tmp_path)
    result = CliRunner().invoke(main, ["eval", first, "x", "--trainings-dir", str(trainings)])
    line = _one_error(result)
    assert repr(first) in line or first in line
    assert "allowed:" in line and "run, next, prefetch, table" in line and "eval --help" in line


@pytest.mark.parametrize(("subcommand", "options"), [
    ("run", {"--step", "--latest", "--tensor", "--pipeline", "--log-samples", "--keep-cache", "--json", "--dry-run",
             "--run", "--trainings-dir"}),
    ("next", {"--alert", "--dry-run", "--run", "--trainings-dir"}),
    ("prefetch", {"--mirror", "--dry-run", "--run", "--trainings-dir"}),
    ("table", {"--json", "--run", "--trainings-dir"}),
])
def test_each_subcommand_says_its_options(subcommand: str, options: set[str]) -> None:
    result = CliRunner().invoke(main, ["eval", subcommand, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.split("\n")[0].endswith(f" eval {subcommand} [OPTIONS] [EXP] [SECTION.KEY=VALUE]...")
    declared = {name for param in main.commands["eval"].commands[subcommand].params
                if isinstance(param, click.Option) for name in param.opts}
    assert declared == options and all(name in result.output for name in declared)
    listed = CliRunner().invoke(main, ["eval", "--help"])
    assert listed.exit_code == 0 and f"  {subcommand} " in listed.output.split("Commands:")[1]


@pytest.mark.parametrize(("old", "new"), [
    (["--step", "50"], "bsops eval run EXP --step"), (["--latest"], "bsops eval run EXP --latest"),
    (["--next"], "bsops eval next EXP"), (["--prefetch"], "bsops eval prefetch EXP"),
])
def test_the_old_spelling_runs_the_subcommand_and_names_it(old: list[str], new: str, trainings: Path,
                                                           tmp_path: Path) -> None:
    """Nothing configured: each old spelling reaches the subcommand it means (its refusal), after one note."""
    _write(trainings, tmp_path, evaluation=None)
    _saved(tmp_path, 50, latest=50)
    result = _old(trainings, *old)
    assert "ev.yaml: eval: got {}" in _one_error(result)
    [note] = [line for line in result.stderr.splitlines() if line.startswith("note: bsops eval EXP")]
    assert f"is now {new};" in note and "next release" in note
    assert _one_error(_old(trainings, "--latest", "--next")).count("--") >= 2  # two modes: the old refusal


def test_checkpoints_that_cannot_be_evaluated_are_refused(trainings: Path, tmp_path: Path, monkeypatch) -> None:
    _write(trainings, tmp_path)
    started = []
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda *a, **k: started.append(a))
    assert "latest" in _one_error(_eval(trainings, "run", "--latest"))
    checkpoints = _saved(tmp_path, 50, latest=50)
    (checkpoints / "global_step60").mkdir()  # no bsops.json
    (checkpoints / "latest").write_text("global_step60")
    (checkpoints / "global_step100").mkdir()  # saved before manifests, newer than `latest`: a save in progress
    (checkpoints / "global_step100" / "bsops.json").write_text(json.dumps({"iteration": 100}))
    (checkpoints / "global_step110").mkdir()  # a save that commits with a manifest, and has none: never finished
    (checkpoints / "global_step110" / "bsops.json").write_text(json.dumps({"iteration": 110, "commit": "manifest"}))
    refusals = {"75": "global_step75", "100": "newer than", "60": "bsops.json", "110": "manifest"}
    for step, named in refusals.items():
        assert named in _one_error(_eval(trainings, "run", "--step", step))
    assert started == []


def test_a_finished_evaluation_prints_the_table(trainings: Path, tmp_path: Path, monkeypatch) -> None:
    _write(trainings, tmp_path, "sources: {held: HELD}, references: {GPT2-XL: {held/bits_per_byte: 1.5}}, "
                                "alert_drop: {held/bits_per_byte: 0.1, lambada/acc: 0.02}")
    step = RECORDED["step"]
    _saved(tmp_path, step, latest=step)
    calls: list[tuple] = []
    monkeypatch.setattr(launcher, "run_local", replay_worker("sources", calls))
    result = _eval(trainings, "run", "--latest", "--tensor", "1", "--pipeline", "1", "--keep-cache")
    assert result.exit_code == 0, result.output
    assert calls == [(step, 1, 1, None, True)]  # the ranks read the experiment as the command has it
    assert launcher.worker_argv("ev", step, keep_cache=True)[-1] == "--keep-cache"  # and are told to keep the cache
    measured = json.loads((WORKER / "sources.json").read_text())["bsops"]["bits_per_byte"]["held"]["bits_per_byte"]
    [row] = [line.split() for line in result.output.split("\n") if line.startswith("held/bits_per_byte")]
    assert row[-2:] == [f"{measured:.4f}", "1.5000"]  # what the ranks measured, beside the reference
    [warning] = [line for line in result.stderr.splitlines() if line.startswith("warning: eval.alert_drop")]
    assert "lambada/acc" in warning and "held/bits_per_byte" in warning.split("allowed:")[1]  # the one that cannot fire

    table = _eval(trainings, "table")  # read only: the same table, nothing evaluated
    assert table.exit_code == 0 and table.stdout.split("\n", 1)[1] == result.stdout.split("\n", 2)[2]
    assert len(calls) == 1

    as_json = _eval(trainings, "run", "--latest", "--json")  # what the text shows, as one JSON object
    assert as_json.exit_code == 0, as_json.output
    shown = json.loads(as_json.stdout)
    assert (shown["tag"], shown["path"], shown["exit_code"], shown["failed"]) == (
        f"global_step{step}", str(results.result_path(tmp_path / "run", f"global_step{step}")), 0, False)
    assert shown["table"]["columns"] == [f"step {step}", "GPT2-XL"]
    [held] = [r for r in shown["table"]["rows"] if r["metric"] == "held/bits_per_byte"]
    assert held["values"] == [pytest.approx(measured), 1.5] and not held["higher_is_better"]
    assert any("lambada/acc" in w for w in shown["warnings"])
    assert json.loads(_eval(trainings, "table", "--json").stdout)["table"] == shown["table"]

    monkeypatch.setattr(launcher, "run_local", lambda *a, **k: 1)  # ranks that crashed (exit 1), no result
    assert f"global_step{step}" in _one_error(_eval(trainings, "run", "--step", str(step)))


@pytest.mark.slurm
def test_the_hourly_pass_submits_records_and_reports_a_failure(slurm_cluster: SlurmCluster, trainings: Path,
                                                               tmp_path: Path) -> None:
    """On the session's Slurm cluster: the eval job goes to a partition that is down (it waits there, never runs);
    while it waits, a pass submits nothing more; cancelled, it has left the queue without a result: the next pass
    reports it and submits it once more."""
    name = f"{slurm_cluster.prefix}-ev"  # the eval job's name, bsops.NAME.eval, is this session's alone
    _write(trainings, tmp_path, "sources: {held: HELD}", f"slurm: {{partition: {slurm_cluster.down_partition}}}\n",
           name=name)
    _saved(tmp_path, 50, latest=50)
    ledger = tmp_path / "run" / "eval" / "jobs.jsonl"
    first = _eval(trainings, "next", "--alert", name=name)
    assert first.exit_code == 0, first.output
    [record] = next_eval.read_ledger(ledger).records
    job_id = record.job_id
    slurm_cluster.submitted.append(job_id)  # cancelled at the end of the session whatever happens
    [job] = slurm_cluster.jobs(job_id)
    assert (job.name, job.state, job.reason) == (f"bsops.{name}.eval", "PENDING", "PartitionDown")
    script = tmp_path / "run" / "eval" / "jobs" / "global_step50.slurm"
    assert slurm.script_job_name(script) == job.name
    assert json.loads(script.with_suffix(".experiment.json").read_text())["eval"]["sources"] == {
        "held": str(tmp_path / "held.jsonl")}
    assert (tmp_path / "run" / "eval" / "logs").is_dir()  # Slurm writes the log there and makes no folder
    waiting = _eval(trainings, "next", "--alert", name=name)
    assert waiting.exit_code == 0 and len(next_eval.read_ledger(ledger).records) == 1, waiting.output
    slurm.cancel([job_id], timeout=30)
    wait_until(f"job {job_id} gone from the queue", lambda: not slurm_cluster.jobs(job_id), timeout=30)
    # The job left the queue without a result: exit 2 naming the step and its log, and it is tried once more.
    failed = _eval(trainings, "next", "--alert", name=name)
    line = _one_error(failed)
    assert "global_step50" in line and str(tmp_path / "run" / "eval" / "logs" / f"global_step50-{job_id}.out") in line
    assert "no alert email: alerts.email_to is empty" in failed.output
    records = next_eval.read_ledger(ledger).records
    again = records[-1].job_id
    slurm_cluster.submitted.append(again)
    assert [(r.event, r.job_id) for r in records] == [("submitted", job_id), ("failed", job_id), ("submitted", again)]
    assert again != job_id and [j.state for j in slurm_cluster.jobs(again)] == ["PENDING"]


def test_cron_add_writes_the_eval_scheduler_only_when_asked(trainings: Path, tmp_path: Path) -> None:
    _write(trainings, tmp_path)
    cron_dir = tmp_path / "cron"
    add = ["cron", "add", "ev", "--cron-dir", str(cron_dir), "--trainings-dir", str(trainings)]
    default = CliRunner().invoke(main, add)
    assert default.exit_code == 0 and "not adding the eval job" in default.output
    assert [p.name for p in (cron_dir / "cron.hourly").iterdir()] == ["ev-slurm-status.slurm"]
    asked = CliRunner().invoke(main, [*add, "--jobs", "eval"])
    assert asked.exit_code == 0, asked.output
    job = cron_dir / "cron.hourly" / "ev-eval-next.slurm"
    assert slurm.script_job_name(job) == "bsops.ev.eval-next"  # not the eval jobs' own name
    assert f"bsops eval next ev --trainings-dir {trainings.resolve()} --alert\n" in job.read_text()
    listed = CliRunner().invoke(main, ["cron", "list", "--cron-dir", str(cron_dir)])
    assert [line.split()[:2] for line in listed.output.strip().split("\n")] == [["ev", "eval"], ["ev", "status"]]

    _write(trainings, tmp_path, evaluation=None)
    refused = CliRunner().invoke(main, [*add, "--jobs", "eval", "--cron-dir", str(tmp_path / "c2")])
    assert "eval.tasks" in _one_error(refused) and not (tmp_path / "c2" / "cron.hourly").exists()


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(folder.rglob("*"))}


def test_a_dry_run_of_the_next_pass_shows_the_job_and_writes_and_submits_nothing(trainings: Path, tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """Against recorded real squeue and sbatch answers: the dry run says which checkpoint and prints the job script,
    and leaves the run folder as it was with sbatch never called; the real pass then submits that very script."""
    _write(trainings, tmp_path)
    _saved(tmp_path, 50, latest=50)
    bin_dir = replay_sbatch(replay_squeue(tmp_path / "bin", "squeue.txt"))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    before = _files(tmp_path / "run")
    dry = _eval(trainings, "next", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run: would submit an eval job for global_step50" in dry.stdout
    assert _files(tmp_path / "run") == before and sbatch_calls(bin_dir) == []  # nothing written, nothing submitted
    shown_script = dry.stdout.split("The job script:\n\n", 1)[1]

    real = _eval(trainings, "next")
    assert real.exit_code == 0, real.output
    assert len(sbatch_calls(bin_dir)) == 1
    script = tmp_path / "run" / "eval" / "jobs" / "global_step50.slurm"
    assert script.read_text().rstrip("\n") == shown_script.rstrip("\n")


def test_an_hourly_script_of_the_last_release_still_runs(trainings: Path, tmp_path: Path, monkeypatch) -> None:
    """The line `bsops cron add --jobs eval` wrote before the subcommands, as it is: one pass, one submission, and a
    note naming the new spelling and how to write the script anew."""
    _write(trainings, tmp_path)
    _saved(tmp_path, 50, latest=50)
    bin_dir = replay_sbatch(replay_squeue(tmp_path / "bin", "squeue.txt"))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    result = CliRunner().invoke(main, ["eval", "ev", "--trainings-dir", str(trainings), "--next", "--alert"])
    assert result.exit_code == 0, result.output
    assert len(sbatch_calls(bin_dir)) == 1
    assert [r.event for r in next_eval.read_ledger(tmp_path / "run" / "eval" / "jobs.jsonl").records] == ["submitted"]
    [note] = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert "bsops eval next EXP" in note and "bsops cron add EXP --jobs eval" in note


def test_a_dry_run_of_an_evaluation_checks_says_and_starts_nothing(trainings: Path, tmp_path: Path,
                                                                   monkeypatch) -> None:
    """`eval run --dry-run` makes the checks made before a rank starts (here the checkpoint's bsops.json, which lacks
    the model's sizes: refused as the evaluation refuses it), then says which checkpoint, layout and files; the
    ranks never start and nothing is written, text or JSON."""
    _write(trainings, tmp_path, "sources: {held: HELD}, tasks: [lambada_openai]")
    step = RECORDED["step"]
    _saved(tmp_path, step, latest=step)
    started: list = []
    monkeypatch.setattr(launcher, "run_local", lambda *a, **k: started.append(a) or 0)
    before = _files(tmp_path / "run")
    assert "lacks model sizes" in _one_error(_eval(trainings, "run", "--latest", "--dry-run"))

    folder = tmp_path / "run" / "checkpoints" / f"global_step{step}"
    asked: list = []  # the checkpoint as launcher.checkpoint answers for a complete one saved in TP=1 PP=2
    monkeypatch.setattr(launcher, "checkpoint", lambda exp, s, tensor=None, pipeline=None: asked.append(
        (s, tensor, pipeline)) or launcher.Target(f"global_step{s}", s, folder, {}, 1, 2, tensor or 1, pipeline or 2))
    text = _eval(trainings, "run", "--latest", "--tensor", "2", "--keep-cache", "--dry-run")
    assert text.exit_code == 0, text.output
    result = results.result_path(tmp_path / "run", f"global_step{step}")
    assert f"would evaluate global_step{step} ({folder}) in TP=2 PP=2: 4 process(es)" in text.stdout
    assert f"writing {result}\n" in text.stdout and "lambada_openai, held (bits per byte)" in text.stdout
    assert str(result.with_name(f"global_step{step}.requests")) in text.stdout
    document = json.loads(_eval(trainings, "run", "--step", str(step), "--dry-run", "--json").stdout)
    assert (document["tag"], document["tensor"], document["pipeline"], document["processes"]) == (
        f"global_step{step}", 1, 2, 2)
    assert (document["result"], document["replaces"], document["tasks"]) == (str(result), False, ["lambada_openai"])
    assert asked == [(step, 2, None), (step, None, None)]
    assert started == [] and _files(tmp_path / "run") == before


def test_a_dry_run_of_a_prefetch_says_what_and_where_and_fetches_nothing(trainings: Path, tmp_path: Path) -> None:
    _write(trainings, tmp_path, "tasks: [lambada_openai, piqa]")
    refused = _eval(trainings, "prefetch", "--dry-run")  # the prefetch's own refusal: no shared cache named
    assert "eval.hf_cache is not set" in _one_error(refused)
    cache, mirror = tmp_path / "hf", tmp_path / "mirror"
    mirror.mkdir()
    said = _eval(trainings, "prefetch", "--dry-run", "--mirror", str(mirror), f"eval.hf_cache={cache}")
    assert said.exit_code == 0, said.output
    assert (f"would fetch the datasets of 2 task(s) (lambada_openai, piqa) from the mirror {mirror} into {cache} "
            "(made)") in said.stdout
    assert f"nothing recorded in {cache} yet" in said.stdout and not cache.exists()
