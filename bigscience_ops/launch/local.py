"""The local executor: a LaunchPlan's job array run on this machine (submit.py sends it to Slurm).

`launch_local` plans the launch (launch_plan.py), and launch_plan.execute carries it out with
LocalExecutor: the data is checked, the same job script `bsops render` makes is written into the run
folder, then run with Slurm's environment emulated (slurm.TaskEnv.to_env): each array task gets SLURM_JOB_ID, SLURM_ARRAY_JOB_ID,
SLURM_ARRAY_TASK_ID and a node list; small `srun` and `scontrol` shims (written into
<run>/slurm-shims/) start one launcher per "node" with its SLURM_PROCID and expand the node list,
which is all the script uses; as srun's --kill-on-bad-exit, a node that fails ends the others. The
"nodes" meet on a free port below the kernel's ephemeral range, which no other program is handed
between the tasks. The tasks run one after another, each resuming from the last
checkpoint, as `--array=1-N%1` does; the output goes where `#SBATCH --output` says. With a node
schedule each task runs at the node count of the phase the latest checkpoint is in (the script is
rendered again when that changes), as the resubmitted arrays do on a cluster. Stopped, bsops stops the
running task with it: the job script gets SIGUSR1 as from Slurm's --signal=B:USR1, the srun shim hands it
to the trainers, which save and exit.

One run, one trainer: the launch holds the run's lock (run/lock.py) and hands that very lock to each task's job
script (an inherited descriptor), whose trainers hold the trainers' lock beside it. Killed with kill -9, bsops
cannot stop its task, but the task holds the run on (a relaunch is refused, naming its processes) and hears of
it (SIGHUP, the job script's parent-death signal): its trainers save and exit, the run is free once the last of
them is gone, and the same `bsops launch --local` resumes from that save.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops import slurm
from bigscience_ops.launch import jobs
from bigscience_ops.launch import processes
from bigscience_ops.launch import render as rendering
from bigscience_ops.run import lock as run_lock
from bigscience_ops.run import log as runlog
from bigscience_ops.errors import BsopsError, LaunchError
from bigscience_ops.launch.jobenv import job_environment
from bigscience_ops.run.ledger import latest_iteration
from bigscience_ops.launch.console import stop_line, task_end
from bigscience_ops.launch.launch_plan import LaunchOptions, LaunchPlan, build_launch_plan, execute
from bigscience_ops.launch.jobs import Started
from bigscience_ops.run.records import read_records
from bigscience_ops.schema import Experiment


class Stopped(LaunchError):
    """bsops itself was told to stop (SIGTERM, SIGHUP) while a task ran; `cause` names the signal."""

    def __init__(self, message: str, cause: str = "") -> None:
        super().__init__(message)
        self.cause = cause


class Interrupted(Stopped):
    """Ctrl-C while a task ran: the message says what the task saved (no error: the user asked for it)."""


def stop_reason_file(run_dir: Path) -> Path:
    """Why bsops sends the job script SIGUSR1, which the script's log line names (BSOPS_STOP_REASON_FILE; absent, as
    under Slurm, the signal is the time limit's)."""
    return run_dir / "slurm-shims" / "stop-reason"


