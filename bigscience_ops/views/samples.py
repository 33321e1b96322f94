"""`bsops samples`: the exact samples the trainer consumed at an iteration, with their documents and text.

When the loss spikes, the question is which text was in that iteration. The answer is computed with
the trainer's own functions (trainer/sampling.py), so it is what the trainer read:

- the step: iteration N starts after `RunSchedule.batch.consumed_after(N - 1)` samples (skipped
  iterations consume theirs too) and trains the next `batch_size_at(that)` of them, through the
  rampup; curriculum learning trains the first `seqlen_at(N)` + 1 tokens of each;
- the layout: micro-batch k of data-parallel rank r reads `micro_batch_indices(...)`, with the DP and
  micro-batch size of the task that trained N, read from its start line in main_log.txt
  (`TaskLayout`); without a log, the node phase of N gives DP (processes / (TP x PP));
- the data: the datasets `build_datasets` builds with the trainer's `dataset_sizes`; a blend maps a
  sample to its dataset (BlendedDataset.source), and the GPT dataset's shuffle, sample and document
  indices to (document, offset, length) pieces (GPTDataset.pieces), decoded with the experiment's tokenizer.
  The index files the trainer wrote are read where it wrote them; nothing is ever written into the data
  folder: what is missing is built in the user's cache (gpt_dataset.ReadOnlyIndices, user_index_cache);
- the record: an iteration the run's live branch has trained (views/branch.py: its log and checkpoints, after
  its rollbacks) is a record; a later one is a prediction from the plan, said as such, and a skipped one
  not reached yet "will be skipped" (at the relaunch, right after a rollback).

numpy only (no torch): it runs on a login node while the training holds the GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.run import ledger
from bigscience_ops.run import rollbacks
from bigscience_ops.run import log as runlog
from bigscience_ops.checkpoints import layout as checkpoint_layout
from bigscience_ops.errors import BsopsError
from bigscience_ops.schedule.run import RunSchedule, run_schedule
from bigscience_ops.schedule.batch_lr import in_skip_range, parse_skip_ranges
from bigscience_ops.schema import Experiment
from bigscience_ops.trainer.sampling import (
    LayoutLineError, TaskLayout, build_datasets, dataset_sizes, micro_batch_positions, parse_layout_line, seqlen_at,
)
from bigscience_ops.views import branch


class SamplesError(BsopsError):
    """The samples of an iteration cannot be shown: names the iteration, the value and what is allowed."""


@dataclass(frozen=True)
class Piece:
    """Tokens [offset, offset + length) of one document of the indexed dataset."""

    document: int
    offset: int
    length: int
    text: str | None = None


@dataclass(frozen=True)
class Sample:
    position: int  # the global sample index: samples consumed before it
    index: int  # its index in the training dataset (position modulo the dataset's length)
    source: int  # which data.blend entry it comes from
    prefix: str  # that entry's indexed dataset
    source_sample: int  # its sample in that entry's training split
    pieces: tuple[Piece, ...]  # the documents of the tokens trained, in order
    tokens: tuple[int, ...]  # the tokens trained: inputs are tokens[:-1], labels tokens[1:]

    @property
    def text(self) -> str | None:
        texts = [p.text for p in self.pieces]
        return None if any(t is None for t in texts) else "".join(texts)


@dataclass(frozen=True)
class MicroBatch:
    dp_rank: int
    micro_batch: int
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class Layout:
    data: int  # the data-parallel size of the task that trained the iteration
    micro_batch_size: int
    source: str  # where these two came from


@dataclass(frozen=True)
class IterationSamples:
    experiment: str
    iteration: int
    train_iters: int
    skipped: bool  # in train.skip_iterations: its data was consumed, no update was made
    consumed_before: int  # its samples are [consumed_before, consumed_before + global_batch_size)
    global_batch_size: int
    seqlen: int  # tokens per sample fed to the model (the curriculum's length, else model.seq_length)
    dataset_samples: int  # the training dataset's length: positions wrap around it
    layout: Layout
    micro_batches: tuple[MicroBatch, ...]
    skipped_lines: tuple[str, ...] = ()
    """One note per task start line of the log skipped because no task can have its numbers (micro batch size 0)."""
    trained_through: int | None = None
    """The last iteration the run's live branch trained (its log and checkpoints); None: not known, a record."""
    pending: rollbacks.Rollback | None = None
    """The run's last rollback while no task has run since it."""

    @property
    def trained(self) -> bool:
        """The run trained this iteration: the samples are a record, not a prediction from the plan."""
        return self.trained_through is None or self.iteration <= self.trained_through

    @property
    def status(self) -> str:
        """trained, skipped (its data consumed, no update), predicted, or will be skipped."""
        if self.trained:
            return "skipped" if self.skipped else "trained"
        return "will be skipped" if self.skipped else "predicted"

    def status_line(self) -> str | None:
        """The status in words, None for a trained iteration."""
        r = self.pending
        if self.status == "skipped":
            return "skipped (train.skip_iterations): its data was consumed, no update was made"
        if self.trained:
            return None
        line = (f"not trained yet: predicted from the plan (the run's log and checkpoints reach iteration "
                f"{self.trained_through})")
        if self.skipped and r is not None and r.skip and in_skip_range(self.iteration, parse_skip_ranges([r.skip])):
            return (f"{line}; will be skipped at the relaunch: its data consumed, no update (rollback to iteration "
                    f"{r.to_step}, skip {r.skip})")
        if self.skipped:
            return f"{line}; will be skipped when the run reaches it: its data consumed, no update"
        return line


