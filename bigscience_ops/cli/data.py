"""Data commands: preprocess, merge-datasets, prepare-corpus, data verify (merge-data: merge-datasets' former name)."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bigscience_ops.cli.base import EXIT_PROBLEMS, TEXT, FiniteFloat, dry_run_option, main, trainings_option

if TYPE_CHECKING:
    from bigscience_ops.data.preprocess import Limits
    from bigscience_ops.data.tokenizer import TokenizerSpec

# Options that take several values, Megatron style (`--json-keys text title`).
_GREEDY = ("--json-keys", "--datasets")
# Megatron options accepted for compatibility that change nothing here, and why.
_NO_MEANING = {
    "keep_newlines": "--keep-newlines (only used with --split-sentences, which is not done here)",
    "dataset_impl": "--dataset-impl (mmap, the only format written)",
    "make_vocab_size_divisible_by": "--make-vocab-size-divisible-by (vocab padding is the trainer's; "
                                    "the token dtype follows the tokenizer's own size, as Megatron's)",
    "pad_vocab_size_to": "--pad-vocab-size-to (vocab padding is the trainer's)",
    "datasets": "--datasets (unused by Megatron's preprocess_data.py too; use bsops merge-datasets)",
}
TOKENIZER_TYPES = ("GPT2BPETokenizer", "PretrainedFromHF")
_UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}
MAX_DOCUMENT_LIMIT = 1 << 40  # an option value above this is a typo


class _Bytes(click.ParamType):
    """A byte count: 65536, 64KiB, 64MiB, 1GiB (or KB, MB, GB: powers of 1000)."""

    name = "bytes"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            number = value
        else:
            text = str(value).strip()
            digits = text.rstrip("KMGIBkmgib ")
            unit = text[len(digits):].strip().upper()
            if not digits.isdigit() or unit not in _UNITS:
                self.fail(f"got {value!r}; allowed: a whole number of bytes, optionally with KiB, MiB or GiB "
                          "(64MiB)", param, ctx)
            number = int(digits) * _UNITS[unit]
        if not 1 <= number <= MAX_DOCUMENT_LIMIT:
            self.fail(f"got {value!r}; allowed: 1 byte to 1 TiB", param, ctx)
        return number


class _MegatronCommand(click.Command):
    """Accepts `--json-keys a b` (argparse nargs='+') by repeating the option for each value, and hands the command
    the options that describe one thing as one value (`_groups`: the tokenizer, the limits)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        out: list[str] = []
        greedy = None
        for arg in args:
            if arg.startswith("-") and arg != "-":
                greedy = arg.split("=", 1)[0] if arg.split("=", 1)[0] in _GREEDY else None
                out.append(arg)
            elif greedy is not None and out[-1] != greedy:
                out += [greedy, arg]
            else:
                out.append(arg)
        return super().parse_args(ctx, out)

    def invoke(self, ctx: click.Context) -> object:
        # numpy's OpenBLAS starts (and spins) a thread per core on import; preprocessing does no linear algebra,
        # and those threads cost ~0.06 CPU s of every run's start-up and take cores from the workers. Set before
        # a group's value imports the data package.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        for name, group in _groups().items():
            ctx.params[name] = group(**{f.name: ctx.params.pop(f.name) for f in dataclasses.fields(group)})
        return super().invoke(ctx)


_IGNORED = "bsops.preprocess.ignored"  # ctx.meta: the names of the Megatron options given that change nothing


def _no_meaning(ctx: click.Context, param: click.Parameter, value: object) -> None:
    """Notes a Megatron option that changes nothing here (_NO_MEANING), when given; the command warns once."""
    if value:
        ctx.meta.setdefault(_IGNORED, set()).add(param.name)


