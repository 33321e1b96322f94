"""The eval job: templates/eval.slurm.j2 rendered for one checkpoint, and its submission through the Slurm executor.

The job starts the same ranks as `bsops eval run --step N` does on one machine (launcher.worker_argv), one torchrun per
node under srun with the training's rendezvous (templates/train.slurm.j2): TP x PP processes of the config's layout
over eval.nodes nodes (derived: the processes over slurm.gpus_per_node). The ranks read the experiment the scheduler
decided with, written resolved beside the script (<tag>.experiment.json, as a launch writes the trainer's
experiment.json), so an edit of the YAML between the submission and the job's start changes nothing of it. The
job's partition, account, qos and time are eval.*'s, each falling back to slurm.*'s; the device, CPUs and
environment set-up are slurm.*'s, and it asks for the GPUs its processes use on each node. The job runs offline
(HF_DATASETS_OFFLINE, HF_HUB_OFFLINE), reading lm-eval's datasets from eval.hf_cache (HF_HOME, HF_DATASETS_CACHE,
HF_HUB_CACHE) when it is set: `bsops eval prefetch` fills it where there is network.
Every value goes through the template environment of render.py: shell values quoted, #SBATCH values written for
sbatch's own parser, Slurm names checked against their character sets, so `sbatch -vv` reads each as one value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bigscience_ops import __version__
from bigscience_ops.launch import jobs
from bigscience_ops.launch import render as rendering
from bigscience_ops.checkpoints import layout
from bigscience_ops.errors import ConfigError
from bigscience_ops.ops.evaluate import launcher
from bigscience_ops.ops.evaluate.prefetch import cache_env
from bigscience_ops.ops.evaluate.next_eval import job_name
from bigscience_ops.schema import PORT_SPREAD, Experiment

TEMPLATE = "eval.slurm.j2"
SCRIPTS = "jobs"
"""<output>/eval/jobs/<tag>.slurm and <tag>.experiment.json: the last eval job of each checkpoint."""
LOGS = "logs"
"""<output>/eval/logs/<tag>-<job id>.out: each eval job's output."""


@dataclass(frozen=True)
class EvalJob:
    """One rendered eval job: its script's path and text, the experiment its ranks read, and its logs' folder."""

    script: Path
    text: str
    log_folder: Path
    experiment: Path
    experiment_text: str
    name: str = ""
    """Its Slurm name (schedule.job_name): bsops.<training job name>.eval."""

    def log(self, tag: str, job_id: str) -> Path:
        return self.log_folder / f"{tag}-{job_id}.out"

    def as_job(self) -> jobs.ScriptJob:
        """The job as every executor takes it: the experiment record first, then the script; the log folder made."""
        return jobs.ScriptJob(self.name, self.script, self.text, ((self.experiment, self.experiment_text),),
                              (self.log_folder,), kind="eval")


def shape(exp: Experiment) -> tuple[int, int]:
    """(nodes, processes per node) of exp's eval job: TP x PP processes over eval.nodes (derived when unset). Raises
    ConfigError when they do not split evenly over the nodes, or need more GPUs per node than slurm.gpus_per_node."""
    processes = exp.parallel.tensor * exp.parallel.pipeline
    per_node = exp.slurm.gpus_per_node
    nodes = exp.eval.nodes or -(-processes // per_node)
    if processes % nodes or (exp.slurm.device == "gpu" and processes // nodes > per_node):
        raise ConfigError(f"experiment {exp.name}", "eval.nodes", nodes,
                          f"the eval job runs TP x PP = {processes} processes, the same number on each node, at most "
                          f"slurm.gpus_per_node = {per_node} per node; allowed: a divisor of {processes} of at least "
                          f"{-(-processes // per_node)}")
    return nodes, processes // nodes


def render(exp: Experiment, ckpt: layout.Checkpoint, folder: Path, *, workdir: Path) -> EvalJob:
    """The eval job of checkpoint `ckpt` of `exp`'s run, its script, experiment record and logs under `folder`
    (<output>/eval/); the ranks start in `workdir`."""
    folder, workdir = Path(folder).resolve(), Path(workdir).resolve()
    record = folder / SCRIPTS / f"{ckpt.tag}.experiment.json"
    nodes, per_node = shape(exp)
    ev, s = exp.eval, exp.slurm
    name = job_name(exp)
    worker = launcher.worker_argv(str(record), ckpt.step, exp.parallel.tensor, exp.parallel.pipeline, None, workdir)
    record_text = launcher.experiment_record(exp)
    hf_env = sorted(cache_env(ev.hf_cache, offline=True).items())
    options = dict(rendering.slurm_options(f"experiment {exp.name}", {
        "job-name": name, "partition": ev.partition or s.partition or None, "account": ev.account or s.account or None,
        "qos": ev.qos or s.qos or None}))
    logs = folder / LOGS
    text = rendering.environment().get_template(TEMPLATE).render(
        version=__version__, job_name=options.pop("job-name"), experiment_name=exp.name, tag=ckpt.tag, nodes=nodes,
        nproc_per_node=per_node, processes=nodes * per_node, tensor=exp.parallel.tensor,
        pipeline=exp.parallel.pipeline, gpu=s.device == "gpu",
        cpus_per_task=s.cpus_per_task, time=ev.time, optional=list(options.items()),
        output=rendering.output_option(logs, f"{ckpt.tag}-%j.out"),
        env_setup=[rendering.Raw(line) for line in s.env_setup], workdir=str(workdir),
        master_port=s.master_port, port_spread=PORT_SPREAD,
        threads_per_process=max(1, s.cpus_per_task // per_node), worker=worker, hf_env=hf_env,
    )
    return EvalJob(folder / SCRIPTS / f"{ckpt.tag}.slurm", text, logs, record, record_text, name)


def submit(job: EvalJob, tag: str, executor: jobs.Executor[jobs.ScriptJob, jobs.SlurmJob] | None = None
           ) -> tuple[str, Path]:
    """Write the experiment record and the script, make the log folder (Slurm does not) and submit the job through
    the Slurm executor (jobs.SlurmScripts, the way every job bsops starts goes out): (the job id, its log file)."""
    handle = jobs.run_job(job.as_job(), executor or jobs.SlurmScripts())
    job_id = handle.job_id or ""
    return job_id, job.log(tag, job_id)