SRUN = '''#!{python}
"""srun shim for bsops' local launches: starts the command once per node with SLURM_PROCID set.

With --kill-on-bad-exit=1, as srun, the first process to exit non-zero ends the others (SIGTERM, then
SIGKILL after 30 s): a node that failed must not leave the other nodes waiting for it. SIGUSR1 sent to it
goes, as srun's does, to every process of the step: each node's command and all that it started, the
trainers too, which torchrun starts in sessions of their own. SIGTERM (bsops stopping the task's process
group, as scancel the job's) goes on to the processes of the step that it missed, the trainers, and srun
waits for the step to end as srun does (SIGKILL to all of it after 50 s): the job script records the task's
end only once the trainers have saved and exited, not before."""
import os, signal, subprocess, sys

args = sys.argv[1:]
nodes = int(os.environ.get("SLURM_NNODES", "1"))
kill_on_bad_exit = False
while args and args[0].startswith("-"):
    option = args.pop(0)
    if option.startswith("--nodes="):
        nodes = int(option.split("=", 1)[1])
    elif option in ("-N", "--nodes"):
        nodes = int(args.pop(0))
    elif option in ("-K", "--kill-on-bad-exit") or option.startswith("--kill-on-bad-exit="):
        kill_on_bad_exit = option.partition("=")[2] in ("", "1")


def kill_the_rest(signum, frame):
    for pid in step_processes():  # the trainers too: torchrun killed could not end them
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def step_processes():
    """The pids of the nodes' commands and of all their descendants (from /proc's parent links)."""
    children = {{}}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{{entry}}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # not a process, or one that has just ended
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(running)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def forward(signum, frame):
    for pid in step_processes():
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def terminate(signum, frame):
    """The step's processes in this process group had the signal with it; the others (the trainers) get it
    now. The step then ends as it would (the trainers save and exit), or is killed after 50 s."""
    own = os.getpgrp()
    for pid in step_processes():
        try:
            if os.getpgid(pid) != own:
                os.kill(pid, signum)
        except ProcessLookupError:
            pass
    signal.signal(signal.SIGALRM, kill_the_rest)
    signal.alarm(50)


running = {{}}
signal.signal(signal.SIGUSR1, forward)  # before the first node starts: none may miss it
signal.signal(signal.SIGTERM, terminate)
for rank in range(nodes):
    env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_NODEID=str(rank), SLURM_LOCALID="0",
               SLURM_STEP_NUM_NODES=str(nodes), SLURM_STEP_NUM_TASKS=str(nodes))
    proc = subprocess.Popen(args, env=env)
    running[proc.pid] = (rank, proc)

codes = []
first_failure = None  # (rank, code) of the first process that exited non-zero
while running:
    pid, status = os.wait()
    if pid not in running:
        continue
    rank, _ = running.pop(pid)
    codes.append(os.waitstatus_to_exitcode(status))
    if codes[-1] != 0 and first_failure is None:
        first_failure = rank, codes[-1]
        if kill_on_bad_exit and running:
            print(f"srun: error: task {{rank}}: exited {{codes[-1]}}; terminating the other tasks (--kill-on-bad-exit)",
                  file=sys.stderr, flush=True)
            for _, proc in running.values():
                proc.terminate()
            signal.signal(signal.SIGALRM, kill_the_rest)
            signal.alarm(30)
# The failed task's code, not that of the tasks ended for it.
sys.exit(first_failure[1] if kill_on_bad_exit and first_failure else max(codes, key=abs))
'''


SCONTROL = '''#!{python}
"""scontrol shim for bsops' local launches: only `scontrol show hostnames LIST` (comma lists)."""
import sys

if sys.argv[1:3] != ["show", "hostnames"]:
    sys.exit("scontrol shim: only 'show hostnames' is emulated, got " + " ".join(sys.argv[1:]))
for name in " ".join(sys.argv[3:]).replace(",", " ").split():
    print(name)
'''


@dataclass(frozen=True)
class LocalTask:
    array_task_id: int
    returncode: int
    seconds: float
    output: Path
    end: str = ""
    """Its end in one line (launch_console.task_end): finished, stopped and why, not training and why, failed."""


@dataclass(frozen=True)
class LocalRun:
    """A training's array run on this machine, task after task: a Job (jobs.py) that is gone once
    LocalExecutor.start returns it, with what `bsops launch --local` prints."""

    experiment: Experiment
    """As the last task ran it: every override applied (its paths under the run folder)."""
    script: Path
    tasks: list[LocalTask]
    finished: bool
    array_job_id: str = ""

    @property
    def run_dir(self) -> Path:
        return Path(self.experiment.paths.output)

    @property
    def job_id(self) -> str:
        return self.array_job_id

    @property
    def log(self) -> Path:
        """The run's main log (every task's lines)."""
        return runlog.main_log(self.experiment.paths.logs)

    def state(self) -> str:
        return jobs.GONE

    def cancel(self) -> None:
        """Nothing is left running: the tasks ran while `start` did."""

    def wait(self, timeout: float | None = None) -> int:
        """The last task's exit code (0 when none ran)."""
        return self.tasks[-1].returncode if self.tasks else 0


PORTS_FROM = 20000  # below: the well-known and registered ports services are likelier to hold


