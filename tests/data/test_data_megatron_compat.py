"""Migrating from Megatron's tools/preprocess_data.py: its command line, its bytes, its edge cases."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.data.indexed import IndexedDataset
from bigscience_ops.data.preprocess import preprocess
from bigscience_ops.data.tokenizer import resolve_tokenizer

EOD = 50256

# Web text does contain the literal end-of-text string; one title is empty (Megatron keeps the text).
ROWS = [
    {"text": "A first document.\nWith two lines.", "title": "One"},
    {"text": "Forum dump: <|endoftext|> appears here as text <|endoftext|>", "title": "Two <|endoftext|>"},
    {"text": "The title of this one is empty.", "title": ""},
    {"text": "", "title": "Only a title"},
    {"text": "Ünïcödé 😀 and   spaces\t\tand tabs", "title": "Five"},
]


def write_rows(path: Path, rows: list[dict] = ROWS) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def pair_bytes(prefix: str) -> tuple[bytes, bytes]:
    return Path(prefix + ".bin").read_bytes(), Path(prefix + ".idx").read_bytes()


def test_megatron_and_bsops_spellings_give_identical_bytes(tmp_path, gpt2_files):
    src = write_rows(tmp_path / "in.jsonl")
    vocab, merges = gpt2_files
    runner = CliRunner()
    megatron = runner.invoke(main, [
        "preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "meg"),
        "--vocab", vocab, "--merge-file", merges, "--tokenizer-type", "GPT2BPETokenizer",
        "--dataset-impl", "mmap", "--json-keys", "text", "title", "--append-eod", "--workers", "2",
        "--log-interval", "1", "--keep-newlines", "--make-vocab-size-divisible-by", "128",
        "--pad-vocab-size-to", "50304", "--datasets", "a", "b"])
    assert megatron.exit_code == 0, megatron.output
    ours = runner.invoke(main, [
        "preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "ours"), "--tokenizer", "gpt2",
        "--json-keys", "text", "--json-keys", "title", "--append-eod"])
    assert ours.exit_code == 0, ours.output
    for key in ("text", "title"):
        assert pair_bytes(f"{tmp_path}/meg_{key}_document") == pair_bytes(f"{tmp_path}/ours_{key}_document")
    # The options that change nothing are named; the ones that do are not.
    [warning] = [line for line in megatron.stderr.splitlines() if line.startswith("warning:")]
    for flag in HIDDEN_IGNORED + ("--keep-newlines", "--dataset-impl"):
        assert flag in warning
    assert "--workers" not in warning
    assert "warning:" not in ours.stderr


# Every flag of `bsops preprocess --help`: bsops' own and Megatron's preprocess_data.py spellings.
FLAGS = {"--input", "--output-per-input", "--json-keys", "--tokenizer", "--tokenizer-type", "--tokenizer-name-or-path",
         "--vocab-file", "--vocab", "--merge-file", "--merges-file", "--tokenizer-backend", "--cross-check",
         "--special-text", "--append-eod", "--output-prefix", "--workers", "--strict", "--max-document-bytes",
         "--log-interval", "--dataset-impl", "--keep-newlines", "--dry-run", "--help"}
# Megatron's, accepted and named in the warning, not shown in --help (--split-sentences is refused).
HIDDEN_IGNORED = ("--make-vocab-size-divisible-by", "--pad-vocab-size-to", "--datasets")


def test_help_lists_every_flag():
    res = CliRunner().invoke(main, ["preprocess", "--help"])
    assert res.exit_code == 0, res.output
    # An option's line starts with two spaces and its flags, then two or more spaces and its help.
    shown = {flag for line in res.output.splitlines() if line.startswith("  -")
             for flag in re.findall(r"--[\w-]+", re.split(r"\s{2,}", line.strip())[0])}
    assert shown == FLAGS
    assert not any(flag in res.output for flag in HIDDEN_IGNORED + ("--split-sentences",))


def test_bytes_equal_megatrons_pure_python_pipeline(tmp_path, gpt2_files, megatron_gpt2):
    """Megatron's per-line loop (empty keys skipped per key, EOD appended), document by document."""
    src = write_rows(tmp_path / "in.jsonl")
    r = preprocess([src], str(tmp_path / "out"), resolve_tokenizer(None, *gpt2_files), ("text", "title"),
                   append_eod=True)
    for key in ("text", "title"):
        expected = [megatron_gpt2.encode(row[key]) + [EOD] for row in ROWS if row[key]]
        ds = IndexedDataset(r.outputs[key])
        assert [ds[i].tolist() for i in range(len(ds))] == expected
    assert r.docs_out == {"text": 4, "title": 4} and r.lines_dropped == 0
    assert sorted((p.line, p.kind, p.detail.split()[0]) for p in r.problems) == [
        (3, "empty", "'title'"), (4, "empty", "'text'")]


