"""slurm/output.py: the parsers of real Slurm output, on output recorded from Slurm 22.05.

squeue's delimited records (each ended by a per-query terminator), durations and time limits, sbatch's
answers, `scontrol --oneliner show job`, sacct, sinfo's partitions and `scontrol show config`. The recordings
are in tests/assets/slurm/ (re-record: see its README.md; record_answers.py for sacct, sinfo and the config).
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from bigscience_ops import slurm
from bigscience_ops.errors import BsopsError
from bigscience_ops.slurm import SQUEUE_DELIMITER as D
from tests.fixtures_slurm import RECORDED as ASSETS
from tests.fixtures_slurm import recorded_squeue, recorded_terminator

LONG_NAME = "tr1-13B-round3-a-job-name-longer-than-forty-characters"
T = "0123456789abcdef0123456789abcdef"
"""The record terminator of the hand-written squeue outputs below (a real query draws its own)."""


def squeue_text(*records: list[str], terminator: str = T) -> str:
    """What squeue prints for these records: each ended by the delimiter, the terminator and a newline."""
    return "".join(D.join([*fields, terminator]) + "\n" for fields in records)


def fields(job: str, name: str, **changed: str) -> list[str]:
    """Pending job `job`'s fields in SQUEUE_FIELDS order (name last), with some `changed`."""
    values = {"job_id": job, "array_job_id": job, "array_task": "N/A", "own_id": job, "user": "u",
              "state": "PENDING", "reason": "Priority", "partition": "p", "num_nodes": "1", "nodes": "",
              "elapsed": "0:00", "time_limit": "1:00", "start_time": "N/A", "submit_time": "2026-01-01T00:00:00",
              "dependency": "(null)", "name": name, **changed}
    return [values[key] for key, _ in slurm.SQUEUE_FIELDS]


@pytest.fixture(scope="module")
def recorded() -> list[slurm.Job]:
    return recorded_squeue("squeue.txt")


@pytest.fixture(scope="module")
def ids() -> dict[str, str]:
    return json.loads((ASSETS / "ids.json").read_text())


def test_recording_matches_the_current_squeue_format() -> None:
    # A changed SQUEUE_FIELDS needs a new recording: tests/assets/slurm/README.md says how.
    assert (ASSETS / "squeue.format").read_text() == slurm.squeue_format(recorded_terminator())
    assert not recorded_squeue("squeue.txt").unparsed


def test_every_pending_reason_is_parsed(recorded: list[slurm.Job], ids: dict[str, str]) -> None:
    by_id = {j.job_id: j for j in recorded}
    expect = {
        "dependency": "Dependency", "begin": "BeginTime", "held_user": "JobHeldUser",
        "held_admin": "JobHeldAdmin", "partition_down": "PartitionDown", "resources": "Resources",
        "priority": "Priority", "never": "DependencyNeverSatisfied",
    }
    for key, reason in expect.items():
        job = by_id[ids[key]]
        assert (job.state, job.reason) == ("PENDING", reason), key
    assert by_id[ids["partition_down"]].partition == "bsops-down"
    assert by_id[ids["never"]].dependency == f"afterok:{ids['failed']}(failed)"
    assert by_id[ids["begin"]].start_time is not None and by_id[ids["never"]].start_time is None


def test_array_ids_and_long_names(recorded: list[slurm.Job], ids: dict[str, str]) -> None:
    array = [j for j in recorded if j.array_job_id == ids["array"]]
    running = [j for j in array if j.state == "RUNNING"]
    rest = [j for j in array if j.state == "PENDING"]
    assert len(running) == 1 and len(rest) == 1
    assert running[0].job_id == f"{ids['array']}_1" and running[0].array_task == "1"
    assert running[0].nodes and running[0].num_nodes == 1 and running[0].reason == "None"
    assert rest[0].job_id == f"{ids['array']}_[2-5%1]" and rest[0].array_task == "2-5%1"
    assert rest[0].reason == "JobArrayTaskLimit"
    chained = next(j for j in recorded if j.array_job_id == ids["chained_array"])
    assert chained.job_id == f"{ids['chained_array']}_[1-5%1]"
    assert chained.reason == "Dependency" and chained.dependency == f"afterany:{ids['array']}_*(unfulfilled)"
    assert {j.name for j in array} == {LONG_NAME} and len(LONG_NAME) > 40
    assert chained.name == LONG_NAME


