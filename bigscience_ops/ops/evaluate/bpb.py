"""Bits per byte of a held-out jsonl source: every document scored whole, total bits over total UTF-8 bytes.

The number is lm-eval's `bits_per_byte` of a `loglikelihood_rolling` task over the same documents: each
document in the windows HFLM makes (`windows`, equal to harness.rolling_windows: every token predicted
once, the first window conditioned on the end-of-document token, the later ones on up to max_length
tokens before them), its log-likelihood summed, and -sum(log-likelihood) / sum(bytes) / ln 2 over the
documents.

The source is user data read as untrusted input, streamed: one line at a time, a line over MAX_LINE
bytes skipped unread (its rest read in 1 MiB pieces and dropped), the document's tokens as one numpy
array and its windows made lazily, at most a chunk of windows held for the Scorer, so memory does not
grow with the file (a 100 MB source holds about what its longest document needs). The first
docs_per_source documents with a non-empty text under text_key are scored; a line that is not one
(torn, not UTF-8, not a JSON object, no string under the key, an empty text, a lone surrogate) is
counted, the first SHOWN_PROBLEMS named by file:line, and skipped. More of them than `max_bad`
(eval.max_bad_lines; 0 by default) fail the source (BadLines, counting the bad lines among the first
docs_per_source documents' lines, no more scored once it has failed): a file damaged in part is never scored as
if it were whole, and never in silence (driver.py leaves it out of the result, named, and the evaluation fails).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from bigscience_ops.ops.evaluate import EvalError
from bigscience_ops.ops.evaluate.harness import CHUNK_BATCHES, PROGRESS_SECONDS
from bigscience_ops.untrusted import Problem

if TYPE_CHECKING:
    import numpy as np

    from bigscience_ops.ops.evaluate.harness import BsopsLM

MAX_LINE = 16 << 20
"""The longest source line read (a document with its JSON around it): longer ones are skipped unread."""
SHOWN_PROBLEMS = 5
"""Skipped lines named in a result; the others are only counted."""


@dataclass(frozen=True)
class SourceBpb:
    """What scoring one source gave."""

    bits_per_byte: float
    bytes: int  # UTF-8 bytes of the scored documents' texts
    tokens: int  # tokens predicted (each document's tokens, all of them)
    documents: int
    nats: float  # -sum of the documents' log-likelihoods
    skipped: int  # lines that were not a scorable document
    path: str
    problems: list[str] = field(default_factory=list)  # the first SHOWN_PROBLEMS skipped lines, file:line: what

    def to_dict(self) -> dict:
        return {"bits_per_byte": self.bits_per_byte, "bytes": self.bytes, "tokens": self.tokens,
                "documents": self.documents, "nats": self.nats, "skipped": self.skipped, "path": self.path,
                "problems": list(self.problems)}


def windows(tokens: np.ndarray, prefix: int, max_length: int) -> Iterator[tuple[list[int], list[int]]]:
    """harness.rolling_windows(tokens, prefix, max_length) made one window at a time from an array: lm-eval's
    get_rolling_token_windows with context_len 1, each made disjoint (make_disjoint_window)."""
    n = len(tokens)
    if n == 0:
        return
    first = min(max_length, n)
    yield [prefix], tokens[:first].tolist()
    predicted = first
    while predicted < n:
        count = min(n - predicted, max_length)
        end = predicted + count
        context = tokens[end - max_length - 1:end - 1]  # max_length tokens, the last count - 1 predicted here
        yield context[:len(context) - (count - 1)].tolist(), tokens[end - count:end].tolist()
        predicted = end


def open_source(path: str | os.PathLike[str]) -> IO[bytes]:
    """The source opened for reading: a plain file (a link to one is fine: sources are the user's data), never
    a FIFO or a folder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise EvalError(f"eval source {path} cannot be opened ({exc.strerror or exc}); a source is a jsonl file, "
                        "one JSON object per line") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise EvalError(f"eval source {path} is not a plain file; a source is a jsonl file, one JSON object per line")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


class Skipped:
    """Lines skipped: how many, and the first SHOWN_PROBLEMS of them (never more held, however many there are)."""

    def __init__(self) -> None:
        self.count = 0
        self.first: list[Problem] = []

    def append(self, problem: Problem) -> None:
        self.count += 1
        if len(self.first) < SHOWN_PROBLEMS:
            self.first.append(problem)


def documents(handle: IO[bytes], name: str, text_key: str, problems: Skipped) -> Iterator[str]:
    """The non-empty texts under text_key, one per good line, in file order; each bad line counted in
    `problems` and skipped."""
    number = 0
    while True:
        raw = handle.readline(MAX_LINE + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE:
            size = len(raw)
            while not raw.endswith(b"\n"):
                raw = handle.readline(1 << 20)
                if not raw:
                    break
                size += len(raw)
            problems.append(Problem(name, number, f"a line of {size} bytes; lines over {MAX_LINE} bytes are not read"))
            continue
        if not raw.strip():
            continue
        text, why = _text(raw, text_key)
        if text is None:
            problems.append(Problem(name, number, why))  # no excerpt: a result file may be pushed to the Hub
            continue
        yield text


def _text(raw: bytes, text_key: str) -> tuple[str | None, str]:
    """The line's text, or None and why it has none."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None, ("cut short: no end of line and not a whole JSON object" if not raw.endswith(b"\n")
                      else "not a JSON object")
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not an object"
    text = value.get(text_key)
    if not isinstance(text, str):
        return None, (f"no {text_key!r} key" if text_key not in value
                      else f"{text_key!r} holds a JSON {type(text).__name__}, not a string")
    if not text:
        return None, f"an empty {text_key!r}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None, f"{text_key!r} holds a lone surrogate (\\ud800-\\udfff escape), not text"
    return text, ""


@contextlib.contextmanager
def _read_errors(name: str) -> Iterator[None]:
    """A source that fails while it is read (EIO, a file removed from a network filesystem) as an EvalError."""
    try:
        yield
    except OSError as exc:
        raise EvalError(f"eval source {name} cannot be read ({exc.strerror or exc})") from None


class BadLines(EvalError):
    """A source holds more lines that are not a document than eval.max_bad_lines allows."""


def _too_many(name: str, problems: Skipped, max_bad: int) -> BadLines:
    shown = "; ".join(str(p) for p in problems.first)
    return BadLines(f"eval source {name}: {problems.count} line(s) that are not a document ({shown}"
                    f"{'; ...' if problems.count > len(problems.first) else ''}); allowed: at most {max_bad} "
                    "(eval.max_bad_lines): repair or remove them, or raise the limit")


def bits_per_byte(path: str | os.PathLike[str], lm: BsopsLM, text_key: str = "text", docs: int = 3000,
                  log: Callable[[str], None] = lambda line: None, max_bad: int | None = None) -> SourceBpb:
    """Score the first `docs` documents of the jsonl source at `path` with `lm`'s Scorer (see the module docstring).
    BadLines once more than `max_bad` lines were not a document (None: no limit)."""
    tokenizer, prefix, max_length = lm.bsops_tokenizer, lm.prefix_token_id, lm.max_length
    name = str(path)
    problems = Skipped()
    count = n_bytes = n_tokens = 0
    loglikelihood = 0.0
    pending: list[tuple[list[int], list[int]]] = []
    started = last = time.monotonic()

    def flush() -> float:
        scored = lm.score(pending, "bits_per_byte", progress=False)
        pending.clear()
        return sum(logprob for logprob, _ in scored)

    with open_source(path) as handle, _read_errors(name):
        for text in documents(handle, name, text_key, problems):
            if max_bad is not None and problems.count > max_bad:  # failed: the rest only counted, never scored
                count += 1
                if count >= docs:
                    break
                continue
            ids = tokenizer.encode_array(text)
            for window in windows(ids, prefix, max_length):
                pending.append(window)
                if len(pending) >= lm.batch_size * CHUNK_BATCHES:
                    loglikelihood += flush()
            count += 1
            n_bytes += len(text.encode("utf-8"))
            n_tokens += len(ids)
            now = time.monotonic()
            if now - last >= PROGRESS_SECONDS and count < docs:
                last = now
                log(f"bits per byte of {name}: {count}/{docs} documents, {n_tokens} tokens, {now - started:.0f} s")
            if count >= docs:
                break
    if max_bad is not None and problems.count > max_bad:
        raise _too_many(name, problems, max_bad)
    if pending:
        loglikelihood += flush()
    if count == 0:
        raise EvalError(f"eval source {name} has no document with a non-empty text under {text_key!r} "
                        f"({problems.count} line(s) skipped{': ' + str(problems.first[0]) if problems.first else ''})")
    nats = -loglikelihood
    result = SourceBpb(bits_per_byte=nats / n_bytes / math.log(2), bytes=n_bytes, tokens=n_tokens, documents=count,
                       nats=nats, skipped=problems.count, path=name,
                       problems=[str(p) for p in problems.first])
    log(f"bits per byte of {name}: {result.bits_per_byte:.4f} over {count} documents ({n_tokens} tokens, "
        f"{n_bytes} bytes; {problems.count} line(s) skipped) in {time.monotonic() - started:.1f} s")
    return result
