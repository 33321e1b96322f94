"""The trainer's own error."""

from bigscience_ops.errors import BsopsError


class TrainerError(BsopsError):
    """The experiment cannot be trained as configured: names the value and what is allowed."""