START_MARK = branch.START_MARK


def read_layouts(lines: Iterable[str]) -> tuple[list[TaskLayout], list[str]]:
    """The start line of every task in a log, oldest first, and one note per start line skipped because no task
    can have its numbers (a micro batch size of 0: a torn or hostile line)."""
    layouts, skipped = [], []
    for line in lines:
        try:
            layout = parse_layout_line(line)
        except LayoutLineError as exc:
            shown = line if len(line) <= 200 else f"{line[:200]}... ({len(line)} characters)"
            skipped.append(f"{exc}: {shown!r}")
            continue
        if layout is not None:
            layouts.append(layout)
    return layouts, skipped


def task_layouts(lines: Iterable[str]) -> list[TaskLayout]:
    """The start line of every task in a log, oldest first (start lines no task can have are skipped)."""
    return read_layouts(lines)[0]


@dataclass(frozen=True)
class _RunLog:
    tasks: list[TaskLayout]
    skipped: list[str]
    log: str | None
    live: branch.LiveBranch


def _read_log(exp: Experiment, log_lines: Iterable[str] | None) -> _RunLog:
    """The task start lines of the run's log (or of `log_lines`) and its live branch, in one streamed pass: linear
    in a months-long log, one line of bounded length at a time (runlog)."""
    out = Path(exp.paths.output)
    try:
        latest = checkpoint_layout.resume_step(Path(exp.paths.checkpoints))
    except (BsopsError, OSError):  # a `latest` that cannot be read: the log alone tells what was trained
        latest = None
    begins = [r.time for r in ledger.read_checked(out / ledger.LEDGER_NAME).records if r.event == "begin"]
    done = rollbacks.read_checked(out).records
    starts: list[str] = []

    def spy(lines: Iterable[str]) -> Iterable[str]:
        for line in lines:
            if START_MARK in line:
                starts.append(line)
            yield line

    path, mtime = None, None
    if log_lines is None:
        try:
            path = runlog.find_log(exp)
            mtime = path.stat().st_mtime
        except runlog.LogMissing:
            pass
        except (runlog.LogError, OSError) as exc:  # there, but not a file to read (a FIFO, a folder)
            raise SamplesError(str(exc)) from None
    try:
        lines = log_lines if log_lines is not None else runlog.lines(path, containing=branch.LOG_FILTER) if path else []
        live = branch.live_branch(spy(lines), latest=latest, rollbacks=done, begins=begins, log_mtime=mtime)
    except runlog.LogError as exc:
        raise SamplesError(str(exc)) from None
    tasks, skipped = read_layouts(starts)
    return _RunLog(tasks, skipped, "the log given" if log_lines is not None else str(path) if path else None, live)


def layout_at(exp: Experiment, schedule: RunSchedule, iteration: int, tasks: list[TaskLayout],
              log: str | None = None, trained: bool = True) -> Layout:
    """DP and micro-batch size of the task that trained `iteration`: the last task in the log that started
    before it (a relaunch after a rollback trains it again), else the node phase's processes / (TP x PP).
    An iteration not `trained` yet is predicted: with the last task's layout, named as a prediction."""
    trained_by = [t for t in tasks if t.start < iteration]
    if trained_by:
        task = trained_by[-1]
        if task.synthetic:
            what = (f"was trained on generated data (--synthetic-data, the task that started at iteration "
                    f"{task.start} in {log})" if trained else f"is not trained yet, and the last task (started at "
                    f"iteration {task.start} in {log}) trains on generated data (--synthetic-data)")
            raise SamplesError(f"iteration {iteration} of {exp.name} {what}: it has no corpus, documents or text "
                               "to show")
        if not trained:
            return Layout(task.data, task.micro_batch_size,
                          f"predicted from the plan (not trained yet): the layout of the last task in {log} (started "
                          f"at iteration {task.start}), which has not trained it")
        return Layout(task.data, task.micro_batch_size,
                      f"{log}: the task that started at iteration {task.start}")
    phase = schedule.phase_of_iteration(iteration - 1)
    p = exp.parallel
    processes = phase.nodes * exp.slurm.gpus_per_node
    why = "no task in main_log.txt trained it yet" if log is not None else "no main_log.txt"
    why = f"predicted from the plan (not trained yet; {why})" if not trained else why
    return Layout(processes // (p.tensor * p.pipeline), exp.batch.micro_batch_size,
                  f"{why}: {processes} processes of {phase.describe()} / (TP {p.tensor} x PP {p.pipeline}), "
                  "batch.micro_batch_size")