def test_special_text_token_option_makes_it_the_eod_id(tmp_path):
    src = write_rows(tmp_path / "in.jsonl", [{"text": "before <|endoftext|> after"}])
    plain = preprocess([src], str(tmp_path / "plain"), resolve_tokenizer("gpt2"), append_eod=True)
    token = preprocess([src], str(tmp_path / "token"), resolve_tokenizer("gpt2", special_text="token"),
                       append_eod=True)
    plain_ids = IndexedDataset(plain.outputs["text"])[0].tolist()
    token_ids = IndexedDataset(token.outputs["text"])[0].tolist()
    assert plain_ids.count(EOD) == 1 and plain_ids[-1] == EOD
    assert token_ids.count(EOD) == 2 and len(token_ids) < len(plain_ids)
    res = CliRunner().invoke(main, ["preprocess", "--input", str(src), "--tokenizer", "gpt2", "--append-eod",
                                    "--special-text", "token", "--output-prefix", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    assert IndexedDataset(tmp_path / "cli_text_document")[0].tolist() == token_ids


def test_pretrained_from_hf_spelling_reads_a_local_tokenizer(tmp_path, repo_root):
    src = write_rows(tmp_path / "in.jsonl")
    tokenizer = str(repo_root / "corpus" / "tokenizer.json")
    runner = CliRunner()
    res = runner.invoke(main, ["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "hf"),
                               "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", tokenizer,
                               "--json-keys", "text"])
    assert res.exit_code == 0, res.output
    res2 = runner.invoke(main, ["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "b"),
                                "--tokenizer", tokenizer])
    assert res2.exit_code == 0, res2.output
    assert pair_bytes(f"{tmp_path}/hf_text_document") == pair_bytes(f"{tmp_path}/b_text_document")


@pytest.mark.parametrize("argv", [
    ["--split-sentences", "--tokenizer", "gpt2"],
    ["--tokenizer-type", "BertWordPieceLowerCase", "--tokenizer", "gpt2"],
    ["--dataset-impl", "lazy", "--tokenizer", "gpt2"],
    ["--tokenizer-type", "PretrainedFromHF"],
])
def test_megatron_options_that_cannot_be_honoured_are_refused(tmp_path, argv):
    src = write_rows(tmp_path / "in.jsonl")
    res = CliRunner().invoke(main, ["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "x"),
                                    *argv])
    assert res.exit_code == 2
    assert not list(tmp_path.glob("x_*"))


def test_several_keys_with_greedy_values_before_other_options(tmp_path):
    src = write_rows(tmp_path / "in.jsonl")
    res = CliRunner().invoke(main, ["preprocess", "--json-keys", "title", "text", "--input", str(src),
                                    "--tokenizer", "gpt2", "--output-prefix", str(tmp_path / "g")])
    assert res.exit_code == 0, res.output
    lib = preprocess([src], str(tmp_path / "lib"), resolve_tokenizer("gpt2"), ("title", "text"), append_eod=False)
    for key in ("title", "text"):
        assert pair_bytes(f"{tmp_path}/g_{key}_document") == pair_bytes(lib.outputs[key])
