"""The runner chains as entries of the user's scrontab, merged into it as one marked block.

Slurm's `scrontab` client has no file argument: it lists (`-l`; "no crontab for USER" and exit
code 1 when there is none) and otherwise opens the crontab in $VISUAL/$EDITOR and installs what
the editor leaves in the file. bsops reads the user's scrontab, replaces only the block between
its markers (or appends the block), and installs the result with an "editor" that copies it in.
Everything outside the block, the user's own entries and comments, is kept byte for byte.

scrontab splits `#SCRON` lines on whitespace and knows no quotes, and runs an entry's command under
/bin/sh. So each entry calls a generated bash script, <cron>/runners/scron-<period>.sh (beside the
runner scripts: the block serves the cron folder, whatever runs its jobs), which holds the env_setup
lines, each on its own line; the `#SCRON` lines carry only values of a Slurm name's character set.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from bigscience_ops import slurm
from bigscience_ops.launch import render as rendering
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.cron.runner import PERIODS, CronSettings, RunnerScript, load_settings, runner_name, write_runner
from bigscience_ops.schema import SLURM_TIME
from bigscience_ops.typedyaml import PLAIN, check_charset, control_allowed, control_character

SCHEDULES = {"hourly": "0 * * * *", "daily": "0 0 * * *"}
BEGIN = "# >>> bsops cron (managed by `bsops cron install --scrontab`; edit outside this block) >>>"
END = "# <<< bsops cron <<<"
TIMEOUT_S = 60.0


class ScrontabError(BsopsError):
    """The user's scrontab cannot be read, merged or installed."""


def entry_script(cron_dir: Path, period: str) -> Path:
    """The bash script the `period` entry runs."""
    return Path(cron_dir).resolve() / "runners" / f"scron-{period}.sh"


def block(cron_dir: Path, settings: CronSettings) -> str:
    """The marked block: one entry per period, each calling its entry script (entry_scripts)."""
    _refuse_control("cron folder", str(cron_dir))  # before resolve(), which fails on a NUL
    cron_dir = Path(cron_dir).resolve()
    _refuse_control("cron folder", str(cron_dir))  # resolved: a symlink's target may hold one
    where = str(cron_dir / "cron.yaml")
    lines = [BEGIN]
    for period in PERIODS:
        names = {"job-name": runner_name(period, settings.name_prefix),
                 **{opt: getattr(settings, opt) or None for opt in ("partition", "account", "qos")}}
        try:
            options = rendering.slurm_options(where, names)
        except rendering.RenderError as exc:
            raise ScrontabError(f"refusing to put it into the scrontab: {exc}") from None
        _checked_time(settings.time)
        lines += [f"#SCRON --{option}={value}" for option, value in [options[0], ("time", settings.time), *options[1:]]]
        script = str(entry_script(cron_dir, period))
        if "%" in script:  # cron's own convention: % in a command ends it
            raise ScrontabError(f"refusing to put the cron folder {str(cron_dir)!r} into the scrontab: '%' ends a "
                                f"crontab command; allowed: a folder path without '%'")
        lines.append(f"{SCHEDULES[period]} {shlex.quote(script)}")
    lines.append(END)
    return "\n".join(lines) + "\n"


def entry_scripts(cron_dir: Path, settings: CronSettings) -> list[RunnerScript]:
    """The scripts the block's entries run: bash, `set -euo pipefail`, the env_setup lines, `bsops cron run`."""
    cron_dir = Path(cron_dir).resolve()
    scripts = []
    for period in PERIODS:
        try:
            text = rendering.environment().get_template("scrontab-entry.sh.j2").render(
                period=period, env_setup=[rendering.Raw(line) for line in settings.env_setup], cron_dir=str(cron_dir))
        except rendering.RenderError as exc:
            raise ScrontabError(f"refusing to write the {period} scrontab entry's script: {exc}") from None
        scripts.append(RunnerScript(entry_script(cron_dir, period), text))
    return scripts


