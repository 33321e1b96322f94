"""Hostile dataset records and preprocess options, through the public CLI (`bsops plan`, `bsops preprocess`).

A dataset record (PREFIX.dataset.json) is a claim, checked: read only as a regular file (a link is refused by plan,
naming the record), bound to its data's content, its largest token id borne out by a scan. Each row spoils a copy of
one small dataset preprocessed with the bundled tokenizer (vocabulary 8192, the `tiny` model's) and says what plan
must make of it: refused (the error kinds and the file named), or planned with the scan's largest id and a note.
preprocess: a json key that could name a file outside the output prefix's folder is refused before anything is
written; --workers is capped at this machine's cores and the pieces of work, and never below 1.
"""

from __future__ import annotations

import json
import multiprocessing.pool
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.data import binding
from bigscience_ops.data.corpus import bundled_tokenizer
from bigscience_ops.data.preprocess import available_cores, preprocess
from tests.fixtures_experiments import tiny_yaml

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "corpus" / "tokenizer.json"
VOCAB = 8192  # tiny's model.vocab_size, padded (a multiple of 128 x TP 1)
BEYOND = 50256  # GPT-2's end of document: an id the tiny model has no row for
LINES = [{"text": "In the beginning God created the heaven and the earth."},
         {"text": "And the earth was without form, and void; and darkness was upon the face of the deep."},
         {"text": "And God said, Let there be light: and there was light."}]


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One output preprocessed with the bundled tokenizer: its .bin, .idx and bound record."""
    folder = tmp_path_factory.mktemp("original")
    source = folder / "genesis.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in LINES * 30))
    return preprocess([source], str(folder / "gen"), bundled_tokenizer(), ("text",)).outputs["text"]


@dataclass
class Data:
    """A copy of the original dataset (`prefix`) beside which a row spoils things; `original` is the untouched one."""

    prefix: str
    original: str
    patch: pytest.MonkeyPatch

    def sampled(self) -> None:
        """Bind the .bin by sampled blocks, as one over 64 MiB is: its scan is then kept in PREFIX.maxid."""
        self.patch.setattr(binding, "FULL_HASH_BYTES", 0)

    @property
    def record(self) -> Path:
        return Path(f"{self.prefix}.dataset.json")

    def tokens(self) -> np.ndarray:
        return np.fromfile(f"{self.prefix}.bin", dtype=np.uint16)

    def load(self) -> dict:
        return json.loads(Path(f"{self.original}.dataset.json").read_text())

    def put(self, record: dict | str | bytes) -> None:
        self.record.unlink(missing_ok=True)
        data = record if isinstance(record, (str, bytes)) else json.dumps(record)
        self.record.write_bytes(data.encode() if isinstance(data, str) else data)

    def change_token(self, value: int = BEYOND, at: int = 7) -> None:
        """One token of the .bin set to `value`: the same size, the same counts in the .idx."""
        tokens = self.tokens()
        tokens[at] = value
        tokens.tofile(f"{self.prefix}.bin")


@pytest.fixture
def data(original: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Data:
    folder = tmp_path / "data"
    folder.mkdir()
    prefix = folder / Path(original).name
    for ext in (".bin", ".idx", ".dataset.json"):
        shutil.copyfile(f"{original}{ext}", f"{prefix}{ext}")
    return Data(str(prefix), original, monkeypatch)


def planned(trainings: Path, tmp_path: Path, prefix: str) -> tuple[int, dict]:
    """`bsops plan x --json` of a `base: tiny` experiment reading `prefix`: (exit code, the data section)."""
    blend = f"data: {{blend: [{{prefix: {json.dumps(prefix)}}}], tokenizer: {{kind: json, json_file: {json.dumps(str(TOKENIZER))}}}}}\n"
    (trainings / "x.yaml").write_text(tiny_yaml(tmp_path / "runs" / "x", blend))
    result = run("plan", "x", "--json", "--trainings-dir", str(trainings))
    return result.exit_code, json.loads(result.stdout)["data"]


# ----------------------------------------------------------------------------- records plan must refuse

def _link_to_original(d: Data) -> None:  # the very record of identical data, reached through a link
    d.record.unlink()
    d.record.symlink_to(f"{d.original}.dataset.json")


def _link_beside_changed_data(d: Data) -> None:  # the issue's: the original's record, linked beside a changed .bin
    _link_to_original(d)
    d.change_token()


def _dangling_link(d: Data) -> None:
    d.record.unlink()
    d.record.symlink_to(f"{d.prefix}.no-such-record")


def _link_loop(d: Data) -> None:
    d.record.unlink()
    d.record.symlink_to(d.record.name)


def _copied_record_beside_changed_data(d: Data) -> None:  # the issue's: a copy whose .bin holds 50256
    d.change_token()


def _unbound_record_beside_changed_data(d: Data) -> None:  # a record from before bindings, its claim now a lie
    d.put({k: v for k, v in d.load().items() if k != "binding"})
    d.change_token()


def _lying_max_id_beside_changed_data(d: Data) -> None:  # binding recomputed by hand for the new .bin, max_id kept
    d.change_token()
    d.put({**d.load(), "binding": binding.compute(d.prefix)})


def _cache_copied_beside_changed_data(d: Data) -> None:  # no record; the scan cache of the data before the change
    d.sampled()
    d.record.unlink()
    binding.checked_max_id(d.prefix, np.uint16)
    assert binding.cache_path(d.prefix).is_file()
    mtime = os.stat(f"{d.prefix}.bin").st_mtime_ns
    d.change_token()
    os.utime(f"{d.prefix}.bin", ns=(mtime, mtime))  # the same inode, size and mtime: the binding tells them apart


def _cache_linked_beside_changed_data(d: Data) -> None:  # no record; the cache a link to a cache that held true
    d.sampled()
    d.patch.setattr(binding, "SAMPLES", 2)  # the first and the last token only: the change below is not seen
    d.patch.setattr(binding, "SAMPLE_BYTES", 2)
    d.record.unlink()
    other = Path(f"{d.prefix}.elsewhere")
    binding.checked_max_id(d.prefix, np.uint16)
    binding.cache_path(d.prefix).rename(other)
    binding.cache_path(d.prefix).symlink_to(other.name)
    mtime = os.stat(f"{d.prefix}.bin").st_mtime_ns
    d.change_token()
    os.utime(f"{d.prefix}.bin", ns=(mtime, mtime))  # read through the link, the cache would still hold


def _record_path(d: Data) -> str:
    return str(d.record)


def _bin_path(d: Data) -> str:
    return f"{d.prefix}.bin"


REFUSED: dict[str, tuple[Callable[[Data], None], list[str], Callable[[Data], str], str | None]] = {
    # row: (spoil, error kinds, the file the first error names, a file that error's text must also name)
    "record is a link to identical data's record": (_link_to_original, ["LinkedRecord"], _record_path, None),
    "record is a link, beside a changed .bin": (_link_beside_changed_data, ["LinkedRecord", "TokenIdBeyondVocab"],
                                                _record_path, None),
    "record is a dangling link": (_dangling_link, ["LinkedRecord"], _record_path, None),
    "record is a link to itself": (_link_loop, ["LinkedRecord"], _record_path, None),
    "a copied record beside a changed .bin": (_copied_record_beside_changed_data, ["TokenIdBeyondVocab"], _bin_path,
                                              ".dataset.json"),
    "an unbound record whose max_id lies": (_unbound_record_beside_changed_data, ["TokenIdBeyondVocab"], _bin_path,
                                            ".dataset.json"),
    "a bound record whose max_id lies": (_lying_max_id_beside_changed_data, ["TokenIdBeyondVocab"], _bin_path,
                                         ".dataset.json"),
    "a scan cache copied beside a changed .bin": (_cache_copied_beside_changed_data, ["TokenIdBeyondVocab"],
                                                  _bin_path, None),
    "a scan cache that is a link": (_cache_linked_beside_changed_data, ["TokenIdBeyondVocab"], _bin_path, None),
}


@pytest.mark.parametrize("row", list(REFUSED))
def test_a_record_that_lies_or_is_a_link_is_refused_by_plan(row: str, trainings: Path, tmp_path: Path,
                                                            data: Data) -> None:
    spoil, kinds, named, also = REFUSED[row]
    spoil(data)
    code, checked = planned(trainings, tmp_path, data.prefix)
    assert code == 1 and checked["refused"]
    assert [e["kind"] for e in checked["errors"]] == kinds
    first = checked["errors"][0]
    assert first["path"] == named(data)
    if also is not None:
        assert f"{data.prefix}{also}" in first["text"]
    if "TokenIdBeyondVocab" in kinds:
        [beyond] = [e for e in checked["errors"] if e["kind"] == "TokenIdBeyondVocab"]
        assert str(BEYOND) in beyond["text"] and f"below {VOCAB}" in beyond["text"]
        assert checked["entries"][0]["max_id"]["value"] == BEYOND
    text = run("plan", "x", "--trainings-dir", str(trainings))  # the same, as the plan's text
    errors = [line for line in text.output.splitlines() if line.startswith("  - error:")]
    assert text.exit_code == 1 and len(errors) == len(kinds) and named(data) in errors[0]
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- records plan does not use

def _fifo(d: Data) -> None:
    d.record.unlink()
    os.mkfifo(d.record)


def _folder(d: Data) -> None:
    d.record.unlink()
    d.record.mkdir()


def _huge(d: Data) -> None:
    d.put(json.dumps(d.load()) + " " * (1 << 17))


def _set(**fields) -> Callable[[Data], None]:
    return lambda d: d.put({**d.load(), **fields})


NOT_USED: dict[str, Callable[[Data], None]] = {
    "record is a FIFO (reading it would wait forever)": _fifo,
    "record is a folder": _folder,
    "record of 128 KiB": _huge,
    "record is not JSON": lambda d: d.put(b"\x00\xff{not json"),
    "record is cut short": lambda d: d.put(json.dumps(d.load())[:50]),
    "record is a JSON list": lambda d: d.put("[1, 2, 3]"),
    "max_id as a string": _set(max_id="6590"),
    "max_id negative": _set(max_id=-1),
    "max_id a boolean": _set(max_id=True),
    "binding not a digest": _set(binding={"idx_sha256": "../../etc/passwd", "bin_bytes": 1, "bin_sha256": "x"}),
    "binding with a key too many": lambda d: d.put({**d.load(), "binding": {**d.load()["binding"], "extra": 1}}),
    "documents one too many": lambda d: d.put({**d.load(), "documents": d.load()["documents"] + 1}),
    "tokens as a float": lambda d: d.put({**d.load(), "tokens": float(d.load()["tokens"])}),
    "dtype of another width": _set(dtype="<u4"),
    "max_id above the truth": lambda d: d.put({**d.load(), "max_id": int(d.tokens().max()) + 1}),
    "max_id below the truth": lambda d: d.put({**d.load(), "max_id": int(d.tokens().max()) - 1}),
    "bound to another .idx": lambda d: d.put({**d.load(), "binding": {**d.load()["binding"], "idx_sha256": "0" * 64}}),
    "format of another tool": _set(format="megatron"),
}


@pytest.mark.parametrize("row", list(NOT_USED))
def test_a_record_that_cannot_be_used_gives_a_note_and_the_scans_id(row: str, trainings: Path, tmp_path: Path,
                                                                     data: Data) -> None:
    NOT_USED[row](data)
    outcome: dict = {}
    planning = threading.Thread(target=lambda: outcome.update(zip(("code", "data"), planned(trainings, tmp_path,
                                                                                            data.prefix))),
                                daemon=True)
    planning.start()
    planning.join(60)
    assert not planning.is_alive(), "plan waited on the record"
    assert outcome["code"] == 0 and not outcome["data"]["refused"] and outcome["data"]["errors"] == []
    assert outcome["data"]["entries"][0]["max_id"]["value"] == int(data.tokens().max())
    assert not outcome["data"]["entries"][0]["max_id"]["source"].startswith("record")
    notes = [n for n in outcome["data"]["notes"] if str(data.record) in n]
    assert len(notes) == 1 and notes[0].endswith("; not used")
    assert all(ch.isprintable() for n in outcome["data"]["notes"] for ch in n)


def test_an_unbound_record_that_holds_true_is_bound_once_checked(trainings: Path, tmp_path: Path,
                                                                  data: Data) -> None:
    """A record from before bindings: its claim checked by one scan, then its binding written beside the data."""
    data.put({k: v for k, v in data.load().items() if k != "binding"})
    code, checked = planned(trainings, tmp_path, data.prefix)
    assert code == 0 and checked["entries"][0]["max_id"] == {"value": int(data.tokens().max()),
                                                              "source": f"record {data.record}"}
    assert json.loads(data.record.read_text())["binding"] == binding.compute(data.prefix)


# ----------------------------------------------------------------------------- preprocess: json keys

KEYS = {
    "parent folder": "../x",
    "two levels up": "../../evil",
    "a path separator": "a/b",
    "an absolute path": "/tmp/evil",
    "dot dot alone": "..",
    "a leading dot (a hidden file)": ".hidden",
    "a NUL": "a\x00b",
    "a newline": "a\nb",
    "a tab": "a\tb",
    "U+2028": "a\u2028b",
    "an escape sequence": "\x1b[2J",
    "a backslash": "a\\b",
    "101 characters": "k" * 101,
}


def _listing(*folders: Path) -> list[str]:
    return sorted(str(p) for folder in folders for p in folder.rglob("*"))


@pytest.mark.parametrize("row", list(KEYS))
def test_a_json_key_that_could_leave_the_output_folder_is_refused(row: str, tmp_path: Path) -> None:
    key = KEYS[row]
    out = tmp_path / "deep" / "out"
    out.mkdir(parents=True)
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "a document", key: "another"}) + "\n")
    before = _listing(tmp_path, Path.cwd())
    result = run("preprocess", "--input", str(source), "--output-prefix", str(out / "p"), "--tokenizer",
                 str(TOKENIZER), "--json-keys", key)
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--json-keys" in errors[0]
    assert repr(key)[:30] in errors[0] and all(ch.isprintable() for ch in errors[0])
    assert _listing(tmp_path, Path.cwd()) == before


def test_a_json_key_refused_through_the_library_too(tmp_path: Path) -> None:
    from bigscience_ops.data.preprocess import BadJsonKey

    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "a document"}) + "\n")
    with pytest.raises(BadJsonKey) as raised:
        preprocess([source], str(tmp_path / "out"), bundled_tokenizer(), ("text", "../x"))
    assert raised.value.key == "../x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


# ----------------------------------------------------------------------------- preprocess: workers

@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of processes each real worker pool of the run started."""
    started: list[int] = []
    real = multiprocessing.pool.Pool.__init__

    def counted(self, *args, **kwargs):
        real(self, *args, **kwargs)
        started.append(len(self._pool))

    monkeypatch.setattr(multiprocessing.pool.Pool, "__init__", counted)
    return started