def test_names_with_spaces_and_pipes_survive(recorded: list[slurm.Job], ids: dict[str, str]) -> None:
    odd = next(j for j in recorded if j.job_id == ids["odd_name"])
    assert odd.name == "rec name with spaces | and a pipe"


def test_times_and_limits(recorded: list[slurm.Job]) -> None:
    for job in recorded:
        assert job.time_limit_min == 5
        assert isinstance(job.submit_time, datetime)
        assert job.elapsed_s >= 0


def test_lines_shaped_like_the_seed_report() -> None:
    # Values from the tr1-13B on-call report (Jean Zay): a long-running task of a bigger array.
    nodes = "r7i4n[1-7],r7i7n[1-8],r8i0n0,r8i5n[3-8]"
    line = ["711114_4", "711114", "4", "711200", "stas", "RUNNING", "None", "gpu_p13", "48", nodes,
            "18:15:59", "20:00:00", "2021-08-16T03:52:02", "2021-08-12T10:00:00", "(null)", "tr1-13B-round3"]
    pending = ["682842_[1-5%1]", "682842", "1-5%1", "682842", "stas", "PENDING", "Dependency", "gpu_p13", "48",
               "", "0:00", "UNLIMITED", "N/A", "2021-08-16T20:00:00", "afterany:711114_*(unfulfilled)",
               "tr1-13B-round3"]
    running, waiting = slurm.parse_squeue(squeue_text(line, pending), T)
    assert (running.job_id, running.array_job_id, running.array_task) == ("711114_4", "711114", "4")
    assert running.elapsed_s == 18 * 3600 + 15 * 60 + 59 and running.nodes == nodes
    assert running.start_time == datetime(2021, 8, 16, 3, 52, 2) and running.time_limit_min == 1200
    assert waiting.job_id == "682842_[1-5%1]" and waiting.time_limit_min is None


def test_a_name_can_never_make_a_record() -> None:
    """A name holding a newline and a whole record (the old line format, or with a guessed terminator)
    stays inside its own job's record: that job is skipped and counted, its neighbours are kept."""
    forged = D.join(fields("999", "tr1-13B", user="victim", state="RUNNING", reason="None", nodes="n1"))
    hostile = [f"x\n{forged}\n", f"y\n{forged}{D}{'f' * 32}\nz"]
    text = squeue_text(fields("5", "before"), *(fields(str(6 + i), name) for i, name in enumerate(hostile)),
                       fields("9", "after"))
    jobs = slurm.parse_squeue(text, T)
    assert [(j.job_id, j.name) for j in jobs] == [("5", "before"), ("9", "after")]
    assert jobs.unparsed == tuple(f"job {6 + i} of u named {name}" for i, name in enumerate(hostile))


@pytest.mark.parametrize("name", ["a\u2028b", "c\u2029d", "e\x85f", "g\x1eh", "i\x0bj", "k\x0cl", "m\nn",
                                  f"odd{D}name", "tab\there", "\x9bcsi"])
def test_a_name_with_a_control_character_or_line_break_is_skipped_and_counted(name: str) -> None:
    jobs = slurm.parse_squeue(squeue_text(fields("5", name), fields("6", "tr1-13B")), T)
    assert [j.name for j in jobs] == ["tr1-13B"] and jobs.unparsed == (f"job 5 of u named {name}",)
    assert slurm.unparsed_note(jobs).startswith("1 squeue entry did not parse and was skipped: 'job 5 of u")


def test_names_with_spaces_pipes_and_any_printable_text_are_kept() -> None:
    names = ["rec name with spaces | and a pipe", "caf\u00e9 \u2014 \u6587\u5b57", "#SBATCH --x", "'\"\\$(x)"]
    jobs = slurm.parse_squeue(squeue_text(*(fields(str(i), n) for i, n in enumerate(names))), T)
    assert [j.name for j in jobs] == names and not jobs.unparsed


