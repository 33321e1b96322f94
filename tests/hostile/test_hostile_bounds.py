"""Every number the loader accepts is one every later stage accepts: each bounded field of the schema at its smallest
and largest allowed value, on an experiment based on tiny, through `bsops launch --dry-run` (which plans it as
`bsops plan` does and renders its job as `bsops render` does: build_launch_plan)
(and `status` for the watchdog's own settings, `eval next` for the eval section's, whose resolved experiment the
ranks must load again). Each either works or is refused with an `error:` line, never a traceback, and in seconds
(a value a later stage takes minutes over is no value to accept)."""

from __future__ import annotations

import dataclasses
import math
import os
import time
import types
import typing
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bigscience_ops import schema
from bigscience_ops.cli import main
from tests.fixtures_runs import commit_checkpoint
from tests.fixtures_slurm import replay_sbatch, replay_squeue, sbatch_calls

TINY_PREFIX = "corpus/build/tiny_text_document"
METRIC = "kjv_epistles/bits_per_byte"
SECONDS = 60.0
"""A hang detector, not a speed test: tiny's own plan takes a tenth of a second; only an extreme value that sends a
command into a loop bounded by the value itself (a 10**18-step schedule walked step by step) gets near this."""


def bounded_fields(cls: type, prefix: tuple = ()) -> dict[tuple, tuple[type, dict]]:
    """Every number under `cls` with its bounds, by path: ("model", "num_layers"), ("slurm", "node_schedule", "[]", "nodes")
    for a field of a list's items, ("eval", "references", "{}", "{}") for the values of a mapping (of mappings)."""
    out: dict[tuple, tuple[type, dict]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        tp, path = hints[f.name], (*prefix, f.name)
        if typing.get_origin(tp) in (typing.Union, types.UnionType):  # X | None: X
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        while typing.get_origin(tp) in (list, dict):
            inner = typing.get_args(tp)[-1]
            path, tp = (*path, "[]" if typing.get_origin(tp) is list else "{}"), inner
        if dataclasses.is_dataclass(tp):
            out |= bounded_fields(tp, path)
        elif tp in (int, float):
            out[path] = (tp, f.metadata.get("bounds", {}))
    return out


NUMBERS = bounded_fields(schema.Experiment)
FIELDS = {path: kind for path, kind in NUMBERS.items() if kind[1]}


def extremes(tp: type, bounds: dict) -> tuple:
    """The smallest and the largest value the bounds allow."""
    step = (lambda x, to: x + (1 if to > x else -1)) if tp is int else math.nextafter
    low = bounds["at_least"] if "at_least" in bounds else step(bounds["above"], math.inf)
    high = bounds["at_most"] if "at_most" in bounds else step(bounds["below"], -math.inf)
    return (tp(low), tp(high)) if tp is int else (float(low), float(high))


def section(path: tuple, value) -> dict:
    """The experiment file's mapping that sets `path` to `value` over tiny (a list gets the items tiny's own would
    have; a mapping one key)."""
    top, *rest = path
    if top == "slurm" and rest[:2] == ["node_schedule", "[]"]:
        phases = [{"nodes": value}] if rest[2] == "nodes" else [{"nodes": 2}, {"nodes": 2, rest[2]: value}]
        return {"slurm": {"nodes": None, "node_schedule": phases}}
    if top == "checkpoint" and rest[:2] == ["save_schedule", "[]"]:
        return {"checkpoint": {"save_schedule": [{"until": 100, "interval": 10} | {rest[2]: value}]}}
    if top == "data" and rest[:2] == ["blend", "[]"]:
        return {"data": {"blend": [{"prefix": TINY_PREFIX, rest[2]: value}]}}
    if rest[-2:] == ["{}", "{}"]:
        return {top: {rest[0]: {"GPT2": {METRIC: value}}}}
    if rest[-1:] == ["{}"]:
        return {top: {rest[0]: {METRIC: value}}}
    data: dict = {}
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return data


CASES = [pytest.param(path, which, id=f"{'.'.join(p for p in path if p not in ('[]', '{}'))}-{which}")
         for path in FIELDS for which in ("min", "max")]
WATCHDOG = ("alerts",)
"""Sections `bsops status` reads too (its Slurm query fails fast here: the run's values are still read and checked)."""


def test_no_number_hides_unbounded_in_a_list_or_a_mapping() -> None:
    """test_schema checks the plain fields; a mapping's values (eval.references was one) and a list's items too."""
    unbounded = [path for path, (_, bounds) in NUMBERS.items()
                 if not ({"at_least", "above"} & set(bounds) and {"below", "at_most"} & set(bounds))]
    assert unbounded == []


def test_the_table_covers_every_kind_of_bounded_field() -> None:
    paths = {".".join(path) for path in FIELDS}
    assert len(FIELDS) > 70
    assert {"model.num_layers", "eval.references.{}.{}", "eval.alert_drop.{}", "data.blend.[].weight",
            "slurm.node_schedule.[].from_samples", "alerts.health.scale_collapse"} <= paths


@pytest.mark.parametrize(("path", "which"), CASES)
def test_each_bounds_extreme_works_or_is_refused_clearly(path: tuple, which: str, trainings: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    tp, bounds = FIELDS[path]
    value = extremes(tp, bounds)[0 if which == "min" else 1]
    data = {"base": "tiny", **section(path, value)}
    (trainings / "edge.yaml").write_text(yaml.safe_dump(data))
    commands = [["launch", "--dry-run"]]  # plans (as `bsops plan` does) and renders the job (as `bsops render` does)
    if path[0] in WATCHDOG:
        commands.append(["status", "--timeout", "2"])
    for command in commands:
        started = time.monotonic()
        result = CliRunner().invoke(main, [command[0], "edge", *command[1:], "--trainings-dir", str(trainings)])
        took = time.monotonic() - started
        said = f"{' '.join(command)} with {path} = {value!r}: exit {result.exit_code} in {took:.1f} s\n{result.output}"
        assert result.exception is None or isinstance(result.exception, SystemExit), said
        assert "Traceback" not in result.output, said
        assert took < SECONDS, said  # far from the time it takes: see SECONDS
        if command[0] == "status":
            assert result.exit_code in (0, 1, 2), said  # 2: Slurm cannot be asked here; the values were read
        elif result.exit_code != 0:
            assert result.exit_code in (1, 2) and "error:" in result.output, said
            return  # the loader or the plan refused it: the later commands load the same file
    if path[0] == "eval":
        _eval_next_takes(value, path, monkeypatch, trainings)


def _eval_next_takes(value, path: tuple, monkeypatch: pytest.MonkeyPatch, trainings: Path) -> None:
    """`bsops eval next edge` writes the eval job of a complete checkpoint (squeue and sbatch answer with their
    recorded real output), and the resolved experiment it writes beside the script is one the ranks' loader
    (config.from_dict) takes."""
    from bigscience_ops.config.loading import from_dict

    checkpoint = trainings.parent / "runs/edge/checkpoints/global_step50"  # where tiny's relative paths resolve
    checkpoint.mkdir(parents=True)
    (checkpoint / "bsops.json").write_text('{"iteration": 50}')
    commit_checkpoint(checkpoint)
    (checkpoint.parent / "latest").write_text("global_step50")
    stand_ins = replay_sbatch(replay_squeue(trainings.parent / "bin", "squeue.txt"))
    monkeypatch.setenv("PATH", f"{stand_ins}:{os.environ['PATH']}")
    result = CliRunner().invoke(main, ["eval", "next", "edge", "--trainings-dir", str(trainings)])
    submitted = sbatch_calls(stand_ins)
    said = f"eval next with {path} = {value!r}: exit {result.exit_code}\n{result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), said
    if result.exit_code != 0:
        assert result.exit_code == 2 and "error:" in result.output, said
        return
    if not submitted:  # eval.every_saves chose no saved step: nothing to write
        assert path[1] == "every_saves", said
        return
    written = Path(submitted[0][-1]).with_suffix(".experiment.json")
    assert written.is_file(), said
    from_dict(yaml.safe_load(written.read_text()), str(written))


def test_a_reference_of_1e308_is_refused_by_plan_naming_it(trainings: Path) -> None:
    """It passed the loader, and then the resolved experiment.json the ranks read was refused: every eval failed."""
    # As a person writes it: YAML reads `1e308` (no dot) as text, which the loader took as the float it spells.
    (trainings / "edge.yaml").write_text(f"base: tiny\neval: {{references: {{GPT2: {{{METRIC}: 1e308}}}}}}\n")
    result = CliRunner().invoke(main, ["plan", "edge", "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and f"eval.references.GPT2.{METRIC}" in result.output, result.output
