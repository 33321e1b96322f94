"""bigscience_ops.schema: every number an experiment (or cron.yaml) holds has a lower and an upper bound."""

from __future__ import annotations

import dataclasses
import typing
from datetime import datetime, timedelta

from bigscience_ops import schema
from bigscience_ops.ops.cron.runner import CronSettings


def numeric_fields(cls: type, prefix: str = "") -> dict[str, dict]:
    """Every int or float field under `cls`, by dotted path, with its bounds."""
    out: dict[str, dict] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        tp = next((a for a in typing.get_args(hints[f.name]) if a is not type(None)), hints[f.name])
        if typing.get_origin(tp) is list:
            tp = typing.get_args(tp)[0]
        if dataclasses.is_dataclass(tp):
            out |= numeric_fields(tp, f"{prefix}{f.name}.")
        elif tp in (int, float):
            out[prefix + f.name] = f.metadata.get("bounds", {})
    return out


def test_every_number_is_bounded_below_and_above() -> None:
    fields = numeric_fields(schema.Experiment) | numeric_fields(CronSettings, "cron.")
    assert len(fields) > 70 and "alerts.health.window" in fields and "cron.alerts.cooldown_minutes" in fields
    unbounded = {path: bounds for path, bounds in fields.items()
                 if not ({"at_least", "above"} & set(bounds) and {"below", "at_most"} & set(bounds))}
    assert unbounded == {}


def test_minutes_at_their_bound_still_fit_a_date() -> None:
    """The watchdog adds cooldown and stall minutes to now: a bound of a year never overflows."""
    fields = numeric_fields(schema.Experiment)
    for path in ("alerts.cooldown_minutes", "alerts.stall_minutes", "checkpoint.exit_duration_in_mins",
                 "parallel.collective_timeout_minutes"):
        assert datetime.now() + timedelta(minutes=fields[path]["at_most"]) < datetime(9999, 1, 1), path