def free_port() -> int:
    """A free TCP port for the rendezvous, below the kernel's ephemeral range (ip_local_port_range).

    The port goes into the job script when the launch starts, and the first node's torchrun listens on it
    only when each task starts. A port of the ephemeral range could be taken in between by any program that
    listens on port 0 (a torchrun --standalone, gloo): the first node's torchrun would then fail and the
    others wait on that program. The kernel hands out no port below the range unasked.
    """
    low = _ephemeral_ports()[0]
    picks = random.Random()
    for _ in range(200):
        port = picks.randrange(PORTS_FROM, low) if low - PORTS_FROM >= 1000 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise LaunchError(f"no free TCP port for the rendezvous in {PORTS_FROM}-{low - 1}")


def _ephemeral_ports(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for ports it picks itself (Linux's default where it cannot be read)."""
    try:
        low, high = (int(v) for v in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _write_shim(path: Path, text: str) -> None:
    path.write_text(text.format(python=sys.executable), encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


# The lines of a task's output worth showing while it runs: training progress and what the run decides.
PROGRESS = re.compile(r"^\s*(iteration\s|validation loss|> |task |\*\*\*ALERT)")


def _follow(proc: subprocess.Popen, output: Path, progress: Callable[[str], None], timeout_s: float) -> int:
    """Wait for the task, passing its progress lines to `progress` as they are written: its output is read in
    bounded blocks (runlog.follow: a line longer than runlog.LINE_BYTES is cut, whatever the task prints)."""
    deadline = time.monotonic() + timeout_s
    ended = False

    def done() -> bool:  # asked when nothing new is there; once the task has ended, its last lines are read first
        nonlocal ended
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        if ended:
            return True
        ended = proc.poll() is not None
        return False

    for line in runlog.follow(output, interval=0.5, stop=done):
        if PROGRESS.match(line):
            progress(line.strip())
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
    return proc.wait()


def launch_local(exp: Experiment, timeout_s: float = 3600, progress: Callable[[str], None] = lambda line: None,
                 allow_incomplete: bool = False) -> LocalRun:
    """Plan the launch and run its slurm.array tasks here, one after another, in its paths.output (the command
    line sets both as it sets any field: `--out` and `--tasks` are their aliases).

    `progress` receives the iteration, validation and decision lines of each task as they come. An
    experiment without data is refused (site_values.IncompleteExperiment) unless `allow_incomplete`;
    nothing is written before the plan has been checked.
    """
    options = LaunchOptions(job="local", master_port=free_port(), allow_incomplete=allow_incomplete)
    plan = build_launch_plan(exp, options)  # checked before anything is written, the lock file included
    return execute(plan, LocalExecutor(options, timeout_s, progress))


@dataclass
class LocalExecutor:
    """Holds the run folder, writes the job script and the Slurm shims into it and runs the array's tasks one after
    another (launch_plan.execute calls the three in order). Each task runs at the node phase of the latest
    checkpoint: the plan is made again before each task (the run schedule kept), and the script rendered again
    when the node count changes, as the resubmitted arrays do on a cluster."""

    options: LaunchOptions
    timeout_s: float = 3600
    progress: Callable[[str], None] = lambda line: None
    lock_fd: int | None = None
    """The descriptor of the run's lock the launch holds while claimed (run_lock.hold), which each task's job
    script inherits (the module docstring says why)."""

    @contextlib.contextmanager
    def claim(self, plan: LaunchPlan) -> Iterator[int]:
        with run_lock.hold(plan.record_dir, "bsops launch --local") as self.lock_fd:
            try:
                yield self.lock_fd
            finally:
                self.lock_fd = None

    def write(self, plan: LaunchPlan) -> Path:
        out = plan.record_dir
        shims = out / "slurm-shims"
        shims.mkdir(parents=True, exist_ok=True)
        _write_shim(shims / "srun", SRUN)
        _write_shim(shims / "scontrol", SCONTROL)
        Path(plan.experiment.paths.logs).mkdir(parents=True, exist_ok=True)
        return rendering.write(plan.rendered, out)

    def start(self, plan: LaunchPlan, script: Path, started: Started = lambda job, job_id: None) -> LocalRun:
        out, exp = plan.record_dir, plan.experiment
        logs, checkpoints = Path(exp.paths.logs), Path(exp.paths.checkpoints)  # the same for every node phase
        array_job_id = int(time.time()) % 1_000_000
        started("local", str(array_job_id))
        count = exp.slurm.array
        results: list[LocalTask] = []
        for task in range(1, count + 1):
            if task > 1:  # the node phase of the latest checkpoint; a new script when its node count differs
                nodes = plan.experiment.slurm.nodes
                plan = build_launch_plan(plan.experiment, dataclasses.replace(self.options, holding=True), out,
                                         plan.schedule)
                if plan.experiment.slurm.nodes != nodes:
                    script = self.write(plan)
            exp = plan.experiment
            nodes = exp.slurm.nodes
            output = logs / f"{exp.slurm.job_name}-{array_job_id}_{task}.out"
            env = _task_environment(exp, out, array_job_id, task, self.lock_fd)
            start, label = time.time(), f"array task {task}/{count}"
            before = latest_iteration(checkpoints)
            self.progress(f"{label}: started, output in {output} ({nodes} node(s))")
            code = _run_task(script, env, output, self.progress, self.timeout_s, label, checkpoints,
                             exp.slurm.signal_seconds, self.lock_fd)
            seconds = time.time() - start
            end = task_end(label, code, seconds, output, before, latest_iteration(checkpoints),
                           plan.schedule.train_iters)
            results.append(LocalTask(task, code, seconds, output, end.line))
            if code != 0:  # the line names the error and the task's output; the log holds every task's
                raise LaunchError(f"{end.line} (every task's lines: {runlog.main_log(logs)})")
            self.progress(end.line)
            records = read_records(exp)
            if plan.schedule.finished(records.iteration):
                break
            if records.kill_switch is not None:  # touched while the task trained: it saved and exited, the run stops
                self.progress(f"the kill switch {records.kill_switch} exists: no further task is started")
                break
        return LocalRun(exp, script, results, plan.schedule.finished(read_records(exp).iteration), str(array_job_id))


def _task_environment(exp: Experiment, out: Path, array_job_id: int, task: int,
                      lock_fd: int | None = None) -> dict[str, str]:
    """One array task's environment: the job's (jobenv.py), the shims first on PATH, Slurm's task variables, and the
    number of the run lock's descriptor it inherits (`lock_fd`; None: the job script takes the lock itself)."""
    nodes = exp.slurm.nodes
    node_list = ",".join(["localhost"] + ["127.0.0.1"] * (nodes - 1))
    processes = nodes * exp.slurm.gpus_per_node
    threads = max(1, min(exp.slurm.cpus_per_task, (os.cpu_count() or 1) // processes))
    repo = Path(__file__).resolve().parents[1]
    return job_environment(os.environ, local=True, first_on_path=[out / "slurm-shims"], extra={
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
        # These ids are made up (local=True): nothing may scancel them on a real cluster this machine can reach.
        **slurm.TaskEnv(job_id=str(array_job_id + task), array_job_id=str(array_job_id), array_task_id=str(task),
                        array_task_min="1", array_task_max=str(exp.slurm.array), node_list=node_list,
                        num_nodes=nodes, local=True, job_name=exp.slurm.job_name, submit_dir=str(out),
                        cpus_per_task=str(exp.slurm.cpus_per_task)).to_env(),
        # Every "node" shares this machine: give each training process its share of the cores,
        # as Slurm's --cpus-per-task would, instead of each using them all.
        "OMP_NUM_THREADS": str(threads),
        "BSOPS_MASTER_PORT": str(exp.slurm.master_port),  # the free port launch_local chose, as it is
        "BSOPS_STOP_REASON_FILE": str(stop_reason_file(out)),  # why SIGUSR1 comes (_save_first)
        **({run_lock.HELD_ENV: str(lock_fd)} if lock_fd is not None else {}),  # the launch's lock, inherited
    })


def _run_task(script: Path, env: dict[str, str], output: Path, progress: Callable[[str], None], timeout_s: float,
              label: str, checkpoints: Path, save_s: float, lock_fd: int | None = None) -> int:
    """Run one array task's job script with its output in `output`, passing its progress on; its exit code.

    Stopped (SIGTERM, SIGHUP, Ctrl-C) once its trainers train, the task is first asked to save and exit, as
    Slurm's warning signal asks (SIGUSR1 to the job script, which srun hands to the trainers), for up to
    `save_s` seconds (a second stop ends the wait); whatever is left of it is then stopped (`_stop`). What it
    saved is read from `latest` once none of its processes is left (launch_console.stop_line): Ctrl-C raises
    Interrupted, SIGTERM and SIGHUP Stopped, each saying it.

    The job script inherits the run lock's descriptor `lock_fd` (it holds the run with bsops, and after it), and
    gets SIGHUP when bsops ends without stopping it (kill -9): its trainers then save and exit, as at SIGUSR1.
    """
    training = False
    before = latest_iteration(checkpoints)
    with contextlib.suppress(OSError):  # a reason left by an earlier stop is no reason for this task's signal
        stop_reason_file(script.parent).unlink(missing_ok=True)

    def report(line: str) -> None:
        nonlocal training
        training = training or line.startswith("iteration")  # the trainers run, their signal handlers set
        progress(line)

    with open(output, "wb") as sink:
        proc = processes.start(["bash", str(script)], cwd=script.parent, env=env, stdout=sink,
                               stderr=subprocess.STDOUT, pass_fds=() if lock_fd is None else (lock_fd,),
                               parent_death=signal.SIGHUP)
        try:
            with _raising_on(signal.SIGTERM, signal.SIGHUP):
                return _follow(proc, output, report, timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise LaunchError(f"{label} ran past {timeout_s:.0f} s; see {output}") from None
        except (Stopped, KeyboardInterrupt) as exc:
            cause = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else exc.cause or "a signal"
            saved = False
            try:
                saved = training and _save_first(proc, progress, save_s, stop_reason_file(script.parent), cause)
            finally:
                _stop(proc)  # what is left, or all of it when it was not training yet
            try:
                after = latest_iteration(checkpoints)
            except BsopsError as err:
                after, cause = before, f"{cause} (and `latest` is unreadable: {err})"
            told = stop_line(label, cause, before, after, training, training and not saved, output)
            if isinstance(exc, KeyboardInterrupt):
                raise Interrupted(told, cause) from None
            raise Stopped(told, cause) from None
        except BaseException:
            _stop(proc)  # bsops failing (its output closed, a bug) takes the task's launchers and trainers with it
            raise


def _save_first(proc: subprocess.Popen, progress: Callable[[str], None], save_s: float,
                reason_file: Path | None = None, cause: str = "") -> bool:
    """SIGUSR1 to the job script, as Slurm's --signal=B:USR1, and wait up to `save_s` for the task to end; True
    when it ended with 0 (the script's code is its trainers': 0 once they have saved and exited). `reason_file`
    first gets why (the script's log line names it: `cause`, asked by bsops launch --local)."""
    if proc.poll() is not None:  # it ended by itself as bsops was stopped
        return proc.returncode == 0
    if reason_file is not None:
        with contextlib.suppress(OSError):
            reason_file.write_text(f"stop asked by bsops launch --local: {cause}\n", encoding="utf-8")
    with contextlib.suppress(OSError):  # a terminal closed (SIGHUP) takes the line, not the save
        progress(f"stopping{f' ({cause})' if cause else ''}: the trainers save and exit first (up to {save_s:.0f} s; "
                 f"Ctrl-C or SIGTERM again ends the wait: what is left of the task is stopped, saved or not)")
    with contextlib.suppress(Stopped, KeyboardInterrupt, subprocess.TimeoutExpired), \
            _raising_on(signal.SIGTERM, signal.SIGHUP):
        os.kill(proc.pid, signal.SIGUSR1)
        return proc.wait(timeout=save_s) == 0
    return False


def _raising_on(*signals: signal.Signals):
    """Inside: these signals raise Stopped, so the task is stopped with bsops instead of left training without
    it (a second launch would then train the same run at the same time); processes.raising_on."""
    return processes.raising_on(signals, lambda sig: Stopped(f"stopped by {sig.name}", sig.name))


def _stop(proc: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM the task's process group (its launchers pass it on to the trainers) and wait until all of it has
    ended; SIGKILL what is left after `grace_s` (processes.stop_tree, the one stop of a local job)."""
    processes.stop_tree(proc, grace_s)
