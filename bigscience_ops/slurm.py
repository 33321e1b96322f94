"""All Slurm knowledge: argv builders, parsers of real tool output, and the one place that runs Slurm commands."""

from __future__ import annotations

import re

from bigscience_ops.errors import BsopsError

_TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (as sbatch --time)"


class SlurmError(BsopsError):
    """A Slurm command failed or answered something unparseable."""


def parse_time_limit(text: str) -> int:
    """Minutes in a Slurm time limit, rounded up as Slurm does; raises ValueError naming the formats."""
    value = str(text).strip()
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if not match:
        raise ValueError(f"time limit {text!r} is not one of {_TIME_FORMATS}")
    days, a, b, c = match.groups()
    if days is not None:
        hours, minutes, seconds = int(a), int(b or 0), int(c or 0)
    elif c is not None:
        hours, minutes, seconds = int(a), int(b), int(c)
    elif b is not None:
        hours, minutes, seconds = 0, int(a), int(b)
    else:
        hours, minutes, seconds = 0, int(a), 0
    if (days is not None or c is not None) and (minutes > 59 or seconds > 59):
        raise ValueError(f"time limit {text!r}: minutes and seconds must be below 60")
    total = (int(days or 0) * 24 + hours) * 60 + minutes + (1 if seconds else 0)
    if total <= 0:
        raise ValueError(f"time limit {text!r} must be at least one minute")
    return total
