"""Hang detectors for tests: a deadline far from the time a call takes, which only a hang reaches.

No test asserts how fast something is (that is a benchmark's job, benchmarks/): a test whose code under test could
wait for ever (a server that drips for ever, a lock never released) runs it through `ends_within`, with a deadline
of tens of seconds against the second or so the call takes, so a busy machine never fails it and a hang fails the
test instead of stopping the suite.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

HANG_S = 60.0
"""The default deadline: far past what any call run through ends_within takes here (a few seconds at most)."""


def ends_within(call: Callable[[], T], why: str, seconds: float = HANG_S) -> T:
    """Run `call` in a thread of its own and return what it returns, or raise what it raises; fail the test when it
    has not ended after `seconds` (`why`: what would keep it going for ever). The thread is left to end when the
    test's fixtures close what it waits on."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 (handed to the test's thread as it is)
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"ends_within: {why}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running after {seconds:g} s, far past the time it takes: a hang ({why})", pytrace=False)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
