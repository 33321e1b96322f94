"""Data commands: preprocess, merge-data, prepare-corpus."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import main


def _split_keys(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(k for v in values for k in v.replace(",", " ").split())


@main.command()
@click.option("--input", "inputs", multiple=True, required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="jsonl file, optionally .gz or .xz compressed; repeat for several.")
@click.option("--json-keys", multiple=True, default=("text",), show_default=True,
              help="Keys whose strings are the documents; one output per key.")
@click.option("--tokenizer", default=None,
              help="A tokenizer.json, a folder with vocab.json + merges.txt, or 'gpt2' (packaged GPT-2 files).")
@click.option("--vocab-file", default=None, help="GPT-2 style vocab.json (with --merge-file).")
@click.option("--merge-file", "merges_file", default=None, help="GPT-2 style merges.txt (with --vocab-file).")
@click.option("--tokenizer-backend", type=click.Choice(["auto", "tiktoken", "tokenizers"]), default="auto",
              show_default=True, help="auto: tiktoken when it gives the same ids, else tokenizers.")
@click.option("--append-eod", is_flag=True, help="End each document with <|endoftext|>.")
@click.option("--output-prefix", required=True, help="Writes PREFIX_KEY_document.bin/.idx.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tokenizing processes.")
@click.option("--strict", is_flag=True, help="Stop at the first unusable line instead of counting it.")
@click.option("--log-interval", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Documents between progress lines (when stderr is not a terminal).")
def preprocess(inputs: tuple[Path, ...], json_keys: tuple[str, ...], tokenizer: str | None,
               vocab_file: str | None, merges_file: str | None, tokenizer_backend: str, append_eod: bool,
               output_prefix: str, workers: int, strict: bool, log_interval: int) -> None:
    """Tokenize jsonl documents into Megatron's indexed format (.bin/.idx)."""
    from bigscience_ops.data.preprocess import Progress
    from bigscience_ops.data.preprocess import preprocess as run_preprocess
    from bigscience_ops.data.tokenizer import resolve_tokenizer

    spec = resolve_tokenizer(tokenizer, vocab_file, merges_file, tokenizer_backend)
    on_terminal = sys.stderr.isatty()
    state = {"next_log": log_interval, "shown": 0}

    def report(p: Progress) -> None:
        if on_terminal:
            if p.fraction is not None:
                width = 30
                done = int(p.fraction * width)
                click.echo(f"\r[{'#' * done}{'.' * (width - done)}] {p.fraction:6.1%} {p.docs} docs "
                           f"{p.mb_per_s:.1f} MB/s", nl=False, err=True)
        elif p.docs >= state["next_log"]:
            click.echo(p.megatron_line(), err=True)
            state["next_log"] = (p.docs // log_interval + 1) * log_interval

    result = run_preprocess(list(inputs), output_prefix, spec, _split_keys(json_keys), append_eod,
                            workers, strict, report)
    if on_terminal:
        click.echo("", err=True)
    for p in result.problems[:20]:
        click.echo(f"skipped {p}", err=True)
    if result.docs_dropped > len(result.problems[:20]):
        click.echo(f"... {result.docs_dropped - len(result.problems[:20])} more in {result.problems_file}", err=True)
    click.echo(f"tokenizer {result.tokenizer}, tokens {result.dtype}")
    click.echo(f"documents in {result.docs_in}, out {result.docs_out}, dropped {result.docs_dropped}"
               + (f" ({', '.join(f'{k} {n}' for k, n in result.problem_counts.items())})"
                  if result.problem_counts else ""))
    secs = max(result.seconds, 1e-9)
    click.echo(f"read {result.bytes_in / 1e6:.1f} MB in {result.seconds:.1f} s "
               f"({result.bytes_in / secs / 1024 / 1024:.2f} MB/s, {result.docs_in / secs:.0f} docs/s)")
    for key, prefix in result.outputs.items():
        click.echo(f"wrote {prefix}.bin/.idx: {result.docs_out} documents, {result.tokens_out[key]} tokens")
    if result.problems_file:
        click.echo(f"problems listed in {result.problems_file}")


@main.command("merge-data")
@click.option("--input-prefix", "prefixes", multiple=True, required=True,
              help="Indexed dataset prefix (without .bin/.idx); repeat, in order.")
@click.option("--output-prefix", required=True, help="Prefix of the merged .bin/.idx.")
def merge_data(prefixes: tuple[str, ...], output_prefix: str) -> None:
    """Concatenate indexed datasets (same tokenizer) into one."""
    from bigscience_ops.data.indexed import IndexedDataset, merge_datasets

    out = merge_datasets(list(prefixes), output_prefix)
    merged = IndexedDataset(out)
    click.echo(f"wrote {out}.bin/.idx: {len(merged)} documents, {merged.num_tokens} tokens")


@main.command("prepare-corpus")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the .bin/.idx (default: corpus/build next to the bundled corpus).")
def prepare_corpus(out_dir: Path | None) -> None:
    """Build the bundled corpus's .bin/.idx (the tiny experiment's data) if missing."""
    from bigscience_ops.data.corpus import default_build_dir, ensure_bundled_corpus

    prefix = ensure_bundled_corpus(out_dir or default_build_dir())
    click.echo(prefix)


# --- ops commands ---