def test_output_that_is_not_squeues_record_is_an_error_never_fewer_jobs() -> None:
    """Everything before a name is Slurm's own text: a record whose fields do not parse, a header, a cut-off
    tail or another query's terminator means the answer is not squeue's as asked. The queue is then unknown
    (SlurmOutputError, which carries the output), never read as the jobs that did parse."""
    header = "JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)\n"
    with pytest.raises(slurm.SlurmOutputError) as info:
        slurm.parse_squeue(header, T)
    assert info.value.output == header and info.value.tool == "squeue"
    assert isinstance(info.value, slurm.SlurmError)
    good = fields("6", "fine")
    for changed in ({"num_nodes": "one"}, {"own_id": "5x"}, {"num_nodes": "1x"}, {"job_id": "5\n6"},
                    {"state": "running"}, {"array_job_id": ""}, {"elapsed": "soon"}, {"time_limit": "1:xx"},
                    {"start_time": "2026-13-45T00:00:00"}):
        with pytest.raises(slurm.SlurmOutputError) as info:
            slurm.parse_squeue(squeue_text(fields("5", "n", **changed), good), T)
        assert info.value.output == D.join(fields("5", "n", **changed)), changed
    cut = squeue_text(good) + D.join(fields("7", "cut"))[:40]
    with pytest.raises(slurm.SlurmOutputError) as info:
        slurm.parse_squeue(cut, T)
    assert info.value.output == D.join(fields("7", "cut"))[:40]
    with pytest.raises(slurm.SlurmOutputError):  # another query's terminator: nothing is a record
        slurm.parse_squeue(squeue_text(good), "f" * 32)
    assert [j.name for j in slurm.parse_squeue(squeue_text(good), T)] == ["fine"]


def test_squeues_invalid_durations_are_read() -> None:
    """squeue prints INVALID for a duration below zero or above a year (its _print_secs): a time limit of more
    than a year is no limit, such an elapsed time 0; neither makes the queue unreadable."""
    [job] = slurm.parse_squeue(squeue_text(fields("5", "long", elapsed="INVALID", time_limit="INVALID")), T)
    assert (job.elapsed_s, job.time_limit_min) == (0, None)


def test_recorded_queue_with_hostile_names() -> None:
    """tests/assets/slurm/squeue-hostile-names.txt, recorded on the test cluster by record_hostile_names.py:
    jobs named with U+2028, U+2029, U+0085, U+001E, VT, FF, a real newline, the field delimiter, and two
    jobs of another user whose names hold a forged RUNNING record of tr1-13B. Only the real tr1-13B job
    is a record; the ten others are skipped and counted."""
    jobs = recorded_squeue("squeue-hostile-names.txt")
    assert [(j.name, j.user, j.state, j.reason) for j in jobs] == [("tr1-13B", "root", "PENDING", "JobHeldUser")]
    assert len(jobs.unparsed) == 10
    assert sum(line.startswith("job ") and " of nobody named " in line for line in jobs.unparsed) == 2
    assert slurm.unparsed_note(jobs).startswith("10 squeue entries did not parse and were skipped: ")
    assert issubclass(slurm.SlurmError, BsopsError)


def test_the_format_ends_each_record_with_a_terminator_that_is_never_in_argv() -> None:
    one, two = slurm.new_terminator(), slurm.new_terminator()
    assert one != two and len(one) == 32
    assert slurm.squeue_format(one).endswith(D + one) and slurm.squeue_format(one).startswith("%i" + D)
    assert slurm.squeue_env(one) == {"SQUEUE_FORMAT": slurm.squeue_format(one)}
    assert not any(one in arg or "--format" in arg for arg in slurm.squeue_argv(users=["u"], name="n"))
    for weak in ("", "abc", "x" * 32, "\n" + "a" * 32):
        with pytest.raises(ValueError, match="terminator"):
            slurm.squeue_format(weak)


