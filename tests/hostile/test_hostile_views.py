"""Views and indexes that could believe the wrong source: the table of hostile inputs to `bsops runs`, `info` and
`chronicle`, each through the public CLI.

The runs index only says where runs are: a line that claims another experiment or job than the run's own record is
shown as the record says and flagged; a line that is not a launch (a forged name, a job id with letters, a huge,
torn, binary or nested line) is skipped and counted by what was wrong, never dropped in silence; an index over the
read cap is read from its newest end and its older lines counted. `info` and `chronicle` take backup and eval
settings from the experiment file, never from the launch record, and count a result file only for a checkpoint the
run has. The runs are written as launches leave them (a record, a ledger, checkpoints): nothing trains here.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.run import ledger
from bigscience_ops.run import index as runs_index
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment, to_dict
from bigscience_ops.run.ledger import TaskRecord
from bigscience_ops.views import runs as runs_view
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_runs import commit_checkpoint, complete_checkpoint
from tests.evaluate.test_ops_evaluate_results import write_results

EVIL_LINK = "[verify your token](https://evil.example/login)"
UNSAFE = ("\u2028", "\u2029", "\x1b", "\u202e", "\x00", "\x85")
"""Characters no line of `bsops runs` may hold raw: they fake a line, a terminal command or the text's direction."""


def _local_run(trainings: Path, folder: Path, name: str = "small") -> Path:
    """A run of `name` launched --local into `folder`, as the launch leaves it: its record in the folder, a task of
    array 777 in its ledger, a checkpoint at 5; no index line yet."""
    (trainings / f"{name}.yaml").write_text(tiny_yaml(folder))
    folder.mkdir(parents=True)
    (folder / "experiment.json").write_text(json.dumps(to_dict(load_experiment(name, trainings))))
    ledger.append(folder / ledger.LEDGER_NAME, TaskRecord("begin", "777_1", "n1", 0, time.time() - 60))
    ledger.append(folder / ledger.LEDGER_NAME, TaskRecord("end", "777_1", "n1", 5, time.time() - 30, 0))
    complete_checkpoint(load_experiment(name, trainings), 5)
    return folder


def _line(folder: Path | str, experiment: str = "small", job: str = "local", job_id: str | None = "777",
          when: float | None = None) -> dict:
    return {"time": time.time() if when is None else when, "experiment": experiment, "folder": str(folder), "job": job,
            "job_id": job_id}


