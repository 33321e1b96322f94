"""Hostile experiment files and names: each is one clear error line (file, field, value, what is allowed),
exit code 2, no traceback, nothing written, and never a hang (values are refused before anything is computed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main

ALIASES = "description: &a " + "y" * 100_000 + "\nslurm: {exclude: [" + ", ".join(["*a"] * 3000) + "]}\n"
LAUGHS = "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefg", "bcdefgh"))

HOSTILE = {
    # numbers
    "a batch size no run has": ("batch: {global_batch_size: 1e10}\n", "batch.global_batch_size", "4,194,304"),
    "a seed of 100 million digits": ("train: {seed: 1e100000000}\n", "train.seed", "at most 19 digits"),
    "a negative seed": ("train: {seed: -1}\n", "train.seed", "[0, 4,294,967,296)"),
    "an integer of 5000 digits": ("train: {seed: " + "9" * 5000 + "}\n", "", "4300 digits"),
    "an infinite learning rate": ("optimizer: {lr: .inf}\n", "optimizer.lr", "a finite number"),
    "a NaN learning rate": ("optimizer: {lr: .nan}\n", "optimizer.lr", "a finite number"),
    "a float beyond 1e308": ("optimizer: {lr: 1e400}\n", "optimizer.lr", "a finite number"),
    "a port above 65535": ("slurm: {master_port: 999999}\n", "slurm.master_port", "[1, 64,536)"),
    "an SMTP port above 65535": ("alerts: {smtp_port: 70000}\n", "alerts.smtp_port", "[1, 65,536)"),
    "1e41 layers": ("model: {num_layers: 1e41}\n", "model.num_layers", "at most 19 digits"),
    "1e30 samples": ("train: {samples: 1e30}\n", "train.samples", "at most 19 digits"),
    "more steps than any run": ("train: {samples: 1e14}\n", "train.samples", "steps"),
    "a rampup of a billion steps": ("batch: {rampup: {start: 1, increment: 1, samples: 1e12}}\n",
                                    "batch.rampup.samples", "steps"),
    "a cooldown of 1e15 minutes": ("alerts: {cooldown_minutes: 1e15}\n", "alerts.cooldown_minutes", "[1, 525,600]"),
    "a stall limit of 1e15 minutes": ("alerts: {stall_minutes: 1e15}\n", "alerts.stall_minutes", "[1, 525,600]"),
    "a thousand push attempts": ("hub: {push_attempts: 1000}\n", "hub.push_attempts", "[1, 10]"),
    "a negative AdamW epsilon": ("optimizer: {eps: -1}\n", "optimizer.eps", "(0, 1]"),
    "a negative LayerNorm epsilon": ("model: {layernorm_epsilon: -1}\n", "model.layernorm_epsilon", "(0, 1]"),
    "a negative init std": ("model: {init_method_std: -1}\n", "model.init_method_std", "(0, 1]"),
    "a negative min_lr": ("optimizer: {min_lr: -1}\n", "optimizer.min_lr", "[0, 1]"),
    "a learning rate of 1e300": ("optimizer: {lr: 1e300}\n", "optimizer.lr", "(0, 1]"),
    "1e16 TFLOPs per GPU": ("estimate: {tflops_per_gpu: 1e16}\n", "estimate.tflops_per_gpu", "(0, 100,000]"),
    "an LFS threshold of 1e300 MB": ("hub: {lfs_size_mb: 1e300}\n", "hub.lfs_size_mb", "(0, 1,000,000]"),
    "a collective timeout of a billion minutes": ("parallel: {collective_timeout_minutes: 1e9}\n",
                                                  "parallel.collective_timeout_minutes", "[1, 10,080]"),
    "keeping 1e12 checkpoints": ("backup: {keep_last: 1e12}\n", "backup.keep_last", "[1, 10,000,000]"),
    "a health window of a billion lines": ("alerts: {health: {window: 1e9}}\n", "alerts.health.window",
                                           "[2, 100,000]"),
    "a billion recent lines": ("alerts: {health: {recent: 1e9}}\n", "alerts.health.recent", "[1, 100,000]"),
    "a billion nodes": ("slurm: {nodes: 1e9}\n", "slurm.nodes", "[1, 1,048,576)"),
    "a warning signal Slurm cannot send": ("slurm: {signal_seconds: 99999}\n", "slurm.signal_seconds", "[1, 65,535]"),
    "a curriculum of 1e18 steps": ("curriculum: {total_curriculum_step: 1e18}\n", "curriculum.total_curriculum_step",
                                   "[1, 262,144)"),
    "a save range ending before step 1": ("checkpoint: {save_schedule: [{until: -5, interval: 1}]}\n",
                                          "checkpoint.save_schedule[0].until", "[1, 10,000,000]"),
    "a blend weight of 1e300": ("data: {blend: [{prefix: corpus/build/tiny_text_document, weight: 1e300}]}\n",
                                "data.blend[0].weight", "(0, 1,000,000]"),
    # YAML structure
    "a section given twice": ("slurm: {nodes: 1}\nslurm: {nodes: 2}\n", "", "given twice"),
    "5000-deep nesting": ("description: " + "[" * 5000 + "]" * 5000 + "\n", "", "nested deeper"),
    "3000 aliases of 100 kB": (ALIASES, "", "aliases are expanded"),
    "a billion laughs": (LAUGHS, "", "aliases are expanded"),
    "a 2 MB file": ("description: " + "z" * (2 << 20) + "\n", "", "bytes"),
    "bytes that are not UTF-8": (b"description: \xff\xfe\n", "", "UTF-8 text"),
    "a YAML tag that builds objects": ("description: !!python/object/apply:os.system ['touch pwned']\n", "",
                                       "valid YAML"),
    # line breaks other than \n
    "U+2028 in a job name": ("slurm: {job_name: \"a\\u2028b\"}\n", "slurm.job_name", "U+2028"),
    "U+0085 in the description": ("description: \"a\\x85b\"\n", "description", "U+0085"),
    "a vertical tab in the account": ("slurm: {account: \"a\\vb\"}\n", "slurm.account", "U+000B"),
    "a form feed in the output path": ("paths: {output: \"runs/a\\fb\"}\n", "paths.output", "U+000C"),
    "a record separator in the partition": ("slurm: {partition: \"a\\x1eb\"}\n", "slurm.partition", "U+001E"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_experiment_file_is_one_clear_error(case: str, trainings: Path, tmp_path: Path,
                                                      monkeypatch) -> None:
    body, field, allowed = HOSTILE[case]
    path = trainings / "hostile.yaml"
    header = b"base: tiny\n"
    path.write_bytes(header + (body if isinstance(body, bytes) else body.encode()))
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = CliRunner().invoke(main, ["plan", "hostile", "--trainings-dir", str(trainings)])
    lines = result.output.strip().split("\n")
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output[:2000]
    assert lines[0].startswith(f"error: {path}: {field}" if field else f"error: {path}: got"), lines[0][:300]
    assert allowed in lines[0], lines[0][:300]
    assert len(lines[0]) < 1200  # a 100 kB value is named, not printed
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("name", ["-rf", "a b", "x;reboot", ".hidden", "é", "a" * 101])
def test_experiment_names_that_cannot_be_files_job_names_and_shell_words_are_refused(name: str, trainings: Path,
                                                                                      tmp_path: Path) -> None:
    before = sorted(trainings.iterdir())
    result = CliRunner().invoke(main, ["new", "--base", "tiny", "--trainings-dir", str(trainings), "--", name])
    assert result.exit_code == 2 and "letters, digits" in result.output and "Traceback" not in result.output
    assert sorted(trainings.iterdir()) == before
    if "/" not in name and len(name) < 100:
        (trainings / f"{name}.yaml").write_text("base: tiny\n")
        loaded = CliRunner().invoke(main, ["plan", str(trainings / f"{name}.yaml")])
        assert loaded.exit_code == 2 and "name: got" in loaded.output and "letters, digits" in loaded.output
