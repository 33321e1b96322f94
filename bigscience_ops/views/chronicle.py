"""`bsops chronicle`: the run's timeline as Markdown. It is built in ops/chronicle.py, below the views,
because hub-sync (an hourly job) pushes it with the logs; the command and `bsops plot` read it from there."""

from __future__ import annotations

from bigscience_ops.ops.chronicle import WATCHDOG_LOG, Event, events, markdown

__all__ = ["WATCHDOG_LOG", "Event", "events", "markdown"]