def _index(*lines: bytes | dict) -> Path:
    """The test's runs index holding `lines` (a dict is one JSON line; bytes are written as they are)."""
    path = runs_index.index_path()
    with open(path, "ab") as handle:
        for line in lines:
            handle.write(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n")
    return path


def _runs() -> tuple[dict, str]:
    """`bsops runs --json` and `bsops runs`: the data and the text, each exiting 0."""
    as_json = CliRunner().invoke(main, ["runs", "--json"])
    text = CliRunner().invoke(main, ["runs"])
    assert as_json.exit_code == 0 and text.exit_code == 0, as_json.output + text.output
    assert not any(c in text.output for c in UNSAFE), text.output
    return json.loads(as_json.stdout), text.output


def _json(value) -> bytes:
    return json.dumps(value).encode() + b"\n"


# Each row: an index line that is not a launch, and the kind it is counted under. The real run's line is beside it.
HOSTILE_LINES = {
    "experiment-html": (lambda f: _json(_line(f, "<img src=x onerror=alert(1)>")), "bad experiment"),
    "experiment-markdown-link": (lambda f: _json(_line(f, EVIL_LINK)), "bad experiment"),
    "experiment-u2028": (lambda f: _json(_line(f, "small\u2028Subject: urgent")), "bad experiment"),
    "experiment-bidi": (lambda f: _json(_line(f, "\u202etxt.exe")), "bad experiment"),
    "experiment-reserved": (lambda f: _json(_line(f, "bsops.small.backup")), "bad experiment"),
    "experiment-path": (lambda f: _json(_line(f, "../../etc/passwd")), "bad experiment"),
    "job-id-letters": (lambda f: _json(_line(f, job_id="4242abc")), "bad job_id"),
    "job-id-shell": (lambda f: _json(_line(f, job_id="4242; rm -rf ~")), "bad job_id"),
    "job-id-two-tasks": (lambda f: _json(_line(f, job_id="1_2_3")), "bad job_id"),
    "job-id-a-number": (lambda f: _json({**_line(f), "job_id": 4242}), "bad job_id"),
    "job-unknown": (lambda f: _json(_line(f, job="sbatch --wrap=x")), "bad job"),
    "folder-relative": (lambda f: _json(_line("runs/small")), "bad folder"),
    "folder-u2028": (lambda f: _json(_line(f"{f}\u2028x")), "bad folder"),
    "folder-nul": (lambda f: _json(_line(f"{f}\x00")), "bad folder"),
    "time-nan": (lambda f: b'{"time": NaN, "experiment": "small", "folder": "/x", "job": "local"}\n', "bad time"),
    "time-huge": (lambda f: _json({**_line(f), "time": 1e308}), "bad time"),
    "unknown-field": (lambda f: _json({**_line(f), "html": "<b>"}), "unknown fields"),
    "missing-folder": (lambda f: _json({"time": 1.0, "experiment": "small", "job": "local"}), "missing fields"),
    "huge-line": (lambda f: _json(_line(f, "x" * (1 << 20))), "too long"),
    "torn-last-line": (lambda f: _json(_line(f))[:40], "cut short"),
    "not-utf8": (lambda f: b'{"time": 1, "experiment": "\xff\xfe"}\n', "not UTF-8 text"),
    "json-list": (lambda f: b'["small", "/x"]\n', "a JSON list, not a record"),
    "nested-deep": (lambda f: b"[" * 20_000 + b"]" * 20_000 + b"\n", "not a JSON record"),
    "ansi-after-json": (lambda f: _json(_line(f))[:-1] + b"\x1b[2J\n", "not a JSON record"),
}


@pytest.mark.parametrize("case", HOSTILE_LINES)
def test_an_index_line_that_is_not_a_launch_is_skipped_and_counted(case, trainings: Path, tmp_path: Path):
    run = _local_run(trainings, tmp_path / "run")
    make, kind = HOSTILE_LINES[case]
    _index(_line(run, when=time.time() - 100), make(run))
    data, text = _runs()
    [row] = data["runs"]
    assert (row["experiment"], row["folder"], row["state"], row["job"], row["job_id"]) == (
        "small", str(run), "stopped", "local", "777")
    assert (data["skipped"], data["skipped_lines"]) == ({kind: 1}, 1)
    assert f"1 index line(s) skipped: 1 {kind}" in text
    assert "https://" not in json.dumps(data["runs"]) and "<img" not in json.dumps(data["runs"])
    assert "https://" not in text and "](" not in text  # a problem's excerpt of the line: no live link


def test_a_forged_index_line_shows_the_runs_own_record_and_is_flagged(trainings: Path, tmp_path: Path):
    """`tr1-13B` on Slurm for a local run of `small`: the record's experiment and job are shown, the claim beside."""
    run = _local_run(trainings, tmp_path / "run")
    _index(_line(run, "tr1-13B", "slurm", "4242"))
    data, text = _runs()
    [row] = data["runs"]
    assert (row["experiment"], row["job"], row["job_id"], row["from_record"]) == ("small", "local", "777", True)
    assert row["index_says"] == ["experiment tr1-13B", "job slurm 4242"]
    listed = next(line for line in text.splitlines() if str(run) in line)
    assert listed.split()[0] == "small" and "tr1-13B" not in listed
    assert "index says: experiment tr1-13B, job slurm 4242" in text


def test_a_slurm_runs_job_id_is_sbatchs_answer_and_a_forged_answer_is_not_shown(trainings: Path, tmp_path: Path):
    run = tmp_path / "slurm-run"
    (trainings / "onslurm.yaml").write_text(tiny_yaml(run))
    launch = run / "launches" / "20260101-000000"
    launch.mkdir(parents=True)
    (launch / "experiment.json").write_text(json.dumps(to_dict(load_experiment("onslurm", trainings))))
    (launch / "sbatch.json").write_text(json.dumps({"argv": ["sbatch"], "job_id": "5151"}))
    _index(_line(run, "onslurm", "slurm", "4242"))
    [row] = _runs()[0]["runs"]
    assert (row["job"], row["job_id"], row["index_says"]) == ("slurm", "5151", ["job slurm 4242"])
    (launch / "sbatch.json").write_text(json.dumps({"job_id": f"5151\u2028{EVIL_LINK}"}))
    data, text = _runs()
    [row] = data["runs"]
    assert row["job_id"] is None and len(row["problems"]) == 1 and "sbatch.json: job_id" in row["problems"][0]
    assert "https://" not in text and "hxxps" in text  # said as an excerpt of what the file held, defanged
    (launch / "sbatch.json").unlink()
    (launch / "sbatch.json").symlink_to(tmp_path / "elsewhere.json")
    [row] = _runs()[0]["runs"]
    assert row["job_id"] is None and "link" in row["problems"][0]


def test_a_200000_line_index_is_read_from_its_newest_end_and_the_rest_is_counted(monkeypatch, tmp_path: Path):
    """200,000 launches of 200,000 folders over the read cap (shrunk to 2 MiB here: the same path as 64 MiB): the
    newest lines are read, every older one counted, the folders past --limit counted: 200,000 in all, said."""
    monkeypatch.setattr(runs_index, "MAX_READ", 2 << 20)
    line = '{"time": %d, "experiment": "tr1-13B", "folder": "%s/gone/%d", "job": "slurm", "job_id": "%d"}\n'
    _index("".join(line % (1.7e9 + i, tmp_path, i, 10**6 + i) for i in range(200_000)).encode())
    data, text = _runs()  # the bounded read shows in unread_lines below, not in a time
    read = len(data["runs"]) + data["not_shown"]
    assert data["unread_lines"] > 0 and data["unread_lines"] + read == 200_000 and data["skipped_lines"] == 0
    assert len(data["runs"]) == runs_view.MAX_ROWS and data["runs"][0]["folder"] == f"{tmp_path}/gone/199999"
    assert f"{data['unread_lines']} older index line(s) not read" in text
    assert f"{data['not_shown']} older run folder(s) of the index not shown" in text


def test_a_line_repeated_a_thousand_times_is_one_run_launched_a_thousand_times(trainings: Path, tmp_path: Path):
    run = _local_run(trainings, tmp_path / "run")
    _index(_json(_line(run, when=1.7e9)) * 1000)
    data, text = _runs()
    [row] = data["runs"]
    assert row["launches"] == 1000 and data["skipped_lines"] == 0 and "launched 1000 times" in text


def test_a_run_folder_that_is_a_link_is_not_followed(trainings: Path, tmp_path: Path):
    run = _local_run(trainings, tmp_path / "run")
    (tmp_path / "alias").symlink_to(run)
    _index(_line(tmp_path / "alias", "tr1-13B"))
    [row] = _runs()[0]["runs"]
    assert (row["state"], row["from_record"], row["iteration"]) == ("unreadable", False, None)
    assert "symbolic link" in row["detail"]


@pytest.mark.parametrize("kind", ["link", "fifo", "folder"])
def test_an_index_that_is_not_a_plain_file_is_not_read_and_says_so(kind, trainings: Path, tmp_path: Path):
    run = _local_run(trainings, tmp_path / "run")
    real = tmp_path / "real-index.jsonl"
    real.write_text(json.dumps(_line(run)) + "\n")
    index = runs_index.index_path()
    {"link": lambda: index.symlink_to(real), "fifo": lambda: os.mkfifo(index), "folder": index.mkdir}[kind]()
    data, text = _runs()
    assert data["runs"] == [] and data["index_read"] is False and "the runs index was not read" in text
    assert "no runs launched yet" not in text


def test_a_record_that_lies_or_is_a_link_makes_the_run_unreadable_not_renamed(trainings: Path, tmp_path: Path):
    run = _local_run(trainings, tmp_path / "run")
    record = json.loads((run / "experiment.json").read_text())
    (run / "experiment.json").write_text(json.dumps({**record, "name": "<b>tr1-13B</b>"}))
    _index(_line(run))
    [row] = _runs()[0]["runs"]
    assert (row["state"], row["experiment"], row["from_record"]) == ("unreadable", "small", False)
    (run / "experiment.json").unlink()
    (tmp_path / "other.json").write_text(json.dumps(record))
    (run / "experiment.json").symlink_to(tmp_path / "other.json")
    [row] = _runs()[0]["runs"]
    assert row["state"] == "unreadable" and "link" in row["detail"]


# --- info and chronicle: settings from the experiment file, results only for checkpoints the run has ------------------

def _backed_up_run(trainings: Path, tmp_path: Path, record_dest: str | None, file_dest: str | None):
    """A run whose launch record names `record_dest` as backup.dest and whose experiment file now names `file_dest`;
    checkpoints 5 and 10 backed up into `file_dest` (when set)."""
    from bigscience_ops.ops.keep import backup

    run = tmp_path / "run"

    def write(dest: str | None) -> None:
        (trainings / "late.yaml").write_text(tiny_yaml(run, f"backup: {{dest: {json.dumps(dest)}}}\n" if dest else ""))

    write(record_dest)
    run.mkdir()
    (run / "experiment.json").write_text(json.dumps(to_dict(load_experiment("late", trainings))))
    write(file_dest)
    exp = load_experiment("late", trainings)
    for step in (5, 10):
        complete_checkpoint(exp, step)
        (Path(exp.paths.checkpoints) / f"global_step{step}" / "layer_00-model_states.pt").write_bytes(bytes(step))
        commit_checkpoint(Path(exp.paths.checkpoints) / f"global_step{step}")  # the layer file is the save's
    if file_dest:
        backup.run_backup(backup.settings(exp))
    return run, exp


@pytest.mark.parametrize("named", ["experiment", "folder"])
def test_info_shows_a_backup_configured_after_the_launch(named, trainings: Path, tmp_path: Path):
    run, exp = _backed_up_run(trainings, tmp_path, None, str(tmp_path / "store"))
    assert json.loads((run / "experiment.json").read_text())["backup"]["dest"] is None  # the launch knew none
    name = "late" if named == "experiment" else str(run)
    result = CliRunner().invoke(main, ["info", name, "--trainings-dir", str(trainings), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)["backup"]
    assert (shown["last"], shown["copies"], shown["step"]) == ("global_step10", 2, 10)
    text = CliRunner().invoke(main, ["info", name, "--trainings-dir", str(trainings)]).output
    assert "backup:      global_step10 (weights-only)" in text and "backup:      none" not in text
    page = CliRunner().invoke(main, ["chronicle", name, "--trainings-dir", str(trainings)]).stdout
    assert "backup: 2 checkpoint(s) copied and verified" in page


def test_a_store_named_only_by_the_launch_record_is_not_read(trainings: Path, tmp_path: Path):
    """The record names a store (with copies in it); the experiment file names none: info and chronicle read none."""
    from bigscience_ops.ops.keep import backup

    run, exp = _backed_up_run(trainings, tmp_path, str(tmp_path / "store"), None)
    recorded = load_experiment("late", trainings)
    import dataclasses

    backup.run_backup(backup.settings(dataclasses.replace(recorded, backup=dataclasses.replace(recorded.backup,
                                                                              dest=str(tmp_path / "store")))))
    result = CliRunner().invoke(main, ["info", str(run), "--trainings-dir", str(trainings), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["backup"]["note"] == "backup.dest is not set"
    page = CliRunner().invoke(main, ["chronicle", str(run), "--trainings-dir", str(trainings)]).stdout
    assert "backup:" not in page


def test_with_no_experiment_file_info_says_so_and_reads_no_store(trainings: Path, tmp_path: Path):
    run, exp = _backed_up_run(trainings, tmp_path, str(tmp_path / "store"), str(tmp_path / "store"))
    (trainings / "late.yaml").unlink()
    result = CliRunner().invoke(main, ["info", str(run), "--trainings-dir", str(trainings), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["backup"]["note"] == "backup.dest is not set"
    assert "no experiment file of 'late' loads here" in result.stderr


@pytest.mark.parametrize("case", ["never-saved", "linked-checkpoint", "unfinished-save"])
def test_a_result_for_a_checkpoint_the_run_does_not_have_is_not_counted(case, trainings: Path, tmp_path: Path):
    run = _local_run(trainings, tmp_path / "run")
    checkpoints = run / "checkpoints"
    if case == "linked-checkpoint":  # a folder of another run's, linked in under a step this run never saved
        (tmp_path / "other" / "global_step84").mkdir(parents=True)
        (tmp_path / "other" / "global_step84" / "bsops.json").write_text('{"iteration": 84}')
        (checkpoints / "global_step84").symlink_to(tmp_path / "other" / "global_step84")
    elif case == "unfinished-save":
        (checkpoints / "global_step84").mkdir()  # no bsops.json: the save never finished
    write_results(run, {5: {"smoke_choice/acc": 0.5}, 84: {"smoke_choice/acc": 0.01}})
    info = CliRunner().invoke(main, ["info", str(run), "--trainings-dir", str(trainings), "--json"])
    assert info.exit_code == 0, info.output
    data = json.loads(info.stdout)
    assert data["evaluation"]["steps"] == [5]
    assert any("global_step84.json" in p and "no checkpoint of" in p for p in data["problems"])
    page = CliRunner().invoke(main, ["chronicle", str(run), "--trainings-dir", str(trainings)]).stdout
    table = page.split("## Evaluation")[1].split("## Records not read")[0]
    assert "step 5" in table and "step 84" not in table and "0.0100" not in table
    assert "`eval/global_step84.json`: a result of step 84" in page.split("## Records not read")[1]


def test_runs_reads_no_backup_store_a_record_names(trainings: Path, tmp_path: Path):
    """A record rewritten to name another store (whose manifest is damaged): `runs` opens nothing there."""
    from bigscience_ops.checkpoints import layout

    run = _local_run(trainings, tmp_path / "run")
    record = json.loads((run / "experiment.json").read_text())
    record["backup"]["dest"] = str(tmp_path / "their-store")
    (run / "experiment.json").write_text(json.dumps(record))
    run_id = layout.ensure_run_id(run / "checkpoints")
    (tmp_path / "their-store" / "small" / run_id).mkdir(parents=True)
    (tmp_path / "their-store" / "small" / run_id / "global_step5.manifest.json").write_text("{not json")
    _index(_line(run))
    [row] = _runs()[0]["runs"]
    assert (row["state"], row["problems"]) == ("stopped", [])
