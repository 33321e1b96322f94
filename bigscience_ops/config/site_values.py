"""Site-specific values: the ones that belong to one cluster and one team, never to a model.

An experiment with `base: tr1-13B` would otherwise run under the original team's Slurm account,
write to its scratch paths, email its list and push its logs (with your Hub token) to its remote.
`inherited_site_values` names every such value an experiment takes from a base file rather than its
own, so `bsops show` and `plan` can list them; `new_experiment_text` writes a new experiment that
resets them all.

`missing_site_values` names the site values a job needs that are not set (what `plan` lists as the
experiment's to-do, and `render` and `launch` refuse without --allow-incomplete):
- every launch, local or on Slurm: `data.blend` and the tokenizer's files (`data.tokenizer`);
- a Slurm job: `slurm.partition` when the cluster has no default partition (sinfo marks none with
  `*`), `slurm.account` when the cluster takes jobs only under an account (`scontrol show config`:
  AccountingStorageEnforce holds associations, limits, qos or safe). Both are asked of Slurm where it
  answers; where it does not, they are not required, and the check says why it was not made;
- a Slurm job on GPUs (`slurm.device: gpu`, a real cluster's): `slurm.env_setup` (the lines that load
  the nodes' modules and put bsops on the job's PATH) and an alert address (`alerts.email_to` or
  `alerts.webhook_url_env`: a months-long training nobody hears about when it stops; not for a record, whose
  run's addresses are set aside: trying one mails nobody). A `device: cpu`
  experiment is a rehearsal on one machine (tiny): the job inherits the submitting shell's PATH and
  nobody is on call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from bigscience_ops import slurm
from bigscience_ops.config.loading import COMMAND_LINE, field_origins, load_experiment
from bigscience_ops.config.files import experiment_path
from bigscience_ops.errors import BsopsError
from bigscience_ops.schema import Experiment, TokenizerConfig

# Field paths whose value depends on the cluster or the team, with what to put there.
SITE_FIELDS: dict[str, str] = {
    "slurm.partition": "your cluster's GPU partition",
    "slurm.account": "your Slurm account",
    "slurm.constraint": "a node feature such as v100-32g or a100 (also tells the plan the GPU memory)",
    "slurm.qos": "your QOS",
    "slurm.group": "the Unix group whose jobs the watchdog counts",
    "slurm.env_setup": "shell lines that load your modules and activate the environment with bsops (puts bsops "
                       "on the job's PATH)",
    "slurm.exclude": "nodes to avoid on your cluster",
    "slurm.gpu_memory_gb": "GB of one GPU when the constraint does not say",
    "paths.output": "the run folder on your scratch; default runs/NAME",
    "paths.checkpoints": "default <output>/checkpoints",
    "paths.tensorboard": "default <output>/tensorboard",
    "paths.logs": "default <output>/logs",
    "paths.codecarbon": "default <output>/codecarbon",
    "data.blend": "your dataset prefixes (bsops preprocess writes them)",
    "data.tokenizer": "your tokenizer: kind gpt2-bpe with vocab_file and merges_file, or kind json with json_file",
    "data.cache_dir": "where index files go when the data folder is read-only",
    "hub.logs_repo": "your Hub repo for logs",
    "hub.tensorboard_repo": "your Hub repo for TensorBoard",
    "hub.codecarbon_repo": "your Hub repo for codecarbon",
    "hub.checkpoints_repo": "your Hub repo for checkpoints",
    "hub.host": "your Hub's host: the token goes only there, over https",
    "hub.remote_template": "your git remote instead of the Hub, or none (another team's gets your token's pushes)",
    "hub.token_env": "the environment variable with your Hub token",
    "hub.private": "whether repos bsops creates on your Hub are private",
    "alerts.email_to": "who is told when the training stops (or set alerts.webhook_url_env)",
    "alerts.email_from": "the sender address",
    "alerts.smtp_host": "your SMTP server",
    "alerts.webhook_url_env": "the environment variable with your chat webhook's URL, or none",
    "backup.dest": "your backup store",
}


def _set_by(origins: dict[str, str], dotted: str) -> str | None:
    """The file that set `dotted` itself or, for a section such as data.tokenizer, the last of its keys."""
    if dotted in origins:
        return origins[dotted]
    children = [src for key, src in origins.items() if key.startswith(dotted + ".")]
    return children[-1] if children else None


def inherited_site_values(name: str, trainings_dir: Path | None = None) -> dict[str, str]:
    """Site-specific field path -> the base file it comes from, for those EXP's own file does not set."""
    return inherited_from(field_origins(name, trainings_dir), experiment_path(name, trainings_dir))


def inherited_from(origins: dict[str, str], experiment_file: Path) -> dict[str, str]:
    """`inherited_site_values` from field origins read already (config.load_with_origins, run.open's `origins`):
    those set neither by `experiment_file` itself nor on the command line."""
    own = str(experiment_file)
    found = {}
    for dotted in SITE_FIELDS:
        source = _set_by(origins, dotted)
        if source is not None and source not in (own, COMMAND_LINE):
            found[dotted] = source
    return found