@pytest.mark.parametrize(("text", "seconds"), [
    ("0:00", 0), ("0:05", 5), ("59:59", 3599), ("18:15:59", 65759), ("1-02:03:04", 93784),
    ("12-00:00:00", 12 * 86400),
])
def test_durations_round_trip(text: str, seconds: int) -> None:
    assert slurm.parse_duration(text) == seconds
    assert slurm.parse_duration(slurm.format_duration(seconds)) == seconds


def test_duration_errors_and_negative_waits() -> None:
    with pytest.raises(ValueError, match="duration"):
        slurm.parse_duration("soon")
    assert slurm.format_duration(-5) == "0:00:00"
    assert slurm.format_duration(65759) == "18:15:59"


def test_sbatch_answers() -> None:
    assert slurm.parse_sbatch_parsable("712\n") == "712"
    assert slurm.parse_sbatch_parsable("712;jeanzay\n") == "712"
    with pytest.raises(slurm.SlurmError, match="expected a job id"):
        slurm.parse_sbatch_parsable("sbatch: error: Batch job submission failed\n")
    answer = slurm.parse_sbatch_test_only((ASSETS / "sbatch_test_only.stderr").read_text())
    assert answer.partition == "bsops" and answer.processors == 1 and answer.nodes
    assert isinstance(answer.start_time, datetime)
    with pytest.raises(slurm.SlurmError, match="to start at"):
        slurm.parse_sbatch_test_only("sbatch: error: invalid partition specified: nope\n")


def test_scontrol_show_job(ids: dict[str, str]) -> None:
    records = slurm.parse_scontrol_show_job((ASSETS / "scontrol_show_job.txt").read_text())
    array = [r for r in records if r.get("ArrayJobId") == ids["array"]]
    assert {r["JobName"] for r in array} == {LONG_NAME}
    assert {r["JobState"] for r in array} == {"PENDING", "RUNNING"}
    pending = next(r for r in array if r["JobState"] == "PENDING")
    assert pending["ArrayTaskId"] == "2-5%1" and pending["Reason"] == "JobArrayTaskLimit"
    never = next(r for r in records if r["JobId"] == ids["never"])
    assert never["Reason"] == "DependencyNeverSatisfied"
    assert never["Dependency"] == f"afterok:{ids['failed']}(failed)"
    assert never["TRES"].startswith("cpu=1")  # values containing '=' stay whole
    assert "Invalid job id" in (ASSETS / "scontrol_unknown_job.stderr").read_text()




# --- squeue: the format, every field of a recorded record, the state sets --------------------------------------

def test_the_format_lists_the_fields_in_order_with_the_name_last() -> None:
    assert slurm.squeue_format(T).split(D) == [code for _, code in slurm.SQUEUE_FIELDS] + [T]
    assert slurm.SQUEUE_FIELDS[-1] == ("name", "%j")
    assert len({code for _, code in slurm.SQUEUE_FIELDS}) == len(slurm.SQUEUE_FIELDS)


def test_every_field_of_a_recorded_running_task(recorded: list[slurm.Job], ids: dict[str, str]) -> None:
    [task] = [j for j in recorded if j.job_id == f"{ids['array']}_1"]
    assert task == slurm.Job(
        job_id="22_1", array_job_id="22", array_task="1", name=LONG_NAME, user="root", state="RUNNING",
        reason="None", partition="bsops", num_nodes=1, nodes="vm", elapsed_s=1, time_limit_min=5,
        start_time=datetime(2026, 11, 22, 3, 41, 51), submit_time=datetime(2026, 11, 22, 3, 41, 50),
        dependency=None)
    assert task.is_array


def test_plain_jobs_and_array_records_are_told_apart(recorded: list[slurm.Job], ids: dict[str, str]) -> None:
    arrays = {ids["array"], ids["chained_array"]}
    for job in recorded:
        assert job.is_array == (job.array_job_id in arrays), job.job_id
        assert (job.array_task is None) == (not job.is_array)
        assert job.array_job_id == job.job_id.split("_", 1)[0]


