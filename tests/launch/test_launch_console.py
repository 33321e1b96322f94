"""What `bsops launch --local` tells: each task's end in one line from its recorded output, what a stop saved,
the progress read from a growing log, and the ledger's end record of a stopped task (the job script's srun
waits for the trainers' save)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bigscience_ops.launch import local as launch
from bigscience_ops.run import ledger
from bigscience_ops.run.iterations import IterationStats, iteration_line, parse_iteration_line
from bigscience_ops.launch.console import CLEAR, Console, error_line, progress_text, stop_line, task_end
from tests.fixtures_experiments import processes_mentioning
from tests.fixtures_slurm import wait_until

REPO = Path(__file__).resolve().parents[2]

START = ["START TIME: Fri Nov 27 05:00:00 UTC 2026 job 77 array task 1 on localhost run dir /r",
         "task 77_1 begins at iteration 0"]
END = ["task 77_1 ended with exit code {code} at iteration {it}: made progress",
       "END TIME: Fri Nov 27 exit code {code}"]

# torch 2.x's worker traceback and torchrun's summary after it, as a task's .out holds them.
CRASH = """[rank0]: Traceback (most recent call last):
[rank0]:   File "/w/bigscience_ops/trainer/model.py", line 88, in forward
[rank0]:     return F.embedding(ids, self.weight)
[rank0]: IndexError: index out of range in self
E1127 05:01:02.000000 99 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/w/.venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
bigscience_ops.trainer FAILED
------------------------------------------------------------
Root Cause (first observed failure):
  exitcode  : 1 (pid: 123)
