"""Site-specific values: the ones that belong to one cluster and one team, never to a model.

An experiment with `base: tr1-13B` would otherwise run under the original team's Slurm account,
write to its scratch paths, email its list and push its logs (with your Hub token) to its remote. `inherited_site_values` names every such value an
experiment takes from a base file rather than its own, so `bsops show` and `plan` can list them;
`new_experiment_text` writes a new experiment that resets them all.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from bigscience_ops.config import experiment_path, field_origins
from bigscience_ops.schema import Experiment

# Field paths whose value depends on the cluster or the team, with what to put there.
SITE_FIELDS: dict[str, str] = {
    "slurm.partition": "your cluster's GPU partition",
    "slurm.account": "your Slurm account",
    "slurm.constraint": "a node feature such as v100-32g or a100 (also tells the plan the GPU memory)",
    "slurm.qos": "your QOS",
    "slurm.group": "the Unix group whose jobs the watchdog counts",
    "slurm.env_setup": "shell lines that load your modules and activate the environment with bsops",
    "slurm.exclude": "nodes to avoid on your cluster",
    "slurm.gpu_memory_gb": "GB of one GPU when the constraint does not say",
    "paths.output": "the run folder on your scratch; default runs/NAME",
    "paths.checkpoints": "default <output>/checkpoints",
    "paths.tensorboard": "default <output>/tensorboard",
    "paths.logs": "default <output>/logs",
    "paths.codecarbon": "default <output>/codecarbon",
    "data.blend": "your dataset prefixes (bsops preprocess writes them)",
    "data.tokenizer": "your tokenizer files",
    "data.cache_dir": "where index files go when the data folder is read-only",
    "hub.logs_repo": "your Hub repo for logs",
    "hub.tensorboard_repo": "your Hub repo for TensorBoard",
    "hub.codecarbon_repo": "your Hub repo for codecarbon",
    "hub.checkpoints_repo": "your Hub repo for checkpoints",
    "hub.host": "your Hub's host: the token goes only there, over https",
    "hub.remote_template": "your git remote instead of the Hub, or none (another team's gets your token's pushes)",
    "hub.token_env": "the environment variable with your Hub token",
    "hub.private": "whether repos bsops creates on your Hub are private",
    "alerts.email_to": "who is told when the training stops",
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
    own = str(experiment_path(name, trainings_dir))
    origins = field_origins(name, trainings_dir)
    found = {}
    for dotted in SITE_FIELDS:
        source = _set_by(origins, dotted)
        if source is not None and source != own:
            found[dotted] = source
    return found


def new_experiment_text(name: str, base: str) -> str:
    """A new experiment on `base` that resets every site-specific value the base sets."""
    sections: dict[str, list[str]] = {}
    for dotted, what in SITE_FIELDS.items():
        section, key = dotted.split(".")
        if key == "tokenizer":
            sections.setdefault(section, []).append(f"  # {key}: {{kind: gpt2-bpe, vocab_file: ..., merges_file: ...}}"
                                                    f"   # {what}; inherited until set")
            continue
        spec = {f.name: f for f in dataclasses.fields(Experiment.__dataclass_fields__[section].default_factory)}[key]
        default = spec.default_factory() if spec.default is dataclasses.MISSING else spec.default
        empty = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        sections.setdefault(section, []).append(f"  {key}: {empty}   # {what}")
    lines = [f"# {name}: written by `bsops new {name} --base {base}`.",
             f"# Model, batch and schedule come from {base}; every value that belongs to a cluster or a team",
             "# is reset below: fill in yours. `bsops show` and `bsops plan` list what is still inherited.",
             f"base: {base}",
             f"description: {base} on this cluster",
             ""]
    for section, entries in sections.items():
        lines.append(f"{section}:")
        lines.extend(entries)
    return "\n".join(lines) + "\n"