def test_the_recorded_states_and_reasons_fall_in_the_state_sets(recorded: list[slurm.Job],
                                                                ids: dict[str, str]) -> None:
    """The watchdog tells running from waiting and waiting from stuck with these sets."""
    assert not slurm.ACTIVE_STATES & slurm.WAITING_STATES
    assert slurm.QUEUED_STATES == slurm.ACTIVE_STATES | slurm.WAITING_STATES
    assert {j.state for j in recorded} <= slurm.QUEUED_STATES
    assert {j.state for j in recorded if j.nodes} <= slurm.ACTIVE_STATES
    by_id = {j.job_id: j for j in recorded}
    stuck = {by_id[ids[key]].reason for key in ("never", "held_user", "held_admin", "partition_down")}
    clears = {by_id[ids[key]].reason for key in ("dependency", "begin", "resources", "priority")}
    assert stuck <= slurm.NEVER_STARTS
    assert not clears & slurm.NEVER_STARTS
    assert "JobArrayTaskLimit" not in slurm.NEVER_STARTS


@pytest.mark.parametrize("limit", ["UNLIMITED", "INFINITE", "NOT_SET"])
def test_a_job_without_a_time_limit_has_none(limit: str) -> None:
    [job] = slurm.parse_squeue(squeue_text(fields("5", "n", time_limit=limit)), T)
    assert job.time_limit_min is None


def test_heterogeneous_job_components_are_records() -> None:
    [job] = slurm.parse_squeue(squeue_text(fields("5+1", "het", array_job_id="5", own_id="6")), T)
    assert (job.job_id, job.array_job_id, job.is_array) == ("5+1", "5", False)


def test_an_empty_queue_is_no_job_and_nothing_unparsed() -> None:
    for text in ("", "\n"):
        jobs = slurm.parse_squeue(text, T)
        assert jobs == [] and jobs.unparsed == ()
        assert slurm.unparsed_note(jobs) is None
    assert slurm.unparsed_note([]) is None  # a plain list has nothing set aside


def test_the_note_counts_every_skipped_job_and_shows_the_first_three() -> None:
    hostile = [fields(str(i), f"n{i}\nbad{i}") for i in range(4)]
    jobs = slurm.parse_squeue(squeue_text(*hostile), T)
    assert len(jobs.unparsed) == 4 and not jobs
    note = slurm.unparsed_note(jobs)
    assert note.startswith("4 squeue entries")
    assert [f"bad{i}" in note for i in range(4)] == [True, True, True, False]


# --- time limits, durations, timestamps ---------------------------------------------------------------------

@pytest.mark.parametrize(("text", "minutes"), [
    ("5", 5), ("90", 90),                                  # MM
    ("5:00", 5), ("5:30", 6), ("0:01", 1),                 # MM:SS, seconds rounded up to a minute
    ("20:00:00", 1200), ("1:00:01", 61), ("00:05:00", 5),  # HH:MM:SS (scontrol's TimeLimit)
    ("2-0", 2880), ("1-02", 1560),                         # D-HH
    ("1-02:30", 1590),                                     # D-HH:MM
    ("1-02:30:00", 1590), ("1-02:30:01", 1591),            # D-HH:MM:SS
    (" 20:00:00\n", 1200),
])
def test_time_limits_in_every_format_sbatch_takes(text: str, minutes: int) -> None:
    assert slurm.parse_time_limit(text) == minutes


@pytest.mark.parametrize("text", ["", "forever", "UNLIMITED", "0", "0:00", "0-0", "1:60:00", "1:00:60",
                                  "1-02:60", "1-02:30:60", "-5", "5m", "1:2:3:4", "1-", "20:00:00 extra"])
def test_time_limits_sbatch_refuses_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        slurm.parse_time_limit(text)