def _checked_time(time: str) -> None:
    refused = check_charset(SLURM_TIME, time)
    if refused is not None:
        raise ScrontabError(f"refusing to put --time={time!r} into the scrontab: {refused}")


def _refuse_control(field: str, value: str, kind: str = PLAIN) -> None:
    bad = control_character(value, kind)
    if bad is not None:
        raise ScrontabError(f"refusing to put {field} {value!r} into the scrontab: {bad}; {control_allowed(kind)}")


def merge(existing: str, new_block: str) -> str:
    """`existing` with its bsops block replaced by `new_block`, or with the block appended."""
    lines = [line for line in re.split(r"(?<=\n)", existing) if line]  # on \n only, as scrontab reads it
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.rstrip("\n") == END]
    if len(starts) > 1 or len(ends) > 1 or len(starts) != len(ends) or (starts and ends[0] < starts[0]):
        raise ScrontabError(f"the scrontab has {len(starts)} begin and {len(ends)} end marker lines of the bsops "
                            f"block ({BEGIN!r} ... {END!r}); expected one of each in order or none: fix it with "
                            f"`scrontab -e`")
    if starts:
        return "".join(lines[:starts[0]]) + new_block + "".join(lines[ends[0] + 1:])
    if existing and not existing.endswith("\n"):
        existing += "\n"
    return existing + ("\n" if existing.strip() else "") + new_block


def read_current(client: str = "scrontab", timeout: float = TIMEOUT_S) -> str:
    """The user's scrontab as `scrontab -l` prints it; '' when there is none."""
    argv = [client, "-l"]
    proc = _run(argv, timeout=timeout)
    if proc.returncode == 0:
        return proc.stdout
    if proc.returncode == 1 and proc.stdout.startswith("no crontab for "):
        return ""
    raise ScrontabError(f"`{shlex.join(argv)}` exited with code {proc.returncode}: "
                        f"{(proc.stderr or proc.stdout).strip() or '(no output)'}")


def install(cron_dir: Path, client: str | None = None, timeout: float = TIMEOUT_S) -> tuple[Path, bool]:
    """Write the merged scrontab to <cron>/runners/bsops.scrontab and install it when the client exists.

    Returns (file, installed). Without a client the file holds the block alone, to paste on a login node.
    """
    client = client or shutil.which("scrontab")
    settings = load_settings(cron_dir)
    new_block = block(cron_dir, settings)
    scripts = entry_scripts(cron_dir, settings)  # everything checked before anything is written
    folder = Path(cron_dir) / "runners"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bsops.scrontab"
    for script in scripts:
        write_runner(script)
    if client is None:
        path.write_text(new_block, encoding="utf-8")
        return path, False
    path.write_text(merge(read_current(client, timeout), new_block), encoding="utf-8")
    editor = folder / "scrontab-editor"
    editor.write_text(f"#!/bin/sh\n# The 'editor' bsops gives scrontab: it puts the merged crontab in place.\n"
                      f"exec cp -- {shlex.quote(str(path.resolve()))} \"$1\"\n", encoding="utf-8")
    editor.chmod(0o755)
    argv = [client, "-e"]
    proc = _run(argv, timeout=timeout, env={**os.environ, "VISUAL": str(editor.resolve()),
                                             "EDITOR": str(editor.resolve())})
    if proc.returncode != 0 or "errors in your crontab" in proc.stdout or "issue with the job" in proc.stdout:
        raise ScrontabError(f"`{shlex.join(argv)}` with the merged file {path} failed (exit code {proc.returncode}): "
                            f"{(proc.stderr + proc.stdout).strip() or '(no output)'}")
    return path, True


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        # stdin "n": scrontab asks "retry the edit? (y/n)" after an error instead of exiting.
        return slurm.run_unchecked(argv, timeout=timeout, env=env, input="n\n")
    except slurm.SlurmCommandError as exc:
        raise ScrontabError(str(exc)) from None  # `ARGV` could not run: the cause
