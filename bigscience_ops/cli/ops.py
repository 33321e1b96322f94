"""`bsops hub-sync` and `bsops backup`: what the hourly cron jobs run to get logs and checkpoints off the cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import (
    TEXT, FiniteFloat, alert_option, configured_run, dry_run_option, field_alias_option, main, open_run_saying,
    overrides_argument, run_alerting, run_option, trainings_option,
)

# Where the token goes and under which name it is read: another team's values send your token to their host.
TRUSTED_HUB_FIELDS = ("hub.host", "hub.remote_template", "hub.token_env")


def refuse_inherited_hub(opened, trainings_dir: Path | None) -> None:
    """Raise HubSyncError (exit 2, emailed with --alert) when hub.host, hub.remote_template or hub.token_env of the
    opened run's experiment file come from a base file (its origins, read with it by run.open)."""
    from bigscience_ops.config.files import experiment_path
    from bigscience_ops.ops.keep.hubsync import HubSyncError
    from bigscience_ops.config.site_values import inherited_from

    exp = opened.named
    own = opened.yaml if opened.yaml is not None else experiment_path(exp, trainings_dir)
    inherited = {f: src for f, src in inherited_from(opened.origins, own).items() if f in TRUSTED_HUB_FIELDS}
    if inherited:
        named = ", ".join(f"{field} (from {source})" for field, source in inherited.items())
        raise HubSyncError(
            f"{exp} inherits {named}: they decide where your Hub token goes; set them in {exp}'s own file, or pass "
            "--trust-inherited-hub if that base is your own team's")


@main.command("hub-sync")
@click.argument("exp", type=TEXT, required=False)
@run_option
@click.option("--what", type=TEXT, default=None, metavar="LIST",
              help="Comma-separated: logs, tensorboard, codecarbon (default: every kind with a hub.*_repo).")
@click.option("--remote", type=TEXT, default=None, metavar="URL",
              help="Push to this git remote instead of the Hub or hub.remote_template (needs exactly one --what).")
@click.option("--wait", "wait_s", type=FiniteFloat(0, 86_400, unit="seconds"), default=0, show_default=True,
              help="Seconds to wait for an overlapping sync of the same repo; 0 skips it at once.")
@click.option("--trust-inherited-hub", is_flag=True,
              help="Sync although hub.host, hub.remote_template or hub.token_env come from a base file.")
@alert_option
@dry_run_option
@trainings_option
@overrides_argument
def hub_sync(exp: str | None, run: Path | None, what: str | None, remote: str | None, wait_s: float,
             trust_inherited_hub: bool, alert: bool, dry_run: bool, trainings_dir: Path | None,
             overrides: tuple[str, ...]) -> None:
    """Push EXP's logs, TensorBoard events and codecarbon records to their Hub repos.

    Keeps one git clone per repo under the run folder (hub/<what>/), copies what changed, stores
    main_log.txt, event files and files over hub.lfs_size_mb with git-lfs, commits only when
    something changed and pushes with retries. The token is read from the environment variable
    named by hub.token_env, offered only over https to hub.host, and never written anywhere; when
    hub.host, hub.remote_template or hub.token_env come from a base file rather than EXP's own, the
    sync is refused (exit 2) unless --trust-inherited-hub. A file the remote's links would take out of
    the clone is refused (exit 2); the rest is pushed.
    """
    from bigscience_ops.ops.keep import hubsync

    opened = open_run_saying(exp, run, trainings_dir, overrides=overrides, fallback=True)
    experiment = opened.configured()
    kinds = [w.strip() for w in what.split(",") if w.strip()] if what else None

    def work() -> None:
        if not trust_inherited_hub:
            refuse_inherited_hub(opened, trainings_dir)
        if dry_run:  # the settings and remotes checked; no clone made or fetched, nothing committed or pushed
            settings = hubsync.settings(experiment)
            for kind in hubsync.selected(settings, kinds, remote):
                url, _ = hubsync.remote_for(settings, hubsync.repo_name(settings, kind, remote), remote)
                click.echo(f"would sync {kind}: {settings.folder(kind)} -> {url}")
            click.echo("dry run: nothing cloned, committed or pushed")
            return
        results = hubsync.sync(hubsync.settings(experiment), kinds, remote, wait_s)
        for result in results:
            click.echo(result.describe())
        refused = [f"{r.what}/{path}" for r in results for path in r.refused]
        if refused:
            raise hubsync.HubSyncError(f"{len(refused)} file(s) not synced: got a link in the clone at or above "
                                       f"{', '.join(refused[:5])} (committed in the remote); allowed: no links in "
                                       "the remote's folders (remove them there, then move the clone away)")

    # A run of some kinds only neither clears nor repeats the alert of a full run.
    job = f"hub-sync --what {','.join(sorted(set(kinds)))}" if kinds else "hub-sync"
    # A dry run tells no one.
    run_alerting(experiment, alert and not dry_run, job, f"bsops {job} {experiment.name}", work)


