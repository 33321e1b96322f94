"""The `bsops` command line: each command parses, calls one library function, prints, exits.

Heavy modules (torch, deepspeed) are never imported here or by the ops commands.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from bigscience_ops import __version__
from bigscience_ops.errors import BsopsError

EXIT_PROBLEMS = 1  # the command ran and found problems (plan errors, alerts)
EXIT_ERROR = 2  # the command could not do its work (bad input, a tool failed)


class _Group(click.Group):
    """Turns library errors into one clear message and an exit code, with no traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BsopsError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(EXIT_ERROR)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bsops")
def main() -> None:
    """Run GPT pretraining on Slurm: plan, render, launch and watch experiments.

    An experiment is a YAML file trainings/NAME.yaml (found in --trainings-dir, $BSOPS_TRAININGS,
    ./trainings, or the bundled trainings/); EXP is its NAME or a path to the file.

    \b
    First steps:
      bsops list                 the experiments
      bsops plan tiny            sizes, memory, batch rampup, steps, days; every rule checked
      bsops render tiny          the Slurm job script and DeepSpeed JSON
      bsops launch tiny --local  train it on this machine
    """


def trainings_option(func):
    return click.option(
        "--trainings-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
        help="Folder of experiment YAML files (default: $BSOPS_TRAININGS, ./trainings, or the bundled one).",
    )(func)


def _load(name: str, trainings_dir: Path | None):
    from bigscience_ops.config import load_experiment

    return load_experiment(name, trainings_dir)


@main.command("list")
@trainings_option
def list_command(trainings_dir: Path | None) -> None:
    """List the experiments and their one-line descriptions."""
    from bigscience_ops.config import default_trainings_dir, list_experiments

    directory = trainings_dir or default_trainings_dir()
    for name in list_experiments(directory):
        try:
            description = _load(name, directory).description
        except BsopsError as exc:
            description = f"INVALID: {exc}"
        click.echo(f"{name:<20} {description}")


@main.command()
@click.argument("exp")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
@trainings_option
def show(exp: str, as_json: bool, trainings_dir: Path | None) -> None:
    """Show EXP's resolved config: base: merged, derived values filled in and marked."""
    from bigscience_ops.config import to_dict
    from bigscience_ops.planview import show_text

    experiment = _load(exp, trainings_dir)
    if as_json:
        click.echo(json.dumps(to_dict(experiment) | {"derived": list(experiment.derived)}, indent=2))
    else:
        click.echo(show_text(experiment), nl=False)


@main.command()
@click.argument("exp")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--nodes", type=click.IntRange(min=1), default=None,
              help="Plan for this many nodes instead of slurm.nodes (e.g. after the rampup).")
@trainings_option
def plan(exp: str, as_json: bool, nodes: int | None, trainings_dir: Path | None) -> None:
    """Plan EXP: parameters, memory, DP size, batch rampup, iterations, LR, tokens, days.

    Every rule that would fail or mislead the run is checked; exits 1 when any error is found.
    """
    from bigscience_ops.plan import make_plan
    from bigscience_ops.planview import plan_data, plan_text

    experiment = _load(exp, trainings_dir)
    if nodes is not None:
        experiment = dataclasses.replace(experiment, slurm=dataclasses.replace(experiment.slurm, nodes=nodes))
    result = make_plan(experiment)
    if as_json:
        click.echo(json.dumps(plan_data(result), indent=2))
    else:
        click.echo(plan_text(result, experiment), nl=False)
    if result.errors:
        sys.exit(EXIT_PROBLEMS)