def _preprocess(tmp_path: Path, inputs: list[Path], workers: str):
    args = ["preprocess", "--output-prefix", str(tmp_path / "out"), "--tokenizer", str(TOKENIZER),
            "--workers", workers]
    for path in inputs:
        args += ["--input", str(path)]
    return run(*args)


def _lines(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"text": f"line {i} of {path.name}"}) + "\n" for i in range(n)))
    return path


@pytest.mark.parametrize("workers", ["1000000", str(10 ** 30)])
def test_workers_on_a_50_line_file_start_no_pool(workers: str, tmp_path: Path, pools: list[int]) -> None:
    result = _preprocess(tmp_path, [_lines(tmp_path / "in.jsonl", 50)], workers)
    assert result.exit_code == 0, result.output
    assert pools == []  # one piece of work: this process alone
    notes = [line for line in result.output.splitlines() if line.startswith("note: --workers")]
    assert len(notes) == 1 and "capped to 1:" in notes[0]
    assert len(np.fromfile(tmp_path / "out_text_document.bin", dtype=np.uint16)) > 0


def test_workers_a_million_start_at_most_as_many_processes_as_cores(tmp_path: Path, pools: list[int]) -> None:
    inputs = [_lines(tmp_path / f"in_{i}.jsonl", 20) for i in range(2 * available_cores() + 1)]
    result = _preprocess(tmp_path, inputs, "1000000")
    assert result.exit_code == 0, result.output
    cores = len(os.sched_getaffinity(0))
    assert pools and all(1 < n <= cores for n in pools) if cores > 1 else pools == []
    notes = [line for line in result.output.splitlines() if line.startswith("note: --workers")]
    assert len(notes) == 1 and f"capped to {min(cores, len(inputs))}" in notes[0]
    one = preprocess(inputs, str(tmp_path / "one"), bundled_tokenizer(), ("text",), append_eod=False, workers=1)
    assert one.workers.used == 1 and not one.workers.capped
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"out_text_document{ext}").read_bytes() == (tmp_path / f"one_text_document{ext}").read_bytes()


@pytest.mark.parametrize("workers", ["0", "-1", "two", ""])
def test_workers_below_one_or_not_a_number_are_refused(workers: str, tmp_path: Path, pools: list[int]) -> None:
    source = _lines(tmp_path / "in.jsonl", 5)
    before = _listing(tmp_path)
    result = _preprocess(tmp_path, [source], workers)
    assert result.exit_code == 2 and pools == []
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--workers" in errors[0]
    assert _listing(tmp_path) == before