class _ShownProgress:
    """A bar per checkpoint on a terminal, one line per checkpoint otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.bar = None

    def begin(self, plan) -> None:
        if self.tty:
            self.bar = click.progressbar(length=max(plan.size, 1), label=plan.ckpt.tag, show_eta=True)
            self.bar.__enter__()

    def advance(self, nbytes: int) -> None:
        if self.bar is not None:
            self.bar.update(nbytes)

    def end(self, plan, resumed: bool) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
        click.echo(f"{plan.ckpt.tag}: {_what(plan)}, {_mb(plan.size)} read, verified"
                   + (" (finished an interrupted copy)" if resumed else ""))


def _what(plan) -> str:
    if plan.whole:
        return f"whole ({len(plan.files)} files, optimizer state kept)"
    return (f"weights only ({len(plan.files)} files; {len(plan.left_out)} optimizer file(s) left out, "
            f"{len(plan.rewritten)} model-states file(s) written without the optimizer)")


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:,.1f} MB"


@main.command("backup")
@click.argument("exp", type=TEXT, required=False)
@run_option
@field_alias_option("backup.dest", "--to", metavar="DIR", help="the backup store (a folder bsops made).")
@click.option("--dry-run", is_flag=True, help="Show what would be copied and deleted; change nothing.")
@alert_option
@trainings_option
@overrides_argument
def backup_cmd(exp: str | None, run: Path | None, dry_run: bool, alert: bool,
               trainings_dir: Path | None, overrides: tuple[str, ...]) -> None:
    """Copy EXP's new checkpoints to the backup, verify them, then apply scratch retention.

    Only complete checkpoints are copied: those whose manifest the trainer committed; each file is
    checked against that manifest as it is read (a checkpoint damaged since its save is not copied, and
    the command names the file and exits non-zero). Each is copied without optimizer state except the
    final one (and every backup.keep_optimizer_every-th step), with a manifest of the copy (size and
    sha256 per file) checked after the copy; a copy interrupted earlier is finished. The store is a
    folder bsops made (never another run's checkpoints), each run in its own
    <store>/<experiment>/<run id>/. Retention (backup.keep_last, keep_every) deletes only complete
    checkpoints with a verified copy of their very files, never the one the run resumes from nor any
    after it, and never the newest resumable one (optimizer state included) unless a verified whole
    copy of it is in the store. Checkpoint files are never unpickled: model-states files are read with
    torch's restricted loader, and one it refuses is reported and its checkpoint left as it is.
    """
    from bigscience_ops.ops.keep import backup

    experiment, _ = configured_run(exp, run, trainings_dir, overrides, fallback=True)

    def work() -> None:
        report = backup.run_backup(backup.settings(experiment), dry_run=dry_run,
                                   progress=None if dry_run else _ShownProgress())
        if dry_run:
            for plan in report.planned:
                click.echo(f"would copy {plan.ckpt.tag}: {_what(plan)}, {_mb(plan.size)}")
        if report.already:
            click.echo(f"already in {report.store}: {len(report.already)} checkpoint(s), last {report.already[-1]}")
        if not report.planned and not report.failed and not report.left_on_scratch:
            click.echo("no new checkpoint to back up")
        if report.incomplete:
            click.echo(f"not complete (no committed manifest: a save in progress or cut short), not copied: "
                       f"{', '.join(report.incomplete)}")
        decision = report.retention
        if decision is not None:
            gone = report.deleted if not dry_run else [f"global_step{s}" for s in decision.delete]
            verb = "would delete" if dry_run else "deleted"
            kept = ", ".join(f"global_step{s} ({why})" for s, why in sorted(decision.keep.items())
                             if why not in ("one of the newest", "no keep_last: nothing is deleted"))
            click.echo(f"scratch retention: {verb} {', '.join(gone) or 'nothing'}" + (f"; kept {kept}" if kept else ""))
        if report.failed or report.left_on_scratch:
            lines = "; ".join([*(f"{tag}: {why}" for tag, why in report.failed.items()),
                               *(f"{name}: scratch retention: {why}" for name, why in report.left_on_scratch.items())])
            counts = [f"{n} {what}" for n, what in ((len(report.failed), "checkpoint(s) not backed up"),
                                                    (len(report.left_on_scratch), "left on scratch by retention")) if n]
            gone = f"; deleted from scratch by retention: {', '.join(report.deleted)}" if report.deleted else ""
            raise backup.BackupError(f"{', '.join(counts)} (the rest was done): {lines}{gone}")

    job = "backup --dry-run" if dry_run else "backup"  # a dry run that works says nothing of the backup
    run_alerting(experiment, alert and not dry_run, job, f"bsops {job} {experiment.name}", work)  # nor tells anyone