def _decoder(exp: Experiment):
    """ids -> text with the experiment's tokenizer (the `tokenizers` reference backend)."""
    from bigscience_ops.data.tokenizer import TokenizerError, TokenizerSpec, build_tokenizer

    t = exp.data.tokenizer
    try:
        spec = TokenizerSpec(t.kind, t.vocab_file, t.merges_file, t.json_file, backend="tokenizers")
        return build_tokenizer(spec).decode  # the tokenizers backend: no probe
    except TokenizerError as exc:
        raise SamplesError(f"data.tokenizer: {exc}; use --no-text to show token ids only") from None


def _trained_pieces(pieces: list[tuple[int, int, int]], tokens: int) -> list[tuple[int, int, int]]:
    """The first `tokens` tokens of `pieces` (curriculum learning trains a prefix of each sample)."""
    out, left = [], tokens
    for document, offset, length in pieces:
        if left <= 0:
            break
        out.append((document, offset, min(length, left)))
        left -= length
    return out


def _sample(exp: Experiment, train, position: int, seqlen: int, decode) -> Sample:
    from bigscience_ops.data.gpt_dataset import BlendedDataset

    index = position % len(train)  # as micro_batch_indices wraps it for the trainer's sampler
    source, sample = train.source(index) if isinstance(train, BlendedDataset) else (0, index)
    dataset = train.datasets[source] if isinstance(train, BlendedDataset) else train
    prefix = dataset.indexed.prefix
    entry = next((i for i, src in enumerate(exp.data.blend) if src.prefix == prefix), source)
    tokens = train[index][:seqlen + 1]
    pieces, at = [], 0
    for document, offset, length in _trained_pieces(dataset.pieces(sample), seqlen + 1):
        ids = [int(t) for t in tokens[at:at + length]]
        pieces.append(Piece(document, offset, length, decode(ids) if decode else None))
        at += length
    return Sample(position, index, entry, prefix, sample, tuple(pieces), tuple(int(t) for t in tokens))


def iteration_samples(exp: Experiment, iteration: int, *, dp: int | None = None, micro_batch_size: int | None = None,
                      ranks: Iterable[int] | None = None, micro_batches: Iterable[int] | None = None,
                      text: bool = True, log_lines: Iterable[str] | None = None) -> IterationSamples:
    """The samples training iteration `iteration` of `exp` consumed, per data-parallel rank and micro-batch.

    `dp` and `micro_batch_size` override the layout the log gives; `ranks` and `micro_batches` keep only
    those; `log_lines` replace main_log.txt (tests); `text=False` leaves the tokenizer out.
    """
    schedule = run_schedule(exp)
    if not 1 <= iteration <= schedule.train_iters:
        raise SamplesError(f"--iteration: got {iteration}; {exp.name} trains iterations 1 to {schedule.train_iters}")
    run = _read_log(exp, log_lines)
    tasks, skipped, log, live = run.tasks, run.skipped, run.log, run.live
    layout = layout_at(exp, schedule, iteration, tasks, log, trained=iteration <= live.trained)
    if dp is not None or micro_batch_size is not None:
        layout = Layout(dp or layout.data, micro_batch_size or layout.micro_batch_size,
                        f"given (--dp/--micro-batch-size); the run's: {layout.source}")
    consumed = schedule.batch.consumed_after(iteration - 1)
    gbs = schedule.batch.batch_size_at(consumed)
    per_step = layout.micro_batch_size * layout.data
    if layout.data < 1 or gbs % per_step:
        raise SamplesError(f"iteration {iteration}: global batch size {gbs} is not a multiple of micro batch size "
                           f"{layout.micro_batch_size} x DP {layout.data} ({layout.source}); the trainer refuses "
                           "that layout, so it did not train this iteration with it (give --dp and --micro-batch-size)")
    count = gbs // per_step
    ranks = sorted(set(range(layout.data) if ranks is None else ranks))
    chosen = sorted(set(range(count) if micro_batches is None else micro_batches))
    for name, values, limit in (("--rank", ranks, layout.data), ("--micro-batch-index", chosen, count)):
        if any(not 0 <= v < limit for v in values):
            raise SamplesError(f"{name}: got {', '.join(map(str, values))}; iteration {iteration} has 0 to {limit - 1} "
                               f"(DP {layout.data}, {count} micro-batches of {layout.micro_batch_size} per rank)")
    from bigscience_ops.data.gpt_dataset import ReadOnlyIndices, user_index_cache

    indices = ReadOnlyIndices(exp.data.cache_dir, user_index_cache())  # nothing written beside the data
    train, _, _ = build_datasets(exp, dataset_sizes(exp, schedule), synthetic=False, indices=indices)
    if train is None:
        raise SamplesError(f"data.split: got {exp.data.split!r}; the training split is empty")
    seqlen = seqlen_at(schedule, iteration)
    decode = _decoder(exp) if text else None
    batches = tuple(
        MicroBatch(r, k, tuple(_sample(exp, train, position, seqlen, decode) for position in
                               micro_batch_positions(consumed, k, layout.micro_batch_size, r, layout.data)))
        for k in chosen for r in ranks)
    return IterationSamples(exp.name, iteration, schedule.train_iters, in_skip_range(iteration, schedule.skip_ranges),
                            consumed, gbs, seqlen, len(train), layout, batches,
                            tuple(f"{log}: skipped {note}" for note in skipped), live.trained, live.pending)


