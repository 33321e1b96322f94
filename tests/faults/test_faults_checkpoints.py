"""Faults a cluster produces at a checkpoint, each on a real run of the trainer's ranks, each ended by the same
command (the relaunch of the same experiment) finishing the run with the uninterrupted run's iteration lines,
nothing deleted, and what was set aside recorded once for the watchdog's alert (checkpoints/set_aside.py).

The uninterrupted run is the session's golden run (28 iterations, saves at 2, 4, 6, 11, 16 and 28). Every case
starts from one prefix of it: the same experiment stopped by its exit interval at 26 (saves ... 16, 26, `latest`
26), copied into a folder of its own, then damaged as the fault round found checkpoints on real clusters:
- the newest checkpoint's files truncated, a byte flipped in one, a file added after the save: it is set aside
  with one line naming the file and the reason, and the run resumes from global_step16;
- `latest` missing, garbage, naming a tag before the first or past the end: the run resumes from global_step26,
  the newest verified checkpoint, saying so;
- checkpoints saved before manifests (no manifest.json, bsops.json without "commit"), the newest truncated: it is
  set aside and global_step16 adopted (its zip archives check out) and resumed from;
- the disk filling during the last save (the checkpoints folder on a small tmpfs): the task fails with one line,
  `latest` stays on global_step26; with room again the relaunch sets the partial save aside and finishes;
- a rank killed (SIGKILL, the fault switch BSOPS_KILL_IN_SAVE) right after DeepSpeed wrote its first file of the
  last save: the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bigscience_ops.checkpoints import layout, manifest, set_aside
from bigscience_ops.schema import Experiment
from tests.fixtures_matrix import iteration_lines
from tests.fixtures_trainer import GOLDEN_SAVE_SCHEDULE, concurrently, launch, run_ok, small_experiment, write_run

pytestmark = pytest.mark.slow

PREFIX_EXIT = 26
"""The prefix run stops (and saves) here; the golden run's previous save is at 16, its last at 28."""


def _experiment(out: Path, **checkpoint) -> Experiment:
    return small_experiment(out, checkpoint=dict(save_schedule=GOLDEN_SAVE_SCHEDULE, save_interval=10, **checkpoint))


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def _before_manifests(checkpoints: Path) -> None:
    """The checkpoints as a trainer before manifests left them: no manifest, bsops.json without the commit key."""
    for folder in checkpoints.glob("global_step*"):
        (folder / manifest.MANIFEST).unlink()
        meta = json.loads((folder / layout.META).read_text())
        meta.pop(layout.COMMIT_KEY)
        (folder / layout.META).write_text(json.dumps(meta))
    os.truncate(checkpoints / "global_step26" / "mp_rank_01_model_states.pt", 6900)