def test_the_recorded_limits_and_times_agree_between_squeue_and_scontrol(recorded: list[slurm.Job],
                                                                         ids: dict[str, str]) -> None:
    """scontrol names an array's records by their own ids (task 22_1 is job 33), squeue by the array's."""
    shown = {r["JobId"]: r for r in slurm.parse_scontrol_show_job((ASSETS / "scontrol_show_job.txt").read_text())}
    as_squeue = {ids["array"]: f"{ids['array']}_[2-5%1]", "33": f"{ids['array']}_1", ids["never"]: ids["never"]}
    assert set(shown) == set(as_squeue)
    by_id = {j.job_id: j for j in recorded}
    for own_id, job_id in as_squeue.items():
        job = by_id[job_id]
        assert slurm.parse_time_limit(shown[own_id]["TimeLimit"]) == job.time_limit_min == 5
        assert slurm.parse_timestamp(shown[own_id]["SubmitTime"]) == job.submit_time
    assert slurm.parse_timestamp(shown["33"]["StartTime"]) == by_id[f"{ids['array']}_1"].start_time
    assert slurm.parse_duration(shown["33"]["RunTime"]) == by_id[f"{ids['array']}_1"].elapsed_s


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0:00:00"), (59.9, "0:00:59"), (3600, "1:00:00"), (86399, "23:59:59"), (86400, "1-00:00:00"),
    (93784, "1-02:03:04"),
])
def test_durations_are_written_as_slurm_writes_them(seconds: float, text: str) -> None:
    assert slurm.format_duration(seconds) == text
    assert slurm.parse_duration(text) == int(seconds)


@pytest.mark.parametrize("text", ["", "5", "1-02", "a:b", "UNLIMITED", "1:2:3:4", "-0:05"])
def test_durations_that_are_not_slurms_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        slurm.parse_duration(text)


def test_timestamps_and_the_words_for_no_time() -> None:
    for none in ("N/A", "Unknown", "None", "(null)", "", "  "):
        assert slurm.parse_timestamp(none) is None, none
    assert slurm.parse_timestamp(" 2021-08-16T03:52:02\n") == datetime(2021, 8, 16, 3, 52, 2)
    for other in ("2021-08-16 03:52:02", "Mon Aug 16 03:52", "now+2hours", "2021-08-16T03:52"):
        with pytest.raises(ValueError):
            slurm.parse_timestamp(other)
    shown = slurm.parse_scontrol_show_job((ASSETS / "scontrol_show_job.txt").read_text())
    assert [slurm.parse_timestamp(r["StartTime"]) for r in shown if r["JobState"] == "PENDING"] == [None, None]


# --- sbatch's answers ------------------------------------------------------------------------------------------

def test_the_recorded_test_only_answer_in_full() -> None:
    answer = slurm.parse_sbatch_test_only((ASSETS / "sbatch_test_only.stderr").read_text())
    assert answer == slurm.TestOnlyAnswer("35", datetime(2026, 11, 22, 4, 21, 52), 1, "vm", "bsops")


@pytest.mark.parametrize("stdout", ["", "\n", "Submitted batch job 712\n", ";cluster\n", "712a\n", "-712\n"])
def test_sbatch_answers_without_a_job_id_are_errors(stdout: str) -> None:
    with pytest.raises(slurm.SlurmError):
        slurm.parse_sbatch_parsable(stdout)


def test_the_job_id_is_the_first_line_of_sbatchs_answer() -> None:
    assert slurm.parse_sbatch_parsable(" 712 \n") == "712"
    assert slurm.parse_sbatch_parsable("712;jeanzay\nsomething else\n") == "712"


# --- scontrol show job -----------------------------------------------------------------------------------------

def test_scontrol_values_with_spaces_and_keys_with_punctuation_stay_whole() -> None:
    """scontrol_show_job_spaces.txt: a held job named "rec name with spaces | and a pipe" (record_answers.py)."""
    [record] = slurm.parse_scontrol_show_job((ASSETS / "scontrol_show_job_spaces.txt").read_text())
    assert record["JobId"] == "81" and record["JobName"] == "rec name with spaces | and a pipe"
    assert (record["JobState"], record["Reason"], record["Partition"]) == ("PENDING", "JobHeldUser", "bsops")
    assert record["AllocNode:Sid"] == "localhost:5366" and record["CPUs/Task"] == "1"
    assert record["ReqB:S:C:T"] == "0:0:*:*" and record["TRES"] == "cpu=1,mem=1M,node=1,billing=1"
    assert record["NodeList"] == "" and record["Power"] == ""  # empty values, the last one too
    assert record["UserId"] == "root(0)" and record["TimeLimit"] == "00:05:00"