def _no_split_sentences(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """Refuses Megatron's --split-sentences, which would change the documents (it cannot be ignored)."""
    if value:
        raise click.UsageError("--split-sentences (Megatron's NLTK sentence splitting, for BERT) is not "
                               "supported; GPT pretraining data is one document per item")


@dataclass(frozen=True)
class TokenizerChoice:
    """The one tokenizer the tokenizer options describe: bsops' --tokenizer, or Megatron's --tokenizer-type with
    --vocab-file/--merge-file or --tokenizer-name-or-path; the backend that encodes with it, and what a literal
    <|endoftext|> in a document becomes. Field names are the options' (click passes them by name)."""

    tokenizer: str | None = None
    tokenizer_type: str | None = None
    tokenizer_name_or_path: str | None = None
    vocab_file: str | None = None
    merges_file: str | None = None
    tokenizer_backend: str = "auto"
    special_text: str = "plain"

    def source(self) -> str | None:
        """The --tokenizer value Megatron's --tokenizer-type / --tokenizer-name-or-path stand for; a UsageError
        when the options disagree or miss a file the type needs."""
        tokenizer_type, tokenizer, name_or_path = self.tokenizer_type, self.tokenizer, self.tokenizer_name_or_path
        vocab_file, merges_file = self.vocab_file, self.merges_file
        if tokenizer_type == "PretrainedFromHF":
            if vocab_file or merges_file:
                raise click.UsageError("--tokenizer-type PretrainedFromHF reads --tokenizer-name-or-path; "
                                       "--vocab-file and --merge-file belong to GPT2BPETokenizer")
            if not (name_or_path or tokenizer):
                raise click.UsageError("--tokenizer-type PretrainedFromHF needs --tokenizer-name-or-path: a local "
                                       "tokenizer.json or a folder holding one (no download is done)")
        if tokenizer_type == "GPT2BPETokenizer" and name_or_path:
            raise click.UsageError("--tokenizer-name-or-path belongs to --tokenizer-type PretrainedFromHF; "
                                   "GPT2BPETokenizer reads --vocab-file and --merge-file")
        if tokenizer_type == "GPT2BPETokenizer" and not tokenizer and not (vocab_file and merges_file):
            given = "--vocab-file" if vocab_file else "--merge-file" if merges_file else "neither"
            raise click.UsageError(f"--tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file (GPT-2's "
                                   f"vocab.json and merges.txt); got {given}. Or --tokenizer gpt2 for the packaged "
                                   "GPT-2 files")
        if name_or_path and tokenizer and name_or_path != tokenizer:
            raise click.UsageError(f"--tokenizer {tokenizer!r} and --tokenizer-name-or-path {name_or_path!r} "
                                   "disagree; give one")
        return tokenizer or name_or_path

    def spec(self) -> TokenizerSpec:
        """The library's description of this tokenizer (its files found and checked; nothing is built yet)."""
        from bigscience_ops.data.tokenizer import resolve_tokenizer

        return resolve_tokenizer(self.source(), self.vocab_file, self.merges_file, self.tokenizer_backend,
                                 self.special_text)


def _groups() -> dict[str, type]:
    """The frozen values the command receives instead of their options: parameter name -> the dataclass, built once
    from the options named as its fields."""
    from bigscience_ops.data.preprocess import Limits  # --max-document-bytes, --cross-check (as check_fraction)

    return {"tokenizer": TokenizerChoice, "limits": Limits}


def _split_keys(values: tuple[str, ...]) -> tuple[str, ...]:
    """The keys of `--json-keys a,b c`: split on commas and spaces only (a newline or other separator inside a value
    stays in its key, which check_json_keys then refuses)."""
    keys = tuple(k for v in values for k in v.replace(",", " ").split(" ") if k)
    from bigscience_ops.data.preprocess import BadJsonKey, check_json_keys

    try:
        return check_json_keys(keys)
    except BadJsonKey as exc:
        raise click.UsageError(f"--json-keys: {exc}") from None


@main.command(cls=_MegatronCommand)
@click.option("--input", "inputs", multiple=True, required=True,
              help="A jsonl file (optionally .gz, .xz or .zst compressed), a folder (its *.jsonl, *.json, "
                   "*.jsonl.gz, *.jsonl.xz and *.jsonl.zst files, sorted by name) or a quoted glob "
                   "('shards/*.jsonl.gz', sorted); repeat for several. Several inputs are processed shard by "
                   "shard: rerun the same command after an interruption and finished shards are kept.")
@click.option("--output-per-input", is_flag=True,
              help="One output per input: DIR/en_00.jsonl.gz gives PREFIX_en_00_KEY_document.bin/.idx (the "
                   "file name without its .jsonl/.json and compression suffixes); merge them later with "
                   "bsops merge-datasets.")
@click.option("--json-keys", multiple=True, default=("text",), show_default=True,
              help="Keys whose strings are the documents, one output per key: `--json-keys text title` "
                   "(Megatron's spelling), repeated, or comma-separated.")
@click.option("--tokenizer", type=TEXT, default=None,
              help="A tokenizer.json, a folder with vocab.json + merges.txt, or 'gpt2' (packaged GPT-2 files).")
@click.option("--tokenizer-type", type=click.Choice(TOKENIZER_TYPES), default=None,
              help="Megatron's: GPT2BPETokenizer (with --vocab-file/--merge-file) or PretrainedFromHF "
                   "(with --tokenizer-name-or-path, a local path). Optional here.")
@click.option("--tokenizer-name-or-path", type=TEXT, default=None,
              help="Megatron's PretrainedFromHF source: a local tokenizer.json or a folder holding one.")
@click.option("--vocab-file", "--vocab", "vocab_file", type=TEXT, default=None,
              help="GPT-2 style vocab.json (with --merge-file).")
@click.option("--merge-file", "--merges-file", "merges_file", type=TEXT, default=None,
              help="GPT-2 style merges.txt (with --vocab-file).")
@click.option("--tokenizer-backend", type=click.Choice(["auto", "fastokens", "tiktoken", "tokenizers"]),
              default="auto", show_default=True,
              help="auto: the fastest that gives tokenizers' ids on a probe text: fastokens, then tiktoken, "
                   "then tokenizers itself.")
@click.option("--cross-check", "check_fraction", type=FiniteFloat(0.0, 1.0), default=0.01, show_default=True,
              help="Share of the text a fastokens run also encodes with the reference tokenizer (tiktoken, "
                   "or tokenizers) and compares; a difference stops the run. 0 turns it off.")
@click.option("--special-text", type=click.Choice(["plain", "token"]), default="plain", show_default=True,
              help="What a literal <|endoftext|> inside a document becomes. plain: ordinary text, as "
                   "Megatron's preprocess_data.py; token: the end-of-document id, as transformers' tokenizers.")
@click.option("--append-eod", is_flag=True, help="End each document with <|endoftext|>.")
@click.option("--output-prefix", required=True,
              help="Writes PREFIX_KEY_document.bin/.idx. With several inputs, each input's finished part waits "
                   "in PREFIX.shards/ (kept across an interruption) until they are merged into it.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes: whole shards each when the inputs balance over them, else chunks of each input. "
                   "Capped at this machine's cores and at the pieces of work the input gives (a note says so).")
@click.option("--strict", is_flag=True, help="Stop at the first unusable line instead of counting it.")
@click.option("--max-document-bytes", type=_Bytes(), default="64MiB", show_default=True,
              help="The longest line (one JSON document) taken, e.g. 64MiB. A longer one stops the run, naming "
                   "its file and line, as soon as it passes the limit: each worker holds one line whole, so this "
                   "bounds memory whatever a file's compression ratio.")
@click.option("--log-interval", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Documents between progress lines (when stderr is not a terminal).")
@click.option("--dataset-impl", type=click.Choice(["mmap"]), default=None, expose_value=False, callback=_no_meaning,
              help="Megatron's; mmap is the only format written (accepted, changes nothing).")
@click.option("--keep-newlines", is_flag=True, expose_value=False, callback=_no_meaning,
              help="Megatron's; accepted, changes nothing here.")
@click.option("--split-sentences", is_flag=True, hidden=True, expose_value=False, callback=_no_split_sentences)
@click.option("--make-vocab-size-divisible-by", type=int, default=None, hidden=True, expose_value=False,
              callback=_no_meaning)
@click.option("--pad-vocab-size-to", type=int, default=None, hidden=True, expose_value=False, callback=_no_meaning)
@click.option("--datasets", multiple=True, hidden=True, expose_value=False, callback=_no_meaning)
@dry_run_option
def preprocess(inputs: tuple[str, ...], output_per_input: bool, json_keys: tuple[str, ...], tokenizer: TokenizerChoice,
               limits: Limits, append_eod: bool, output_prefix: str, workers: int, strict: bool,
               log_interval: int, dry_run: bool) -> None:
    """Tokenize jsonl documents into Megatron's indexed format (.bin/.idx).

    Megatron's tools/preprocess_data.py command lines work as they are (--tokenizer-type,
    --vocab/--vocab-file, --merge-file, --json-keys text title, --dataset-impl mmap, --workers,
    --log-interval, --keep-newlines, --append-eod) and give the same .bin/.idx bytes. Options that
    change nothing here are named in a warning.
    """
    from bigscience_ops.data.inputs import decoder_notes, find_inputs
    from bigscience_ops.data.preprocess import Listener, PreprocessProgress, Workers, preprocess as run_preprocess

    keys = _split_keys(json_keys)  # a key names output files: checked before anything is read or written
    given = click.get_current_context().meta.get(_IGNORED, ())
    ignored = [why for name, why in _NO_MEANING.items() if name in given]
    if ignored:
        click.echo("warning: these options have no meaning here and are ignored: " + "; ".join(ignored),
                   err=True)
    spec = tokenizer.spec()
    on_terminal = sys.stderr.isatty()
    state = {"next_log": log_interval, "shown": 0}

    def report(p: PreprocessProgress) -> None:
        eta = "" if p.eta_s is None else f" ETA {_clock(p.eta_s)}"
        shards = f" shards {p.shards_done}/{p.shards}" if p.shards > 1 else ""
        if on_terminal:
            if p.fraction is not None:
                width = 30
                done = int(p.fraction * width)
                click.echo(f"\r[{'#' * done}{'.' * (width - done)}] {p.fraction:6.1%} {p.docs} docs "
                           f"{p.mb_per_s:.1f} MB/s {p.docs_per_s:.0f} docs/s{eta}{shards}\033[K", nl=False, err=True)
        elif p.docs >= state["next_log"]:
            click.echo(p.megatron_line(), err=True)
            if p.fraction is not None and (eta or shards):
                click.echo(f"  {p.fraction:.1%} of the input{eta}{shards}", err=True)
            state["next_log"] = (p.docs // log_interval + 1) * log_interval

    found = find_inputs(list(inputs))
    paths = found.files
    for note in decoder_notes(paths):
        click.echo(f"note: {note}", err=True)
    for left_out, kept in found.links:
        click.echo(f"note: {left_out} is the same file as {kept} (a link): read once", err=True)
    if found.side_files:
        shown = ", ".join(p.name for p in found.side_files[:5])
        more = f" and {len(found.side_files) - 5} more" if len(found.side_files) > 5 else ""
        click.echo(f"note: left out {len(found.side_files)} file(s) bsops wrote (records, problem lists, "
                   f"datasets): {shown}{more}", err=True)
    if dry_run:
        _preprocess_dry_run(paths, output_prefix, output_per_input, keys)
        return

    def capped(used: Workers) -> None:
        if used.capped:
            click.echo(f"note: {used.line()}", err=True)

    result = run_preprocess(paths, output_prefix, spec, keys, append_eod, workers, strict, output_per_input,
                            limits=limits, listener=Listener(progress=report, workers=capped))
    if on_terminal:
        click.echo("", err=True)
    shown = result.problems[:20]
    for p in shown:
        click.echo(f"skipped {p}", err=True)
    if sum(result.problem_counts.values()) > len(shown):
        click.echo(f"... {sum(result.problem_counts.values()) - len(shown)} more in {result.problems_file}",
                   err=True)
    if result.problems_unlisted:
        click.echo(f"note: {result.problems_unlisted} of the problems were counted but not listed in "
                   f"{result.problems_file} (too many to list)", err=True)
    click.echo(f"tokenizer {result.tokenizer}, tokens {result.dtype}")
    if result.reference:
        click.echo(f"cross-checked {result.cross_checked} documents against {result.reference}: identical ids")
    outs = set(result.docs_out.values())
    out = str(outs.pop()) if len(outs) == 1 else ", ".join(f"{k} {n}" for k, n in result.docs_out.items())
    click.echo(f"documents in {result.docs_in}, out {out}, dropped {result.lines_dropped}"
               + (f" ({', '.join(f'{k} {n}' for k, n in result.problem_counts.items())})"
                  if result.problem_counts else ""))
    secs = max(result.seconds, 1e-9)
    click.echo(f"read {result.bytes_in / 1e6:.1f} MB in {result.seconds:.1f} s "
               f"({result.bytes_in / secs / 1024 / 1024:.2f} MB/s, {result.docs_in / secs:.0f} docs/s)")
    for key, prefix in result.outputs.items():
        click.echo(f"wrote {prefix}.bin/.idx: {result.docs_out[key]} documents, {result.tokens_out[key]} tokens")
    if result.shard_outputs:
        keys = "/".join(result.docs_out)
        click.echo(f"wrote {len(result.shard_outputs)} outputs per key ({keys}), {result.shard_outputs[0]}_KEY_document "
                   f"... {result.shard_outputs[-1]}_KEY_document: {sum(result.docs_out.values())} documents, "
                   f"{sum(result.tokens_out.values())} tokens")
    if result.shards > 1:
        click.echo(f"shards {result.shards}: {result.resumed} kept from an earlier run, "
                   f"{result.shards - result.resumed} done now ({result.mode})")
    click.echo(f"start-up {result.startup_cpu_s:.2f} CPU s before the first document")
    if result.problems_file:
        click.echo(f"problems listed in {result.problems_file}")


def _preprocess_dry_run(paths: list[Path], output_prefix: str, per_input: bool, keys: tuple[str, ...]) -> None:
    """What preprocess would read and write: the inputs and the datasets (nothing read past their sizes)."""
    from bigscience_ops.data.shards import output_prefix_for, plan_shards

    shards = plan_shards(paths, output_prefix, per_input)  # two inputs that would share an output: refused here too
    size = sum(path.stat().st_size for path in paths)
    outputs = ([output_prefix_for(s.part, k) for s in shards for k in keys] if per_input
               else [output_prefix_for(output_prefix, k) for k in keys])
    click.echo(f"dry run: nothing read or written; would tokenize {len(paths)} input file(s), {size / 1e6:.1f} MB, "
               f"and write ({', '.join(keys)}):")
    for prefix in outputs:
        click.echo(f"  {prefix}.bin/.idx")


def _merge(prefixes: tuple[str, ...], folder: Path | None, output_prefix: str, dry_run: bool = False) -> None:
    from bigscience_ops.data.indexed import IndexedDataset, prefixes_in
    from bigscience_ops.data.shards import merge_checked

    if folder is not None:
        prefixes = tuple(prefixes) + tuple(prefixes_in(folder))
    if not prefixes:
        raise click.UsageError("give --input-prefix (repeat, in order) or --input FOLDER")
    if dry_run:
        missing = [prefix for prefix in prefixes if not Path(f"{prefix}.idx").is_file()]
        if missing:
            raise click.UsageError(f"got --input-prefix {missing[0]} with no {missing[0]}.idx; allowed: the prefix of "
                                   "an indexed dataset (PREFIX.bin and PREFIX.idx)")
        click.echo(f"dry run: nothing written; would merge {len(prefixes)} datasets, in this order, into "
                   f"{output_prefix}.bin/.idx (their tokenizers compared first):")
        for prefix in prefixes:
            click.echo(f"  {prefix}")
        return
    result = merge_checked(list(prefixes), output_prefix)
    for why in result.ignored:
        click.echo(f"note: {why}; not used", err=True)
    for prefix in result.unrecorded:
        click.echo(f"warning: {prefix} has no bsops record (PREFIX.dataset.json, or PART.preprocess.json of "
                   "--output-per-input): its tokenizer could not be compared with the others', only its token "
                   "dtype; the merged record names no tokenizer", err=True)
    out = result.prefix
    merged = IndexedDataset(out)
    click.echo(f"wrote {out}.bin/.idx from {len(prefixes)} datasets: {len(merged)} documents, "
               f"{merged.num_tokens} tokens; its record {result.record}")


_MERGE_OPTIONS = [
    click.option("--input-prefix", "prefixes", multiple=True,
                 help="Indexed dataset prefix (without .bin/.idx); repeat, in order."),
    click.option("--input", "folder", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
                 help="Megatron's merge_datasets.py: every PREFIX.bin/.idx pair in this folder, sorted by name "
                      "(after any --input-prefix)."),
    click.option("--output-prefix", required=True, help="Prefix of the merged .bin/.idx."),
]


def _merge_options(f):
    for option in reversed(_MERGE_OPTIONS):
        f = option(f)
    return f


@main.command("merge-datasets")
@_merge_options
@dry_run_option
def merge_datasets_command(prefixes: tuple[str, ...], folder: Path | None, output_prefix: str, dry_run: bool) -> None:
    """Concatenate indexed datasets (same tokenizer) into one, as Megatron's merge_datasets.py.

    The bytes equal those of preprocessing the inputs' jsonl concatenated in the same order:
    `bsops preprocess --output-per-input` then `merge-datasets` gives the .bin/.idx a single run
    over all the shards gives. Datasets whose records (PREFIX.dataset.json, PART.preprocess.json) name
    other tokenizer files, special text or token dtype are refused; one without a record (Megatron's)
    is named in a warning, and only its token dtype is compared. The merged dataset gets its own
    record (OUTPUT_PREFIX.dataset.json): their tokenizer and the largest of their token ids.
    """
    _merge(prefixes, folder, output_prefix, dry_run)


@main.command("merge-data", hidden=True)
@_merge_options
def merge_data(prefixes: tuple[str, ...], folder: Path | None, output_prefix: str) -> None:
    """merge-datasets' former name, kept one release and left out of `bsops --help`."""
    click.echo("note: merge-data is now merge-datasets; the old name goes in the next release", err=True)
    _merge(prefixes, folder, output_prefix)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@main.command("prepare-corpus")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the .bin/.idx (default: corpus/build next to the bundled corpus).")
@dry_run_option
def prepare_corpus(out_dir: Path | None, dry_run: bool) -> None:
    """Build the bundled corpus's .bin/.idx (the tiny experiment's data) if missing."""
    from bigscience_ops.data.corpus import NAME, default_build_dir, ensure_bundled_corpus
    from bigscience_ops.data.indexed import exists
    from bigscience_ops.data.shards import output_prefix_for

    if dry_run:
        prefix = output_prefix_for(str(Path(out_dir or default_build_dir()) / NAME), "text")
        click.echo(f"dry run: nothing written; {prefix}.bin/.idx " + (
            "exists (rebuilt if older than the bundled corpus)" if exists(prefix) else "would be built"))
        return
    prefix = ensure_bundled_corpus(out_dir or default_build_dir())
    click.echo(prefix)


@main.group("data")
def data_group() -> None:
    """Check datasets: `bsops data verify PREFIX` reads one whole."""


@data_group.command("verify")
@click.argument("prefix", type=TEXT)
@click.option("--vocab-size", type=click.IntRange(1, 1 << 40), default=None,
              help="Token ids must be below this (give the model's padded vocabulary to check what a run accepts).")
@click.option("--experiment", "experiment", type=TEXT, default=None,
              help="Take the vocabulary from experiment EXP: its model.vocab_size padded as the trainer pads it "
                   "(make_vocab_size_divisible_by x parallel.tensor), the bound plan and the trainer check.")
@trainings_option
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object.")
def data_verify(prefix: str, vocab_size: int | None, experiment: str | None, trainings_dir: Path | None,
                as_json: bool) -> None:
    """Read dataset PREFIX (PREFIX.bin and PREFIX.idx) whole: every token against the vocabulary, and the .idx
    against the .bin (sizes, pointers, document index, the .bin's size), and its record PREFIX.dataset.json
    against both. Nothing is sampled: it reads the whole .bin at disk speed, with progress on
    stderr. The check a trainer that stopped on a bad token points to; `bsops plan` checks less, faster.

    Exit 0 when all holds, 1 when something does not (each bad token up to 20 named by document and offset, the
    rest counted), 2 when there is no dataset to read. Without --vocab-size or --experiment the ids are not
    checked against a vocabulary (their smallest and largest are shown)."""
    import json
    import time

    from bigscience_ops.data.verify import verify

    if vocab_size is not None and experiment is not None:
        raise click.UsageError("give --vocab-size or --experiment, not both")
    limit = vocab_size
    if experiment is not None:
        from bigscience_ops.cli.base import load_experiment
        from bigscience_ops.sizing import padded_vocab_size

        m = (exp := load_experiment(experiment, trainings_dir)).model
        limit = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, exp.parallel.tensor)
    started = time.monotonic()
    shown = {"at": started, "lines": 0}

    def progress(done: int, total: int) -> None:  # a line a second, and the last once there was one
        now = time.monotonic()
        if now - shown["at"] >= 1.0 or (done == total and shown["lines"]):
            click.echo(f"verify: {done / 2**20:,.1f} of {total / 2**20:,.1f} MiB read ({done / max(total, 1):.0%}, "
                       f"{now - started:.0f} s)", err=True)
            shown.update(at=now, lines=shown["lines"] + 1)

    found = verify(prefix, limit, progress)
    if as_json:
        click.echo(json.dumps(found.as_dict(), indent=2))
    else:
        _echo_verified(found)
    if not found.ok:
        sys.exit(EXIT_PROBLEMS)


def _echo_verified(found) -> None:
    click.echo(f"{found.prefix}: {found.documents:,} documents, {found.tokens:,} tokens ({found.dtype}), "
               f".bin {found.bin_bytes:,} bytes")
    if found.max_id is not None:
        bound = f"; ids must be below {found.limit}" if found.limit is not None else " (no vocabulary given)"
        click.echo(f"token ids {found.min_id} to {found.max_id}{bound}")
    if found.bad_tokens:
        click.echo(f"{found.bad_tokens:,} token ids outside [0, {found.limit}):")
        for bad in found.first_bad:
            click.echo(f"  document {bad.document}, token {bad.offset}: id {bad.token}")
        if found.bad_tokens > len(found.first_bad):
            click.echo(f"  ... and {found.bad_tokens - len(found.first_bad):,} more")
    for problem in found.problems:
        click.echo(f"problem: {problem}")
    click.echo("ok" if found.ok else "not ok")


# --- ops commands ---