============================================================
srun: error: task 0: exited 1; terminating the other tasks (--kill-on-bad-exit)
task 77_1 ended with exit code 1 at iteration 0: made NO progress
END TIME: Fri Nov 27 exit code 1""".splitlines()


def _out(tmp_path: Path, lines: list[str], code: int = 0, it: int = 0) -> Path:
    path = tmp_path / "small-77_1.out"
    path.write_text("\n".join(START + lines + [e.format(code=code, it=it) for e in END]) + "\n")
    return path


def _stats(iteration: int, total: int = 221, elapsed_ms: float = 500.0, loss: float | None = 5.93) -> IterationStats:
    return IterationStats(iteration, total, 16 * iteration, 16 * 128 * iteration, elapsed_ms, 1e-3, 16, loss, 1.0,
                          None, None, 0, 0, 32.0, 0.01)


# ----------------------------------------------------------------------------- a task's end

def test_a_finished_task_says_finished_with_its_iterations(tmp_path):
    out = _out(tmp_path, ["> training finished at iteration 221"], it=221)
    end = task_end("array task 2/2", 0, 80, out, 120, 221, 221)
    assert (end.kind, end.line) == ("finished", "array task 2/2: finished: iteration 221/221 (iterations 120 → 221 "
                                                "of 221 in 1 min 20 s)")


def test_a_task_that_saved_and_exited_early_says_why(tmp_path):
    out = _out(tmp_path, ["> exit interval 120 reached: saved and exiting at iteration 120"], it=120)
    end = task_end("array task 1/2", 0, 95, out, 0, 120, 221)
    assert (end.kind, end.line) == ("stopped", "array task 1/2: iterations 0 → 120 of 221 in 1 min 35 s: exit "
                                               "interval 120 reached: saved and exiting")


def test_a_relaunched_finished_run_says_it_did_not_train_and_why(tmp_path):
    """Was `exit 0 in 1 s`, the reason only in the .out."""
    reason = ("not training: the training finished at iteration 221; task 77_3 ends at once (no nodes used, no "
              "failure counted)")
    out = tmp_path / "small-77_3.out"
    out.write_text("\n".join([START[0], reason, "END TIME: x"]) + "\n")
    end = task_end("array task 1/2", 0, 1, out, 221, 221, 221)
    assert (end.kind, end.line) == ("not training", f"array task 1/2: {reason} (exit 0 in 1 s)")


def test_a_crash_names_the_trainers_error_not_torchruns_and_the_file(tmp_path):
    out = _out(tmp_path, CRASH[:-2], code=1)
    end = task_end("array task 1/2", 1, 12, out, 0, 0, 221)
    assert end.kind == "failed"
    assert end.line == (f"array task 1/2: failed with exit code 1 after 12 s: IndexError: index out of range in "
                        f"self; read {out}")


def test_the_first_failure_is_named_not_the_other_ranks_errors_after_it():
    """Rank 1 fails; rank 0's collective then fails too, and its torchrun is ended: the cause is rank 1's, an
    exception whose name ends in neither Error nor Exception, its traceback's lines interleaved with rank 0's."""
    lines = ["[rank1]: Traceback (most recent call last):",
             "[rank0]: Traceback (most recent call last):",
             '[rank1]:   File "/w/bigscience_ops/trainer/faults.py", line 145, in check',
             "[rank1]:     raise InjectedFault(...)",
             "[rank1]: bigscience_ops.trainer.faults.InjectedFault: BSOPS_FAIL_AT=1:5: rank 1 fails before iteration 5",
             '[rank0]:   File "/w/bigscience_ops/trainer/train.py", line 300, in step',
             "[rank0]: RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:29500",
             "Traceback (most recent call last):",
             '  File "/w/.venv/bin/torchrun", line 8, in <module>',
             "torch.distributed.elastic.multiprocessing.api.SignalException: Process 9 got signal: 15"]
    assert error_line(lines) == ("bigscience_ops.trainer.faults.InjectedFault: BSOPS_FAIL_AT=1:5: rank 1 fails before "
                                 "iteration 5")


def test_a_task_refused_at_its_start_names_bsops_error(tmp_path):
    lines = ["error: corpus/x.bin: missing; expected the data file of blend prefix corpus/x",
             "not training: the data would fail the run (1 finding(s) above); fix it, then `bsops launch small`",
             "not training: bsops task begin exited 1"]
    end = task_end("array task 1/1", 1, 2, _out(tmp_path, lines, code=1), 0, 0, 221)
    assert end.line.startswith("array task 1/1: failed with exit code 1 after 2 s: error: corpus/x.bin: missing;")


def test_the_error_line_of_outputs_without_an_exception(tmp_path):
    assert error_line(["srun: error: task 1: exited 3; terminating the other tasks", "END TIME: x"]) == (
        "srun: error: task 1: exited 3; terminating the other tasks")
    assert error_line(["not training: the run folder is in use by x; task 9 ends"]) == (
        "not training: the run folder is in use by x; task 9 ends")
    assert error_line(["0: ValueError: bad value", "1: torch.distributed.elastic.multiprocessing.api."
                       "SignalException: Process 5 got signal: 15"]) == "ValueError: bad value"
    end = task_end("array task 1/1", 137, 5, _out(tmp_path, ["Killed"], code=137), 0, 0, 9)
    assert end.line.endswith("failed with exit code 137 after 5 s: no error line in the last lines of its output; "
                             f"read {tmp_path / 'small-77_1.out'}")


def test_an_output_that_cannot_be_read_or_never_ends_its_line_is_told_not_raised(tmp_path):
    missing = tmp_path / "gone.out"
    assert "its output cannot be read: " in task_end("array task 1/1", 1, 1, missing, 0, 0, 9).line
    huge = tmp_path / "nul.out"
    huge.write_bytes(b"\0" * (3 << 20))  # a node that crashed while writing: no line at all
    line = task_end("array task 1/1", 1, 1, huge, 0, 0, 9).line
    assert "no error line" in line and len(line) < 300


# ----------------------------------------------------------------------------- what a stop saved

def test_a_stop_says_what_the_trainers_saved_from_latest_before_and_after():
    out = Path("/r/logs/small-77_1.out")
    assert stop_line("array task 1/2", "Ctrl-C", 100, 120, True, False, out) == (
        f"array task 1/2: stopped by Ctrl-C: the trainers saved iteration 120; run the same command again to resume "
        f"from it (see {out})")
    # Saved though the wait was cut short: the save is what counts (was: "losing what it trained").
    assert "the trainers saved iteration 120" in stop_line("t", "Ctrl-C", 0, 120, True, True, out)
    assert stop_line("t", "Ctrl-C", 0, 0, False, False, out).startswith(
        "t: stopped by Ctrl-C before the first save: nothing saved; the next launch starts from the beginning")
    assert stop_line("t", "SIGTERM", 100, 100, True, True, out).startswith(
        "t: stopped by SIGTERM before the trainers' save: what they trained since iteration 100 is lost; the next "
        "launch resumes from iteration 100")
    assert stop_line("t", "Ctrl-C", 120, 120, False, False, out).startswith(
        "t: stopped by Ctrl-C: nothing saved after iteration 120; the next launch resumes from iteration 120")


# ----------------------------------------------------------------------------- progress

def test_the_progress_text_has_iteration_rate_tokens_and_eta():
    assert progress_text(_stats(120)) == "iteration 120/221 (54%) | lm loss 5.93 | 2 it/s, 4.1k tokens/s | ETA 50 s"
    assert progress_text(_stats(5, elapsed_ms=2500, loss=None)) == (
        "iteration 5/221 (2%) | 2.5 s/it, 4.1k tokens/s | ETA 9 min 00 s")


def test_a_log_gets_a_plain_progress_line_per_interval_and_the_last_one():
    printed: list[tuple[str, bool]] = []
    now = [0.0]
    console = Console(lambda text, nl: printed.append((text, nl)), tty=False, interval_s=30, clock=lambda: now[0])
    console.feed("array task 1/2: started, output in x (2 node(s))")
    for it, t in ((10, 1), (20, 20), (30, 31), (40, 40), (221, 45)):
        now[0] = t
        console.feed(iteration_line(_stats(it)))
    console.feed(" validation loss at iteration 40 | lm loss value: 5.1 |")
    console.feed("array task 2/2: started, output in y (2 node(s))")
    for it, t in ((50, 46), (60, 50)):  # a task's first line, then its last one (not logged) before its end
        now[0] = t
        console.feed(iteration_line(_stats(it)))
    console.feed("array task 2/2: iterations 40 → 64 of 221 in 5 s: exit interval 64 reached: saved and exiting")
    lines = [text for text, nl in printed]
    assert all(nl for _, nl in printed) and not any(CLEAR in text for text in lines)
    assert [line.split(" |")[0].split(":")[0] for line in lines] == [
        "array task 1/2", "iteration 10/221 (4%)", "iteration 30/221 (13%)", "iteration 221/221 (100%)",
        " validation loss at iteration 40", "array task 2/2", "iteration 50/221 (22%)", "iteration 60/221 (27%)",
        "array task 2/2"]


def test_a_terminal_gets_one_bar_rewritten_in_place_below_the_other_lines():
    screen: list[tuple[str, bool]] = []
    console = Console(lambda text, nl: screen.append((text, nl)), tty=True, width=lambda: 60)
    console.feed(iteration_line(_stats(110)))
    console.feed("> exit interval 120 reached: saved and exiting at iteration 120")
    console.close()
    bar = screen[0][0]
    assert bar.startswith(CLEAR + "[#########-----------] iteration 110/221 (49%)") and len(bar) == len(CLEAR) + 59
    assert screen[1:] == [(CLEAR, False), ("> exit interval 120 reached: saved and exiting at iteration 120", True),
                          (bar.removeprefix(CLEAR), False), ("", True)]


def test_progress_comes_from_a_growing_log_as_it_is_written(tmp_path):
    """launch._follow reads the task's output in bounded blocks as the task writes it; the console makes progress of
    the iteration lines: here a task writing three of them, and a line of 1 MiB without a break, in steps."""
    output = tmp_path / "task.out"
    output.touch()
    lines = [iteration_line(_stats(it, total=30)) for it in (10, 20, 30)]
    steps = tmp_path / "steps.sh"
    steps.write_text("".join(f"echo '{line}' >> {output}; sleep 0.3\n" for line in lines[:2])
                     + f"head -c 1048576 /dev/zero | tr '\\0' x >> {output}; echo >> {output}\n"
                     + f"echo '{lines[2]}' >> {output}\n")
    printed: list[str] = []
    console = Console(lambda text, nl: printed.append(text), tty=False, interval_s=0)
    proc = subprocess.Popen(["bash", str(steps)])
    assert launch._follow(proc, output, console.feed, timeout_s=120) == 0
    assert [p.split(" |")[0] for p in printed] == ["iteration 10/30 (33%)", "iteration 20/30 (66%)",
                                                   "iteration 30/30 (100%)"]
    assert parse_iteration_line(lines[2]).iteration == 30


# ----------------------------------------------------------------------------- the ledger's end of a stopped task

# A node's command as the job script runs it: a "torchrun" that ignores SIGUSR1 and, on SIGTERM, waits for its trainer
# (as torchrun does), and the trainer, in a session of its own, that takes a second to save on either before it exits.
NODE = """
import os, signal, subprocess, sys, time
checkpoints = sys.argv[1]
if sys.argv[2:] == ["trainer"]:
    def save(*_):
        time.sleep(1)
        from tests.fixtures_runs import commit_checkpoint  # a committed save, as the trainer leaves it
        os.makedirs(f"{checkpoints}/global_step7")
        with open(f"{checkpoints}/global_step7/bsops.json", "w") as f:
            f.write('{"iteration": 7}')
        commit_checkpoint(f"{checkpoints}/global_step7")
        with open(f"{checkpoints}/latest", "w") as f:
            f.write("global_step7\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, save)
    signal.signal(signal.SIGUSR1, save)
    open(f"{checkpoints}/ready", "w").close()
    while True:
        time.sleep(60)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # as the job script has torchrun ignore it
signal.signal(signal.SIGTERM, lambda *_: None)
sys.exit(subprocess.run([sys.executable, __file__, checkpoints, "trainer"], start_new_session=True).returncode)
"""

# The job script's part that matters, as templates/train.slurm.j2 has it: srun in the background, its wait
# resumed after a trap, then the task's end recorded in the ledger (what `bsops task end` does).
SCRIPT = """
set +e
{python} {hooks} begin {run} {checkpoints}
{srun} --nodes=1 --kill-on-bad-exit=1 {python} {node} {checkpoints} &
srun_pid=$!
trap 'kill -USR1 "$srun_pid" 2>/dev/null' TERM
while :; do
    wait "$srun_pid"
    status=$?
    if ((status > 128)) && kill -0 "$srun_pid" 2>/dev/null; then continue; fi
    break
done
{python} {hooks} end {run} {checkpoints} "$status"
"""

# What `bsops task begin` and `bsops task end` record in the ledger, without the rest of the CLI.
HOOKS = """
import sys
from pathlib import Path
from bigscience_ops.run import ledger
event, run, checkpoints = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
if event == "begin":
    ledger.begin(run, checkpoints, 0)
else:
    ledger.end(run, checkpoints, int(sys.argv[4]))
"""


def test_a_stopped_task_records_its_end_after_the_trainers_save(tmp_path):
    """bsops stops a task by SIGTERM to its process group: srun's stand-in used to die of it at once, so the job
    script recorded the task's end (the ledger's `iteration`: `latest` then) before the trainers, still saving,
    had written `latest`: the end record said 0 where they saved 7. srun now passes the signal on to the trainers
    and waits for them, as srun does."""
    run, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    srun = tmp_path / "srun"
    launch._write_shim(srun, launch.SRUN)
    (tmp_path / "node.py").write_text(NODE)
    (tmp_path / "hooks.py").write_text(HOOKS)
    script = tmp_path / "task.sh"
    script.write_text(SCRIPT.format(python=sys.executable, run=run, checkpoints=checkpoints, srun=srun,
                                    node=tmp_path / "node.py", hooks=tmp_path / "hooks.py"))
    env = dict(os.environ, SLURM_JOB_ID="77", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(["bash", str(script)], env=env, start_new_session=True)
    try:
        wait_until("the trainer to be ready", lambda: (checkpoints / "ready").exists() or proc.poll() is not None)
        launch._stop(proc)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        for pid in processes_mentioning(str(checkpoints)):
            os.kill(pid, signal.SIGKILL)  # only where the test fails
    end = ledger.read(run / ledger.LEDGER_NAME)[-1]
    assert (end.event, end.iteration, end.exit_code) == ("end", 7, 0)
    assert ledger.latest_iteration(checkpoints) == 7


def test_launch_console_imports_neither_torch_nor_click():
    code = ("import sys, bigscience_ops.launch.console; "
            "assert not {'torch', 'deepspeed', 'click'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=REPO)


@pytest.mark.parametrize("seconds, shown", [(0.4, "0 s"), (59.6, "1 min 00 s"), (3725, "1 h 02 min")])
def test_durations(seconds, shown):
    from bigscience_ops.launch.console import duration

    assert duration(seconds) == shown