def test_a_line_break_of_another_kind_in_a_name_stays_in_its_record() -> None:
    line = (ASSETS / "scontrol_show_job_spaces.txt").read_text()
    for odd in ("a\u2028b", "a\u2029b", "a\x1eb", "a\x85b"):
        [record] = slurm.parse_scontrol_show_job(line.replace("rec name with spaces | and a pipe", odd))
        assert record["JobName"] == odd and record["JobState"] == "PENDING"


def test_scontrol_output_that_is_not_job_lines_is_an_error() -> None:
    assert slurm.parse_scontrol_show_job("") == [] and slurm.parse_scontrol_show_job("\n\n") == []
    for text in ("slurm_load_jobs error: Invalid job id specified\n", "UserId=root(0) JobId=5\n", "garbage\n"):
        with pytest.raises(slurm.SlurmError):
            slurm.parse_scontrol_show_job(text)


# --- sacct -----------------------------------------------------------------------------------------------------

def test_sacct_records_of_jobs_that_ended_each_way() -> None:
    """sacct_completion.txt: sacct's JobID|State|ExitCode for jobs that completed, exited 3, ran as an array,
    were cancelled and hit their time limit (record_answers.py, from the cluster's job completion log)."""
    ids = json.loads((ASSETS / "sacct_ids.json").read_text())
    records = slurm.parse_sacct((ASSETS / "sacct_completion.txt").read_text())
    by_id = {r.job_id: (r.state, r.exit_code) for r in records}
    assert len(records) == len(by_id) == 5
    assert by_id == {ids["completed"]: ("COMPLETED", "0:0"), ids["failed"]: ("FAILED", "3:0"),
                     ids["array"]: ("COMPLETED", "0:0"), ids["cancelled"]: ("CANCELLED", "0:0"),
                     ids["timeout"]: ("TIMEOUT", "0:0")}


def test_sacct_keeps_a_task_and_its_steps_apart() -> None:
    # An array task the time limit ended and its steps, in the layout sacct(1) documents for --parsable2 with an
    # accounting database ('|' between fields, none at the end; the test cluster keeps none to record from).
    text = "100_3|TIMEOUT|0:0\n100_3.batch|CANCELLED|0:15\n100_3.extern|COMPLETED|0:0\n100_3.0|CANCELLED|0:15\n"
    assert slurm.parse_sacct(text) == [
        slurm.SacctRecord("100_3", "TIMEOUT", "0:0"), slurm.SacctRecord("100_3.batch", "CANCELLED", "0:15"),
        slurm.SacctRecord("100_3.extern", "COMPLETED", "0:0"), slurm.SacctRecord("100_3.0", "CANCELLED", "0:15")]


def test_sacct_lines_of_another_shape_are_skipped() -> None:
    assert slurm.parse_sacct("") == []
    text = "Slurm accounting storage is disabled\nJobID|State\n\n7|COMPLETED|0:0\n7|a|b|c\n"
    assert slurm.parse_sacct(text) == [slurm.SacctRecord("7", "COMPLETED", "0:0")]


# --- what the cluster needs: sinfo's partitions, scontrol show config -------------------------------------------

def test_the_recorded_default_partition_is_found() -> None:
    partitions = (ASSETS / "sinfo_partitions.txt").read_text()
    assert partitions.split() == ["bsops*", "bsops-down"]
    assert slurm.has_default_partition(partitions)
    assert not slurm.has_default_partition(partitions.replace("*", ""))
    assert not slurm.has_default_partition("")


def test_accounting_enforcement_is_read_from_the_recorded_config() -> None:
    config = (ASSETS / "scontrol_show_config.txt").read_text()
    line = "AccountingStorageEnforce = none"
    assert config.count(line) == 1
    assert not slurm.enforces_accounts(config)
    for enforce in ("associations", "associations,limits,qos", "limits,safe", "qos", "wckeys", "Associations"):
        assert slurm.enforces_accounts(config.replace(line, f"AccountingStorageEnforce = {enforce}")), enforce
    assert not slurm.enforces_accounts(config.replace(line, "AccountingStorageEnforce = nosteps"))
    assert not slurm.enforces_accounts(config.replace(line, ""))  # a config without the key