def _default_cron_dir() -> Path:
    import os

    env = os.environ.get("BSOPS_CRON_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "cron"


cron_dir_option = click.option(
    "--cron-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Folder with cron.hourly/, cron.daily/ and cron.yaml (default: $BSOPS_CRON_DIR or the bundled cron/).")


@main.group()
def cron() -> None:
    """Cron for clusters without crontab: self-respawning Slurm jobs over cron.hourly/ and cron.daily/."""


@cron.command("install")
@cron_dir_option
@click.option("--period-seconds", type=click.IntRange(min=1), default=None,
              help="Re-arm every N seconds instead of hourly/daily (for testing a chain).")
@click.option("--scrontab", "use_scrontab", is_flag=True, help="Write scrontab entries instead of runner jobs.")
def cron_install(cron_dir: Path | None, period_seconds: int | None, use_scrontab: bool) -> None:
    """Submit the hourly and daily runner jobs, unless their chains are already queued."""
    from bigscience_ops import cron as cronlib

    cron_dir = cron_dir or _default_cron_dir()
    if use_scrontab:
        path, installed = cronlib.install_scrontab(cron_dir)
        click.echo(f"wrote {path}" + ("; installed with scrontab" if installed else
                                      f"; this machine has no scrontab client: run `scrontab {path}` on a login node"))
        return
    for line in cronlib.install(cron_dir, period_seconds):
        click.echo(line)


@cron.command("status")
@cron_dir_option
def cron_status(cron_dir: Path | None) -> None:
    """Show each runner chain and its next run; exit 1 when a chain is missing."""
    from bigscience_ops import cron as cronlib

    states = cronlib.chains(cron_dir or _default_cron_dir())
    for state in states:
        click.echo(state.describe())
    if any(not state.jobs for state in states):
        sys.exit(EXIT_PROBLEMS)


@cron.command("add")
@click.argument("exp")
@cron_dir_option
@trainings_option
def cron_add(exp: str, cron_dir: Path | None, trainings_dir: Path | None) -> None:
    """Render EXP's hourly status watchdog job into cron.hourly/."""
    from bigscience_ops import cron as cronlib
    from bigscience_ops.config import experiment_path

    cron_dir = cron_dir or _default_cron_dir()
    experiment = _load(exp, trainings_dir)
    folder = experiment_path(exp, trainings_dir).parent
    job = cronlib.render_status_job(cron_dir, experiment, folder, cronlib.load_settings(cron_dir))
    path = cronlib.write_runner(job)
    click.echo(f"wrote {path}")


@cron.command("run", hidden=True)
@click.argument("period", type=click.Choice(["hourly", "daily"]))
@cron_dir_option
@click.option("--runner", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="This runner's script, re-submitted for the next period first.")
@click.option("--period-seconds", type=click.IntRange(min=1), default=None)
@click.option("--no-rearm", is_flag=True, help="Do not re-arm (scrontab runs the schedule).")
def cron_run(period: str, cron_dir: Path | None, runner: Path | None, period_seconds: int | None, no_rearm: bool) -> None:
    """One runner pass: re-arm, then submit every job of the folder not already queued."""
    import os

    from bigscience_ops import cron as cronlib

    report = cronlib.run_pass(cron_dir or _default_cron_dir(), period, None if no_rearm else runner,
                              period_seconds, self_job_id=os.environ.get("SLURM_JOB_ID"))
    for line in report.lines:
        click.echo(line)
    if report.failed:
        sys.exit(EXIT_PROBLEMS)


@main.group(hidden=True)
def task() -> None:
    """Hooks the job script runs around each array task: the failure budget."""


def _resolved(path: Path):
    from bigscience_ops.config import from_dict

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise click.BadParameter(f"{path}: not JSON ({exc}); expected the experiment.json bsops render writes")
    return from_dict(data, str(path))


experiment_json_option = click.option(
    "--experiment", "experiment_json", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The run's experiment.json, as rendered.")


@task.command("begin")
@experiment_json_option
def task_begin(experiment_json: Path) -> None:
    """Record a task start; exit 1 without training when the failure budget is spent."""
    from bigscience_ops import ledger

    exp = _resolved(experiment_json)
    failing = ledger.begin(Path(exp.paths.output), Path(exp.paths.checkpoints), exp.slurm.failure_budget)
    if failing is not None:
        from bigscience_ops import notify

        nodes = ", ".join(sorted({a.nodes for a in failing if a.nodes})) or "unknown"
        alert = (f"***ALERT: {exp.slurm.job_name}: the last {len(failing)} array tasks made no progress "
                 f"(iteration {failing[-1].start_iteration}; nodes {nodes}); not training. "
                 f"Check the nodes, add bad ones to slurm.exclude, then relaunch***")
        click.echo(alert)
        tasks = "\n".join(f"- {a.job_id} on {a.nodes or '?'}: iteration {a.start_iteration} -> "
                          f"{a.end_iteration if a.end_iteration is not None else 'killed'}, exit code {a.exit_code}"
                          for a in failing)
        click.echo(notify.send_alert(exp.alerts, f"[bsops] {exp.name}: crash loop stopped, not training",
                                     f"{alert}\n\nThe tasks:\n{tasks}\n\nThe remaining array tasks stop at once too. "
                                     f"After fixing, `bsops launch {exp.name}` starts a fresh failure budget."))
        sys.exit(EXIT_PROBLEMS)
    click.echo(f"task {ledger.slurm_job_id()} begins at iteration {ledger.latest_iteration(Path(exp.paths.checkpoints))}")


@task.command("end")
@experiment_json_option
@click.option("--exit-code", type=int, required=True, help="The training's exit code.")
def task_end(experiment_json: Path, exit_code: int) -> None:
    """Record a task end and whether it made progress."""
    from bigscience_ops import ledger

    exp = _resolved(experiment_json)
    attempt = ledger.end(Path(exp.paths.output), Path(exp.paths.checkpoints), exit_code)
    verdict = "made progress" if attempt.progressed else "made NO progress"
    click.echo(f"task {attempt.job_id} ended with exit code {exit_code} at iteration {attempt.end_iteration}: {verdict}")


@main.command()
@click.argument("exp")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the script, experiment.json and ds_config.json (default: rendered/EXP).")
@trainings_option
def render(exp: str, out: Path | None, trainings_dir: Path | None) -> None:
    """Render EXP's Slurm job-array script and DeepSpeed JSON (refused if the plan finds errors)."""
    from bigscience_ops import render as rendering

    experiment = _load(exp, trainings_dir)
    out = out or Path("rendered") / experiment.name
    script = rendering.write(rendering.render(experiment, out), out)
    click.echo(f"rendered {script}")
    click.echo(f"submit with: sbatch {script}   (or: bsops launch {exp})")


# --- launch commands ---


@main.command()
@click.argument("exp", default="tiny")
@click.option("--local", "local", is_flag=True,
              help="Run the rendered job array on this machine with Slurm's environment emulated.")
@click.option("--after-current", is_flag=True,
              help="If a job of EXP is queued, start after its whole array (afterany) instead of refusing.")
@click.option("--dry-run", is_flag=True, help="Show the run record, queue check and sbatch command; submit nothing.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --local: run folder (default: the experiment's paths.output, runs/EXP).")
@click.option("--tasks", type=click.IntRange(min=1), default=None,
              help="With --local: array tasks to run (default: slurm.array); each resumes from the last checkpoint.")
@trainings_option
def launch(exp: str, local: bool, after_current: bool, dry_run: bool, out: Path | None, tasks: int | None,
           trainings_dir: Path | None) -> None:
    """Launch EXP (default: tiny) as a Slurm job array, one task at a time, each resuming.

    The plan is checked first and nothing invalid is submitted. A job of EXP already in the queue
    (any user of slurm.group) makes the launch refuse, unless --after-current chains after it.
    With --local the same job script runs here, its array tasks one after another.
    """
    from bigscience_ops.launch import launch_local

    experiment = _load(exp, trainings_dir)
    if not local:
        from bigscience_ops import submit

        if out is not None or tasks is not None:
            raise click.UsageError("--out and --tasks apply to --local only")
        launch_plan = submit.plan_launch(experiment, after_current=after_current)
        for line in launch_plan.describe():
            click.echo(line)
        if dry_run:
            click.echo(f"dry run: nothing submitted. The job script:\n\n{launch_plan.rendered.files[launch_plan.rendered.script]}")
            return
        job_id = submit.submit(launch_plan)
        click.echo(f"submitted job array {job_id} ({experiment.slurm.array} tasks, one at a time)")
        click.echo(f"watch it with: bsops status {exp}    log: {Path(experiment.paths.logs) / 'main_log.txt'}")
        return
    if after_current or dry_run:
        raise click.UsageError("--after-current and --dry-run apply to Slurm launches, not --local")
    result = launch_local(experiment, out, tasks, progress=click.echo)
    for task in result.tasks:
        click.echo(f"array task {task.array_task_id}: exit {task.returncode} in {task.seconds:.0f} s ({task.output})")
    click.echo(f"run folder: {result.run_dir}")
    click.echo(f"  log:         {result.main_log}")
    click.echo(f"  checkpoints: {result.checkpoints}")
    click.echo(f"  tensorboard: {result.tensorboard}")
    if not result.finished:
        click.echo("training not finished: run the same command again to resume")


# --- data commands ---


def _split_keys(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(k for v in values for k in v.replace(",", " ").split())


@main.command()
@click.option("--input", "inputs", multiple=True, required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="jsonl file, optionally .gz or .xz compressed; repeat for several.")
@click.option("--json-keys", multiple=True, default=("text",), show_default=True,
              help="Keys whose strings are the documents; one output per key.")
@click.option("--tokenizer", default=None,
              help="A tokenizer.json, a folder with vocab.json + merges.txt, or 'gpt2' (packaged GPT-2 files).")
@click.option("--vocab-file", default=None, help="GPT-2 style vocab.json (with --merge-file).")
@click.option("--merge-file", "merges_file", default=None, help="GPT-2 style merges.txt (with --vocab-file).")
@click.option("--tokenizer-backend", type=click.Choice(["auto", "tiktoken", "tokenizers"]), default="auto",
              show_default=True, help="auto: tiktoken when it gives the same ids, else tokenizers.")
@click.option("--append-eod", is_flag=True, help="End each document with <|endoftext|>.")
@click.option("--output-prefix", required=True, help="Writes PREFIX_KEY_document.bin/.idx.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tokenizing processes.")
@click.option("--strict", is_flag=True, help="Stop at the first unusable line instead of counting it.")
@click.option("--log-interval", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Documents between progress lines (when stderr is not a terminal).")
def preprocess(inputs: tuple[Path, ...], json_keys: tuple[str, ...], tokenizer: str | None,
               vocab_file: str | None, merges_file: str | None, tokenizer_backend: str, append_eod: bool,
               output_prefix: str, workers: int, strict: bool, log_interval: int) -> None:
    """Tokenize jsonl documents into Megatron's indexed format (.bin/.idx)."""
    from bigscience_ops.data.preprocess import Progress
    from bigscience_ops.data.preprocess import preprocess as run_preprocess
    from bigscience_ops.data.tokenizer import resolve_tokenizer

    spec = resolve_tokenizer(tokenizer, vocab_file, merges_file, tokenizer_backend)
    on_terminal = sys.stderr.isatty()
    state = {"next_log": log_interval, "shown": 0}

    def report(p: Progress) -> None:
        if on_terminal:
            if p.fraction is not None:
                width = 30
                done = int(p.fraction * width)
                click.echo(f"\r[{'#' * done}{'.' * (width - done)}] {p.fraction:6.1%} {p.docs} docs "
                           f"{p.mb_per_s:.1f} MB/s", nl=False, err=True)
        elif p.docs >= state["next_log"]:
            click.echo(p.megatron_line(), err=True)
            state["next_log"] = (p.docs // log_interval + 1) * log_interval

    result = run_preprocess(list(inputs), output_prefix, spec, _split_keys(json_keys), append_eod,
                            workers, strict, report)
    if on_terminal:
        click.echo("", err=True)
    for p in result.problems[:20]:
        click.echo(f"skipped {p}", err=True)
    if result.docs_dropped > len(result.problems[:20]):
        click.echo(f"... {result.docs_dropped - len(result.problems[:20])} more in {result.problems_file}", err=True)
    click.echo(f"tokenizer {result.tokenizer}, tokens {result.dtype}")
    click.echo(f"documents in {result.docs_in}, out {result.docs_out}, dropped {result.docs_dropped}"
               + (f" ({', '.join(f'{k} {n}' for k, n in result.problem_counts.items())})"
                  if result.problem_counts else ""))
    secs = max(result.seconds, 1e-9)
    click.echo(f"read {result.bytes_in / 1e6:.1f} MB in {result.seconds:.1f} s "
               f"({result.bytes_in / secs / 1024 / 1024:.2f} MB/s, {result.docs_in / secs:.0f} docs/s)")
    for key, prefix in result.outputs.items():
        click.echo(f"wrote {prefix}.bin/.idx: {result.docs_out} documents, {result.tokens_out[key]} tokens")
    if result.problems_file:
        click.echo(f"problems listed in {result.problems_file}")


@main.command("merge-data")
@click.option("--input-prefix", "prefixes", multiple=True, required=True,
              help="Indexed dataset prefix (without .bin/.idx); repeat, in order.")
@click.option("--output-prefix", required=True, help="Prefix of the merged .bin/.idx.")
def merge_data(prefixes: tuple[str, ...], output_prefix: str) -> None:
    """Concatenate indexed datasets (same tokenizer) into one."""
    from bigscience_ops.data.indexed import IndexedDataset, merge_datasets

    out = merge_datasets(list(prefixes), output_prefix)
    merged = IndexedDataset(out)
    click.echo(f"wrote {out}.bin/.idx: {len(merged)} documents, {merged.num_tokens} tokens")


@main.command("prepare-corpus")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the .bin/.idx (default: corpus/build next to the bundled corpus).")
def prepare_corpus(out_dir: Path | None) -> None:
    """Build the bundled corpus's .bin/.idx (the tiny experiment's data) if missing."""
    from bigscience_ops.data.corpus import default_build_dir, ensure_bundled_corpus

    prefix = ensure_bundled_corpus(out_dir or default_build_dir())
    click.echo(prefix)


# --- ops commands ---


@main.command("status")
@click.argument("exp", required=False)
@trainings_option
@click.option("--job-name", default=None, help="The Slurm job name to watch (compared whole, any length).")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The run's main_log.txt: the lines are appended to it, and it is checked for progress.")
@click.option("--stall-minutes", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Alert when a RUNNING job's log has had no new iteration line for this long (needs --log).")
@click.option("--group", default=None, help="Watch the jobs of every user in this Unix group (default: all users).")
@click.option("--user", "users", multiple=True, help="Watch this user's jobs (repeatable).")
@click.option("--contact", default="Eng WG", show_default=True, help="Who the ALERT line says to alert.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds to wait for squeue before reporting Slurm as unreachable.")
@click.option("--no-email", is_flag=True, help="Print (and log) only; send no email.")
@click.option("--email-to", multiple=True, help="Alert recipient (repeatable); without one no email is sent.")
@click.option("--email-from", default=None, help="Sender address (default: bsops@<this host>).")
@click.option("--smtp-host", default="localhost", show_default=True)
@click.option("--smtp-port", type=click.IntRange(1, 65535), default=None,
              help="Default: 587 for starttls, 465 for ssl, 25 for none.")
@click.option("--smtp-security", type=click.Choice(["starttls", "ssl", "none"]), default="starttls",
              show_default=True)
@click.option("--smtp-user", default=None, help="SMTP login; the password is read from --smtp-password-env.")
@click.option("--smtp-password-env", default=None, help="Name of the environment variable holding the password.")
@click.option("--alert-state", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Cooldown state file (default: .bsops-alerts.json next to --log).")
@click.option("--cooldown-minutes", type=click.FloatRange(min=0), default=None,
              help="Send the same alert at most once per this many minutes (default: alerts.cooldown_minutes, or 60).")
def status_command(exp: str | None, trainings_dir: Path | None, job_name: str | None, log_path: Path | None, stall_minutes: float | None, group: str | None,
                   users: tuple[str, ...], contact: str, timeout: float, no_email: bool, email_to: tuple[str, ...],
                   email_from: str | None, smtp_host: str, smtp_port: int | None, smtp_security: str,
                   smtp_user: str | None, smtp_password_env: str | None, alert_state: Path | None,
                   cooldown_minutes: float) -> None:
    """Is EXP (or --job-name) running or scheduled? Prints one line per job and ALERT lines.

    With EXP, the job name, the run's main_log.txt, the stall limit, the group and the alert
    emails come from the experiment's config; options given explicitly win.
    Exit code 0 healthy, 1 alert, 2 Slurm could not be queried or an alert email failed.
    """
    import socket

    from bigscience_ops import notify

    smtp = None
    experiment = None
    if exp is not None:
        experiment = _load(exp, trainings_dir)
        job_name = job_name or experiment.slurm.job_name
        log_path = log_path or Path(experiment.paths.logs) / "main_log.txt"
        stall_minutes = stall_minutes or experiment.alerts.stall_minutes
        group = group or experiment.slurm.group
        if not email_to and not no_email:
            smtp = notify.smtp_from_alerts(experiment.alerts)
        cooldown_minutes = experiment.alerts.cooldown_minutes if cooldown_minutes is None else cooldown_minutes
    if job_name is None:
        raise click.UsageError("give an experiment (EXP) or --job-name")
    cooldown_minutes = 60.0 if cooldown_minutes is None else cooldown_minutes
    if email_to and not no_email:
        smtp = notify.SmtpSettings(
            host=smtp_host, port=smtp_port or notify.DEFAULT_PORTS[smtp_security], security=smtp_security,
            sender=email_from or f"bsops@{socket.getfqdn()}", recipients=email_to, user=smtp_user,
            password_env=smtp_password_env)
    result = notify.watch(job_name, users=users, group=group, log_path=log_path, stall_minutes=stall_minutes,
                          contact=contact, smtp=smtp, state_path=alert_state, cooldown_minutes=cooldown_minutes,
                          experiment=experiment.name if experiment else None, timeout=timeout)
    for line in result.lines:
        click.echo(line)
    sys.exit(result.exit_code)