def new_experiment_text(name: str, base: str, trainings_dir: Path | None = None) -> str:
    """A new experiment on `base` that resets every site-specific value the base sets (its tokenizer keeps
    the base's kind, with its files blank)."""
    kind = load_experiment(base, trainings_dir).data.tokenizer.kind
    sections: dict[str, list[str]] = {}
    for dotted, what in SITE_FIELDS.items():
        section, key = dotted.split(".")
        if key == "tokenizer":
            blank = {f.name: None for f in dataclasses.fields(TokenizerConfig)} | {"kind": kind}
            empty = yaml.safe_dump(blank, default_flow_style=True, sort_keys=False).strip()
            sections.setdefault(section, []).append(f"  {key}: {empty}   # {what}")
            continue
        spec = {f.name: f for f in dataclasses.fields(Experiment.__dataclass_fields__[section].default_factory)}[key]
        default = spec.default_factory() if spec.default is dataclasses.MISSING else spec.default
        empty = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        sections.setdefault(section, []).append(f"  {key}: {empty}   # {what}")
    lines = [f"# {name}: written by `bsops new {name} --base {base}`.",
             f"# Model, batch and schedule come from {base}; every value that belongs to a cluster or a team",
             f"# is reset below: fill in yours. `bsops plan {name}` lists the ones a job still needs.",
             f"base: {base}",
             f"description: {base} on this cluster",
             ""]
    for section, entries in sections.items():
        lines.append(f"{section}:")
        lines.extend(entries)
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- what a job needs

class IncompleteExperiment(BsopsError):
    """An experiment lacks site values a job needs (`blanks`); render and launch refuse it."""

    def __init__(self, name: str, blanks: list[Blank]) -> None:
        self.blanks = blanks
        fields = ", ".join(b.field for b in blanks)
        super().__init__(f"{name} is incomplete: {len(blanks)} value(s) a job needs are not set ({fields}); "
                         f"`bsops plan {name}` lists what to put there; or pass --allow-incomplete")


@dataclass(frozen=True)
class Blank:
    """A site value a job needs that the experiment does not set, and what to put there."""

    field: str
    what: str

    def line(self) -> str:
        return f"{self.field}: {self.what}"


@dataclass(frozen=True)
class ClusterRules:
    """What the cluster asks of every job: a partition (none is the default), an account (associations
    enforced). `unknown` says why Slurm could not be asked; then neither is required."""

    partition: bool = False
    account: bool = False
    unknown: str | None = None
    error: slurm.SlurmError | None = None  # what asking failed with (a launch then knows the queue cannot be asked)


@dataclass(frozen=True)
class SiteCheck:
    blanks: list[Blank]
    cluster_note: str | None = None  # why the cluster's needs (partition, account) were not checked
    cluster_error: slurm.SlurmError | None = None  # the error behind cluster_note


PROBE_TIMEOUT_S = 10.0


def cluster_rules(timeout: float = PROBE_TIMEOUT_S) -> ClusterRules:
    """Ask Slurm whether a job needs --partition and --account here; never raises."""
    try:
        partition, account = slurm.cluster_needs(timeout=timeout)
    except slurm.SlurmError as exc:
        return ClusterRules(unknown=str(exc), error=exc)
    return ClusterRules(partition, account)


def tokenizer_blank(tok: TokenizerConfig) -> bool:
    if tok.kind == "gpt2-bpe":
        return tok.vocab_file is None or tok.merges_file is None
    return tok.json_file is None


def missing_site_values(exp: Experiment, *, slurm_job: bool = True, cluster: ClusterRules | None = None) -> SiteCheck:
    """The site values a job of `exp` needs that are not set (the module's docstring has the rule). For a
    Slurm job the cluster is asked (cluster_rules) unless `cluster` is given, and only when partition or
    account is unset."""
    blanks = []
    if not exp.data.blend:
        blanks.append(Blank("data.blend", SITE_FIELDS["data.blend"]))
    if tokenizer_blank(exp.data.tokenizer):
        blanks.append(Blank("data.tokenizer", SITE_FIELDS["data.tokenizer"]))
    if not slurm_job:
        return SiteCheck(blanks)
    s, note, error = exp.slurm, None, None
    if not (s.partition and s.account):
        cluster = cluster or cluster_rules()
        note, error = cluster.unknown, cluster.error
        if cluster.partition and not s.partition:
            blanks.append(Blank("slurm.partition", "your cluster's partition (it has no default one)"))
        if cluster.account and not s.account:
            blanks.append(Blank("slurm.account", "your Slurm account (the cluster takes jobs only under one)"))
    if s.device == "gpu":
        if not s.env_setup:
            blanks.append(Blank("slurm.env_setup", SITE_FIELDS["slurm.env_setup"]))
        # A record (bsops' bundled seeds) tells nobody on purpose: its run's addresses are set aside.
        if not exp.alerts.email_to and not exp.alerts.webhook_url_env and not exp.record:
            blanks.append(Blank("alerts.email_to", SITE_FIELDS["alerts.email_to"]))
    return SiteCheck(blanks, note, error)


def check_complete(exp: Experiment, *, slurm_job: bool = True, allow_incomplete: bool = False) -> SiteCheck:
    """missing_site_values, raising IncompleteExperiment when any is missing, unless `allow_incomplete`."""
    check = missing_site_values(exp, slurm_job=slurm_job)
    if check.blanks and not allow_incomplete:
        raise IncompleteExperiment(exp.name, check.blanks)
    return check
