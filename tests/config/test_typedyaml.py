"""bigscience_ops.typedyaml's bounds: only the bounds a field sets are checked, and the error says the range."""

from __future__ import annotations

import dataclasses

import pytest

from bigscience_ops.errors import ConfigError
from bigscience_ops.typedyaml import _within, bounds_text, build, documented


@pytest.mark.parametrize(("value", "bounds", "inside"), [
    (1e16, {"above": 0}, True),  # past 2**53, value + 1 == value: an unset upper bound must not refuse it
    (1e300, {"above": 0}, True),
    (2.0**53, {"at_least": 0}, True),
    (-1.0, {"above": 0}, False),
    (0.0, {"above": 0}, False),
    (0.0, {"at_least": 0}, True),
    (1.0, {"above": 0, "at_most": 1}, True),
    (1.0, {"above": 0, "below": 1}, False),
    (1e300, {"above": 0, "at_most": 1e6}, False),
    (10, {"at_least": 1, "at_most": 10}, True),
    (11, {"at_least": 1, "at_most": 10}, False),
    (-(2**63), {"below": 0}, True),
])
def test_within_checks_only_the_bounds_that_are_set(value: float, bounds: dict, inside: bool) -> None:
    assert _within(value, bounds) is inside


@pytest.mark.parametrize(("bounds", "text"), [
    ({"at_least": 1, "below": 65536}, "must be in [1, 65,536)"),
    ({"above": 0, "at_most": 1}, "must be in (0, 1]"),
    ({"at_least": 0, "at_most": 1e-3}, "must be in [0, 0.001]"),
    ({"above": 1, "at_most": 2.0**64}, "must be in (1, 1.84467e+19]"),
    ({"at_least": 1}, "must be at least 1"),
    ({"above": 0}, "must be above 0"),
    ({"below": 5}, "must be below 5"),
    ({"at_most": 5}, "must be at most 5"),
])
def test_bounds_text_names_the_range_with_open_and_closed_ends(bounds: dict, text: str) -> None:
    assert bounds_text(bounds) == text


@dataclasses.dataclass(frozen=True)
class _Section:
    rate: float = documented(1.0, "a rate", above=0)
    tries: int = documented(3, "tries", at_least=1, at_most=10)


def test_a_value_past_2_53_with_no_upper_bound_loads_and_one_outside_the_range_is_refused_with_it() -> None:
    assert build(_Section, {"rate": "1e16"}, "s", {}, "f.yaml").rate == 1e16
    with pytest.raises(ConfigError) as refused:
        build(_Section, {"tries": 1000}, "s", {}, "f.yaml")
    assert str(refused.value) == "f.yaml: s.tries: got 1000; must be in [1, 10]"
    with pytest.raises(ConfigError, match=r"s.rate: got -1; must be above 0"):
        build(_Section, {"rate": -1}, "s", {}, "f.yaml")


@dataclasses.dataclass(frozen=True)
class _Mapped:
    margins: dict[str, float] = dataclasses.field(default_factory=dict, metadata={"bounds": {"above": 0}})
    nested: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)


def test_a_mapping_field_coerces_each_value_and_bounds_each_value() -> None:
    built = build(_Mapped, {"margins": {"a/acc": "0.5", 3: 1}, "nested": {"m": {"x/y": 2}}}, "s", {}, "f.yaml")
    assert built.margins == {"a/acc": 0.5, "3": 1.0} and built.nested == {"m": {"x/y": 2.0}}
    with pytest.raises(ConfigError) as refused:
        build(_Mapped, {"margins": {"a/acc": -1}}, "s", {}, "f.yaml")
    assert refused.value.field == "s.margins.a/acc"
    for bad in ({"margins": ["a"]}, {"margins": {"a": "x"}}, {"nested": {"m": 1}}, {"margins": {"a\nb": 1}}):
        with pytest.raises(ConfigError):
            build(_Mapped, bad, "s", {}, "f.yaml")