NEWEST = "global_step26"
DAMAGE = {
    # case: (what is done to the prefix's checkpoints, the step the relaunch resumes from, the file set aside)
    "truncated": (lambda c: os.truncate(c / NEWEST / "mp_rank_01_model_states.pt", 6900), 16,
                  "mp_rank_01_model_states.pt: is 6900 bytes, its manifest says"),
    "flipped": (lambda c: _flip(c / NEWEST / "layer_02-model_states.pt"), 16,
                "layer_02-model_states.pt: content differs from its manifest"),
    "added": (lambda c: (c / NEWEST / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x"), 16,
              "zero_pp_rank_0_mp_rank_00_optim_states.pt: is not in its manifest"),
    "latest missing": (lambda c: (c / layout.LATEST).unlink(), 26, None),
    "latest garbage": (lambda c: (c / layout.LATEST).write_bytes(b"\x00garbage"), 26, None),
    "latest before": (lambda c: (c / layout.LATEST).write_text("global_step1"), 26, None),
    "latest past the end": (lambda c: (c / layout.LATEST).write_text("global_step99"), 26, None),
    "before manifests": (_before_manifests, 16, "mp_rank_01_model_states.pt: not a whole zip archive"),
}


def _copy_prefix(prefix: Path, out: Path, checkpoints: Path | None = None, **checkpoint) -> Path:
    """The prefix run's checkpoints in a run folder of their own (at `checkpoints` if given), with the golden
    experiment (no exit interval) written for the relaunch."""
    exp = _experiment(out, **checkpoint)
    if checkpoints is not None:
        exp = small_experiment(out, checkpoint=dict(save_schedule=GOLDEN_SAVE_SCHEDULE, save_interval=10),
                               paths=dict(checkpoints=str(checkpoints)))
    target = Path(exp.paths.checkpoints)
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(prefix / "checkpoints", target, dirs_exist_ok=True, symlinks=True)
    write_run(exp, out)
    return target


def _damaged(prefix: Path, out: Path, case: str) -> dict:
    checkpoints = _copy_prefix(prefix, out)
    damage, _, _ = DAMAGE[case]
    damage(checkpoints)
    before = _files(checkpoints / NEWEST)
    return {"checkpoints": checkpoints, "before": before, "relaunch": launch(out, 2), "out": out}


@contextlib.contextmanager
def _small_disk(folder: Path, size: int) -> Iterator[None]:
    folder.mkdir(parents=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                          text=True, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"a small disk for the disk-full fault needs `mount -t tmpfs` (root): {proc.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


def _grow(folder: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True, capture_output=True, timeout=30)


def _pages(folder: Path) -> int:
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in folder.rglob("*") if p.is_file())


def _disk_full(prefix: Path, out: Path, mounts: contextlib.ExitStack) -> dict:
    """The last save (28) runs out of room half-way through the newest checkpoint's size; then room is made. The
    small disk stays mounted until the module's tests have read it (`mounts`)."""
    need = _pages(prefix / "checkpoints" / NEWEST)
    disk = out / "scratch"
    mounts.enter_context(_small_disk(disk, _pages(prefix / "checkpoints") + need // 2 + 64 * 4096))
    checkpoints = _copy_prefix(prefix, out, disk / "checkpoints")
    full = launch(out, 2)
    after_full = {"latest": layout.latest_tag(checkpoints), "partial": (checkpoints / "global_step28").is_dir()}
    _grow(disk, _pages(disk) + 4 * need)
    return {"checkpoints": checkpoints, "failed": full, "after_failure": after_full, "relaunch": launch(out, 2)}


def _killed_rank(prefix: Path, out: Path) -> dict:
    checkpoints = _copy_prefix(prefix, out)
    killed = launch(out, 2, env={"BSOPS_KILL_IN_SAVE": "1:28"})
    after_kill = {"latest": layout.latest_tag(checkpoints), "partial": (checkpoints / "global_step28").is_dir()}
    return {"checkpoints": checkpoints, "failed": killed, "after_failure": after_kill, "relaunch": launch(out, 2)}


@pytest.fixture(scope="module")
def faults(tmp_path_factory, golden_run) -> Iterator[dict]:
    prefix = tmp_path_factory.mktemp("prefix")
    write_run(_experiment(prefix, exit_interval=PREFIX_EXIT), prefix)
    run_ok(prefix, 2)
    assert layout.latest_tag(prefix / "checkpoints") == NEWEST
    with contextlib.ExitStack() as mounts:
        jobs = {"disk full": lambda: _disk_full(prefix, tmp_path_factory.mktemp("disk-full"), mounts),
                "killed rank": lambda: _killed_rank(prefix, tmp_path_factory.mktemp("killed-rank"))}
        for case in DAMAGE:
            jobs[case] = lambda case=case: _damaged(prefix, tmp_path_factory.mktemp(case.replace(" ", "-")), case)
        yield {"golden": iteration_lines(golden_run[2].stdout), **concurrently(jobs)}


def _finished_as_uninterrupted(result: dict, golden: dict[int, dict], resumed_at: int) -> None:
    relaunch = result["relaunch"]
    assert relaunch.returncode == 0, relaunch.stdout[-3000:] + relaunch.stderr[-3000:]
    assert f"> resumed from {result['checkpoints'] / f'global_step{resumed_at}'}: iteration {resumed_at}" \
        in relaunch.stdout
    lines = iteration_lines(relaunch.stdout)
    assert lines and lines == {i: golden[i] for i in golden if i > resumed_at}
    assert layout.latest_tag(result["checkpoints"]) == "global_step28"
    assert [c.step for c in layout.complete_checkpoints(result["checkpoints"])][-1] == 28


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_checkpoint_or_latest_is_set_aside_and_the_same_command_finishes_the_run(faults, case):
    result = faults[case]
    _, resumed_at, named = DAMAGE[case]
    _finished_as_uninterrupted(result, faults["golden"], resumed_at)
    said = [line for line in result["relaunch"].stdout.splitlines() if "set aside" in line]
    records = set_aside.read_checked(result["checkpoints"])
    assert records.problems == []
    if named is None:  # nothing to set aside: the newest verified checkpoint, and one line saying why
        assert said == [] and records.records == []
        assert "resuming from global_step26, the newest verified checkpoint" in result["relaunch"].stdout
        return
    [line] = said
    assert named in line and NEWEST in line
    [record] = records.records
    assert record.tag == NEWEST and named in record.reason
    assert _files(Path(record.folder)) == result["before"]  # moved whole, as it was: nothing deleted


@pytest.mark.parametrize("case", ["disk full", "killed rank"])
def test_a_save_cut_short_never_becomes_latest_and_the_relaunch_finishes_the_run(faults, case):
    result = faults[case]
    failed = result["failed"]
    assert failed.returncode != 0, failed.stdout[-2000:] + failed.stderr[-3000:]
    if case == "disk full":
        errors = [line for line in failed.stderr.splitlines() if line.startswith("error: saving global_step28")]
        assert errors and "Traceback" not in failed.stderr.split(errors[0])[0]  # one line per rank that hit it
        assert all("no space left on device" in e.lower() and "`latest` still names global_step26" in e for e in errors)
    assert result["after_failure"] == {"latest": NEWEST, "partial": True}
    _finished_as_uninterrupted(result, faults["golden"], PREFIX_EXIT)
    [record] = set_aside.read_checked(result["checkpoints"]).records
    assert record.tag == "global_step28" and "no manifest: the save did not finish" in record.reason
    assert Path(record.folder).is_dir() and any(Path(record.folder).iterdir())  # what was written is kept


def test_the_watchdog_tells_each_checkpoint_set_aside_once(faults, plain_server):
    """The fault's one alert: the watchdog's passes after the relaunch tell the on-call person once what was set
    aside, naming the file and why; the next pass (its cooldown long over) tells nothing more of it."""
    from datetime import datetime, timedelta

    from bigscience_ops.config.loading import from_dict
    from bigscience_ops.ops.watch import lifecycle, watchdog
    from tests.fixtures_smtp import plain_outbox

    inbox, port = plain_server
    out = faults["truncated"]["out"]
    exp = from_dict(json.loads((out / "experiment.json").read_text()))
    now = datetime.now()
    for hours in (0, 6):
        settings = watchdog.WatchSettings(exp.slurm.job_name, log_path=out / "logs" / "main_log.txt",
                                          outbox=plain_outbox(port), experiment=exp.name, state_path=out / "alerts.json",
                                          cooldown_minutes=60)
        watchdog.watch(settings, query=lambda **_: [], now=now + timedelta(hours=hours), run=lifecycle.run_state(exp))
    told = [m for m in inbox.messages if m["Subject"].lstrip().startswith("[ALERT]") and NEWEST in m.get_content()
            and "set aside" in m.get_content()]  # the run's [FINISHED] mail lists the lines of its pass too
    assert len(told) == 1 and "mp_rank_01_model_states" in told[0].get_content() and "told once" in \
        told[0].get_content(), [(m["Subject"], m.get_content()[:1500]) for m in told]