def samples_data(result: IterationSamples) -> dict:
    """The result as plain data (`bsops samples --json`)."""
    return {
        "experiment": result.experiment, "iteration": result.iteration, "train_iters": result.train_iters,
        "skipped": result.skipped, "trained": result.trained, "status": result.status,
        "status_line": result.status_line(), "trained_through": result.trained_through,
        "consumed_before": result.consumed_before,
        "global_batch_size": result.global_batch_size, "seqlen": result.seqlen,
        "dataset_samples": result.dataset_samples,
        "layout": {"data": result.layout.data, "micro_batch_size": result.layout.micro_batch_size,
                   "source": result.layout.source},
        "skipped_log_lines": list(result.skipped_lines),
        "micro_batches": [
            {"dp_rank": b.dp_rank, "micro_batch": b.micro_batch, "samples": [
                {"position": s.position, "index": s.index, "source": s.source, "prefix": s.prefix,
                 "source_sample": s.source_sample, "tokens": list(s.tokens), "text": s.text,
                 "pieces": [{"document": p.document, "offset": p.offset, "length": p.length, "text": p.text}
                            for p in s.pieces]}
                for s in b.samples]}
            for b in result.micro_batches],
    }


def _quoted(text: str, limit: int) -> str:
    """The text on one line, control characters escaped; cut at `limit` characters (0: whole)."""
    import json

    shown = text if not limit or len(text) <= limit else text[:limit]
    more = f" ... ({len(text) - limit} more characters)" if limit and len(text) > limit else ""
    return json.dumps(shown, ensure_ascii=False) + more


def samples_text(result: IterationSamples, limit: int = 0) -> list[str]:
    """The result as lines for a person: the step, then each micro-batch's samples and their documents."""
    r = result
    end = r.consumed_before + r.global_batch_size - 1
    lines = [f"{r.experiment} iteration {r.iteration}/{r.train_iters}: global batch size {r.global_batch_size}, "
             f"samples {r.consumed_before} to {end} (of a training dataset of {r.dataset_samples}), "
             f"{r.seqlen} tokens each (+1 for the last label)",
             f"layout: DP {r.layout.data}, micro batch size {r.layout.micro_batch_size} "
             f"({'' if r.layout.source.startswith('predicted') else 'from '}{r.layout.source})"]
    lines += [f"warning: {note}" for note in r.skipped_lines]
    status = r.status_line()
    if status is not None:
        lines.append(status)
    for b in r.micro_batches:
        lines.append(f"dp rank {b.dp_rank}, micro-batch {b.micro_batch}:")
        for s in b.samples:
            where = ", ".join(f"document {p.document} tokens {p.offset}-{p.offset + p.length - 1}" for p in s.pieces)
            lines.append(f"  sample {s.position} (dataset sample {s.index}; blend entry {s.source} {s.prefix}, "
                         f"its sample {s.source_sample}): {where}")
            if s.text is None:
                lines.append(f"    tokens: {' '.join(map(str, s.tokens))}")
            for p in s.pieces if s.text is not None else ():
                lines.append(f"    document {p.document}: {_quoted(p.text, limit)}")
    return lines
