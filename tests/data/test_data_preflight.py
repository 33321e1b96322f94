"""The data's pre-flight checks (data/preflight.py) on real datasets, and `plan` / `launch --dry-run` refusing them.

Each dataset is written by the project's own writer (indexed.IndexedDatasetWriter) or by preprocess on a few
lines with the bundled tokenizer; each experiment is `base: tiny` (vocabulary 8192) in the test's trainings
folder. A refusal is one `error:` line naming the file, and nothing is written: the folders are listed before
and after.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.data import preflight
from bigscience_ops.data.corpus import bundled_tokenizer
from bigscience_ops.data.preprocess import preprocess
from bigscience_ops.plan import make_plan
from tests.fixtures_data import write_indexed, after_a_ctime_tick
from tests.fixtures_experiments import tiny_yaml

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "corpus" / "tokenizer.json"


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def experiment(trainings: Path, tmp_path: Path, prefix: str, tokenizer: Path = TOKENIZER) -> str:
    """A `base: tiny` experiment `x` reading `prefix` with the json tokenizer `tokenizer`; its run under tmp_path."""
    data = f"data: {{blend: [{{prefix: {json.dumps(prefix)}}}], tokenizer: {{kind: json, json_file: {json.dumps(str(tokenizer))}}}}}\n"
    (trainings / "x.yaml").write_text(tiny_yaml(tmp_path / "runs" / "x", data))
    return "x"


def listing(*folders: Path) -> list[str]:
    return sorted(str(p) for folder in folders for p in folder.rglob("*"))


def refused_by_plan_and_dry_run(trainings: Path, tmp_path: Path, path: str, kind: type) -> None:
    """`plan` exits 1 and `launch --dry-run` 2, each with one error line naming `path`; nothing is written."""
    before = listing(tmp_path, Path.cwd())
    planned = run("plan", "x", "--trainings-dir", str(trainings))
    assert planned.exit_code == 1
    assert len([line for line in planned.output.splitlines() if line.startswith("  - error:") and path in line]) == 1
    as_json = json.loads(run("plan", "x", "--json", "--trainings-dir", str(trainings)).stdout)
    assert as_json["data"]["refused"] and [e["kind"] for e in as_json["data"]["errors"]] == [kind.__name__]
    assert as_json["data"]["errors"][0]["path"] == path
    dry = run("launch", "x", "--dry-run", "--trainings-dir", str(trainings))
    assert dry.exit_code == 2
    errors = [line for line in dry.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and path in errors[0]
    assert "dry run" not in dry.stdout
    assert listing(tmp_path, Path.cwd()) == before
    assert not (tmp_path / "runs").exists()


def test_ids_beyond_the_padded_vocabulary_are_refused(trainings: Path, tmp_path: Path) -> None:
    prefix = write_indexed(tmp_path / "data" / "gpt2_text_document", [[464, 3290, 50256], [11, 50256]] * 50)
    experiment(trainings, tmp_path, prefix)
    run("plan", "x", "--trainings-dir", str(trainings))  # the first scan keeps its result beside the .idx
    refused_by_plan_and_dry_run(trainings, tmp_path, f"{prefix}.bin", preflight.TokenIdBeyondVocab)


def test_a_missing_tokenizer_file_is_refused(trainings: Path, tmp_path: Path) -> None:
    prefix = write_indexed(tmp_path / "data" / "ok_text_document", [[5, 6, 7, 0]] * 100)
    experiment(trainings, tmp_path, prefix, tmp_path / "no-such-tokenizer.json")
    run("plan", "x", "--trainings-dir", str(trainings))
    refused_by_plan_and_dry_run(trainings, tmp_path, str(tmp_path / "no-such-tokenizer.json"),
                                preflight.MissingTokenizerFile)


def test_a_missing_bin_is_refused(trainings: Path, tmp_path: Path) -> None:
    prefix = write_indexed(tmp_path / "data" / "ok_text_document", [[5, 6, 7, 0]] * 100)
    os.unlink(f"{prefix}.bin")
    experiment(trainings, tmp_path, prefix)
    refused_by_plan_and_dry_run(trainings, tmp_path, f"{prefix}.bin", preflight.MissingDataFile)


@pytest.fixture
def recorded(tmp_path: Path) -> str:
    """A dataset preprocessed with the bundled tokenizer, with its record (one part per input)."""
    lines = [{"text": "In the beginning God created the heaven and the earth."},
             {"text": "And the earth was without form, and void; and darkness was upon the face of the deep."}]
    source = tmp_path / "genesis.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines * 20))
    result = preprocess([source], str(tmp_path / "data" / "gen"), bundled_tokenizer(), ("text",), output_per_input=True)
    return f"{result.shard_outputs[0]}_text_document"


def test_a_dataset_made_with_another_tokenizer_is_refused(trainings: Path, tmp_path: Path, recorded: str) -> None:
    other = tmp_path / "other-tokenizer.json"  # the same vocabulary, another file: its sha256 differs
    other.write_bytes(TOKENIZER.read_bytes() + b"\n")
    experiment(trainings, tmp_path, recorded, other)
    refused_by_plan_and_dry_run(trainings, tmp_path, f"{recorded}.bin", preflight.OtherTokenizer)


def test_a_recorded_dataset_gives_its_largest_id_without_a_scan(trainings: Path, tmp_path: Path,
                                                                recorded: str) -> None:
    """The record's largest id, borne out by a scan; a part's record never gives one: a scan does."""
    record = json.loads(Path(f"{recorded[:-len('_text_document')]}.preprocess.json").read_text())
    tokens = np.fromfile(f"{recorded}.bin", dtype=np.uint16)
    assert record["stats"]["max_id"] == {"text": int(tokens.max())}  # preprocess records it while encoding
    exp = load_experiment(experiment(trainings, tmp_path, recorded), trainings)
    check = preflight.check_data(exp, make_plan(exp).dataset_sizes[0])
    own = f"record {recorded}.dataset.json"  # the dataset's own record first
    assert check.errors == [] and check.entries[0].max_id == preflight.MaxId(int(tokens.max()), own)
    os.unlink(f"{recorded}.dataset.json")  # then a scan (the part's record names the tokenizer only)
    check = preflight.check_data(exp, make_plan(exp).dataset_sizes[0])
    assert check.errors == [] and check.entries[0].max_id == preflight.MaxId(int(tokens.max()), "scan")
    assert not preflight.cache_path(recorded).exists()  # a .bin hashed whole: its scan is not kept


def test_the_scan_is_cached_and_done_again_when_the_bin_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bigscience_ops.data import binding

    monkeypatch.setattr(binding, "FULL_HASH_BYTES", 4)  # a .bin hashed whole is scanned each time: none kept
    prefix = write_indexed(tmp_path / "d_text_document", [[1, 2, 3], [700, 4]])
    first = preflight.max_token_id(prefix, np.uint16)
    assert first == preflight.MaxId(700, "scan") and preflight.cache_path(prefix).is_file()
    assert preflight.max_token_id(prefix, np.uint16) == preflight.MaxId(700, f"cache {preflight.cache_path(prefix)}")
    write_indexed(tmp_path / "d_text_document", [[1, 2, 3], [900, 4, 5]])  # another size: the cache is stale
    assert preflight.max_token_id(prefix, np.uint16) == preflight.MaxId(900, "scan")
    tokens = np.fromfile(f"{prefix}.bin", dtype=np.uint16)
    tokens[0] = 901  # the same size, a later mtime
    tokens.tofile(f"{prefix}.bin")
    os.utime(f"{prefix}.bin", ns=(os.stat(f"{prefix}.bin").st_atime_ns, os.stat(f"{prefix}.bin").st_mtime_ns + 10**9))
    assert preflight.max_token_id(prefix, np.uint16) == preflight.MaxId(901, "scan")


def test_a_scan_reads_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bigscience_ops.data import binding

    monkeypatch.setattr(binding, "SCAN_CHUNK", 7)
    docs = [list(range(i, i + 5)) for i in range(0, 60, 5)] + [[12345, 3]]
    prefix = write_indexed(tmp_path / "c_text_document", docs)
    assert preflight.scan_max_id(Path(f"{prefix}.bin"), np.uint16) == 12345
    empty = write_indexed(tmp_path / "e_text_document", [])
    assert preflight.scan_max_id(Path(f"{empty}.bin"), np.uint16) is None


def test_the_plan_shows_the_epochs_and_warns_when_data_repeats(trainings: Path, tmp_path: Path) -> None:
    prefix = write_indexed(tmp_path / "data" / "small_text_document", [[5, 6, 7, 8, 9, 0]] * 1000)
    exp = load_experiment(experiment(trainings, tmp_path, prefix), trainings)
    samples = make_plan(exp).dataset_sizes[0]
    check = preflight.check_data(exp, samples)
    entry = check.entries[0]
    assert check.errors == [] and entry.documents == 1000 and entry.train_documents == 949
    assert entry.train_tokens == 949 * 6 and entry.samples == samples == 3200
    assert entry.epochs == pytest.approx((3200 * 128 + 1) / (949 * 6)) and entry.index_epochs == 72
    assert len(check.warnings) == 1 and prefix in check.warnings[0]
    planned = run("plan", "x", "--trainings-dir", str(trainings))
    assert planned.exit_code == 0
    assert f"  {entry.line(128)}" in planned.output.splitlines()
    assert any(line.startswith("  - warning: data.blend[0].prefix") for line in planned.output.splitlines())


def test_the_bundled_corpus_is_built_at_launch_not_refused(trainings: Path, tmp_path: Path) -> None:
    prefix = str(tmp_path / "build" / "tiny_text_document")
    exp = load_experiment(experiment(trainings, tmp_path, prefix), trainings)
    check = preflight.check_data(exp, 3200)
    assert check.errors == [] and check.entries[0].state.startswith("built at launch")
    assert run("plan", "x", "--trainings-dir", str(trainings)).exit_code == 0
    assert not (tmp_path / "build").exists()


def test_a_record_of_another_teams_run_is_shown_not_refused() -> None:
    exp = load_experiment("tr1-13B")
    check = preflight.check_data(exp, make_plan(exp).dataset_sizes[0])
    assert {type(e) for e in check.errors} == {preflight.MissingDataFile, preflight.MissingTokenizerFile}
    assert check.refusing == [] and check.refusal() is None


def test_task_begin_refuses_data_gone_since_the_launch(trainings: Path, tmp_path: Path) -> None:
    """The job script's `bsops task begin` checks the data again: a .bin removed after the launch stops the task."""
    prefix = write_indexed(tmp_path / "data" / "ok_text_document", [[5, 6, 7, 0]] * 100)
    experiment(trainings, tmp_path, prefix)
    rendered = run("render", "x", "--out", str(tmp_path / "rendered"), "--trainings-dir", str(trainings))
    assert rendered.exit_code == 0, rendered.output
    os.unlink(f"{prefix}.bin")
    begun = run("task", "begin", "--experiment", str(tmp_path / "rendered" / "experiment.json"))
    assert begun.exit_code == 1
    assert [line for line in begun.output.splitlines() if line.startswith("error:")] == [
        f"error: data.blend[0].prefix: {prefix}.bin: does not exist; an indexed dataset needs it (bsops preprocess "
        "writes PREFIX.bin and PREFIX.idx)"]
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)


def test_a_hostile_record_is_read_as_no_answer(trainings: Path, tmp_path: Path, recorded: str) -> None:
    """A record is untrusted: a largest id of the wrong type is no answer (a scan gives it), and its tokenizer
    reaches the message as one line of plain words."""
    os.unlink(f"{recorded}.dataset.json")  # the part's record is read only without the dataset's own
    path = Path(f"{recorded[:-len('_text_document')]}.preprocess.json")
    record = json.loads(path.read_text())
    record["stats"] = ["not", "stats"]
    record["settings"]["tokenizer"] = ["ab\ncd\x1b[2J" * 20]
    path.write_text(json.dumps(record))
    exp = load_experiment(experiment(trainings, tmp_path, recorded), trainings)
    check = preflight.check_data(exp, 3200)
    assert check.entries[0].max_id.source == "scan"
    assert [type(e) for e in check.errors] == [preflight.OtherTokenizer]
    assert "\n" not in str(check.errors[0]) and "\x1b" not in str(check.errors[0])


# ----------------------------------------------------------------------------- the dataset's own record

@pytest.fixture
def one_output(tmp_path: Path) -> str:
    """A dataset preprocessed with the bundled tokenizer into one output (no part record: only its own)."""
    source = tmp_path / "genesis.jsonl"
    lines = [{"text": "And God said, Let there be light: and there was light."},
             {"text": "And God saw the light, that it was good."}]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = preprocess([source], str(tmp_path / "data" / "one"), bundled_tokenizer(), ("text",))
    return result.outputs["text"]


def test_a_one_output_run_records_its_tokenizer_and_largest_id(one_output: str) -> None:
    from bigscience_ops import __version__
    from bigscience_ops.data import binding
    from bigscience_ops.data.tokenizer_cache import sha256_file

    record = json.loads(Path(f"{one_output}.dataset.json").read_text())
    tokens = np.fromfile(f"{one_output}.bin", dtype=np.uint16)
    assert record == {"format": "bsops-dataset", "version": 1, "dtype": "<u2",
                      "tokenizer": {"kind": "json", "tokenizer": [sha256_file(str(TOKENIZER))],
                                    "special_text": "plain"},
                      "documents": 2, "tokens": len(tokens), "max_id": int(tokens.max()), "bsops": __version__,
                      "binding": {"idx_sha256": sha256_file(f"{one_output}.idx"), "bin_bytes": tokens.nbytes,
                                  "bin_sha256": sha256_file(f"{one_output}.bin")}}
    assert record["binding"] == binding.compute(one_output)
    assert not list(Path(one_output).parent.glob("*.preprocess.json"))
    stale = Path(f"{one_output}.dataset.json.tmp-99999999")  # a killed run's, its process gone
    stale.write_text("{")
    again = Path(one_output).parents[1] / "genesis.jsonl"
    preprocess([again], one_output[:-len("_text_document")], bundled_tokenizer())
    assert not stale.exists() and json.loads(Path(f"{one_output}.dataset.json").read_text()) == record


def test_a_failed_rerun_keeps_the_record_of_the_dataset_it_did_not_replace(tmp_path: Path,
                                                                           one_output: str) -> None:
    from bigscience_ops.data import dataset_record
    from bigscience_ops.data.errors import BadInputError

    before = Path(f"{one_output}.dataset.json").read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "a longer first document than the others"}) + "\nnot json\n")
    with pytest.raises(BadInputError):
        preprocess([bad], one_output[:-len("_text_document")], bundled_tokenizer(), strict=True)
    assert Path(f"{one_output}.dataset.json").read_text() == before
    assert dataset_record.read(one_output)[0] is not None


def test_a_one_output_dataset_made_with_another_tokenizer_is_refused(trainings: Path, tmp_path: Path,
                                                                     one_output: str) -> None:
    other = tmp_path / "other-tokenizer.json"
    other.write_bytes(TOKENIZER.read_bytes() + b"\n")
    experiment(trainings, tmp_path, one_output, other)
    refused_by_plan_and_dry_run(trainings, tmp_path, f"{one_output}.bin", preflight.OtherTokenizer)


@pytest.mark.parametrize("spoil", ["torn", "other counts", "wrong types", "too large", "a folder"])
def test_a_record_not_of_this_dataset_is_ignored_with_a_note(trainings: Path, tmp_path: Path, one_output: str,
                                                             spoil: str) -> None:
    path = Path(f"{one_output}.dataset.json")
    record = json.loads(path.read_text())
    record["max_id"] = 3  # were it read, the id would not be the scan's
    if spoil == "torn":
        path.write_text(json.dumps(record)[:40])
    elif spoil == "other counts":
        path.write_text(json.dumps({**record, "documents": record["documents"] + 1}))
    elif spoil == "wrong types":
        path.write_text(json.dumps({**record, "tokenizer": {"kind": ["\x1b[2J"]}}))
    elif spoil == "too large":
        path.write_text(json.dumps(record) + " " * (1 << 16))
    else:
        path.unlink()
        path.mkdir()
    exp = load_experiment(experiment(trainings, tmp_path, one_output), trainings)
    check = preflight.check_data(exp, 3200)
    tokens = np.fromfile(f"{one_output}.bin", dtype=np.uint16)
    assert check.entries[0].max_id == preflight.MaxId(int(tokens.max()), "scan")
    notes = [n for n in check.notes if one_output in n]
    assert len(notes) == 2 and notes[0].startswith(f"data.blend[0].prefix: {path} ") and notes[0].endswith("; not used")
    assert "has no bsops record" in notes[1]
    assert "\x1b" not in "".join(check.notes)


# ----------------------------------------------------------------------------- a large .bin: sampled binding

def test_a_sampled_binding_is_checked_by_a_scan_once_per_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over FULL_HASH_BYTES the binding samples blocks; a change between them is caught by the scan kept per file:
    a copy (another inode) or an edit in place (another mtime) is scanned again, the same file is not."""
    from bigscience_ops.data import binding, dataset_record

    for name, value in (("FULL_HASH_BYTES", 64), ("SAMPLES", 2), ("SAMPLE_BYTES", 4)):
        monkeypatch.setattr(binding, name, value)  # sampled: the first and the last two tokens
    prefix = write_indexed(tmp_path / "big_text_document", [list(range(1, 200)), [5, 6, 7]])
    dataset_record.write(prefix, None, 199)
    record = json.loads(Path(f"{prefix}.dataset.json").read_text())
    assert set(record["binding"]) == {"idx_sha256", "bin_bytes", "bin_sampled_sha256"}
    scans = []
    real_scan = binding.scan_max_id
    monkeypatch.setattr(binding, "scan_max_id", lambda *a: scans.append(a) or real_scan(*a))
    reading = dataset_record.inspect(prefix)
    assert reading.record is not None and reading.max_id == (199, f"record {prefix}.dataset.json") and scans == []

    def spoil(path: str) -> None:  # one token between the sampled blocks, the size kept
        tokens = np.fromfile(f"{path}.bin", dtype=np.uint16)
        tokens[100] = 9000
        tokens.tofile(f"{path}.bin")

    copy = str(tmp_path / "copy_text_document")
    for ext in (".bin", ".idx", ".dataset.json", ".maxid"):
        shutil.copy2(f"{prefix}{ext}", f"{copy}{ext}")  # the record and the scan's cache copied, mtime kept
    spoil(copy)
    os.utime(f"{copy}.bin", ns=(os.stat(f"{prefix}.bin").st_atime_ns, os.stat(f"{prefix}.bin").st_mtime_ns))
    assert binding.compute(copy) == record["binding"]  # the sampled blocks do not see it
    reading = dataset_record.inspect(copy)
    assert reading.record is None and "claims max_id 199" in reading.why and "finds 9000" in reading.why
    assert len(scans) == 1
    spoil(prefix)  # in place: a later mtime
    os.utime(f"{prefix}.bin", ns=(os.stat(f"{prefix}.bin").st_atime_ns, os.stat(f"{prefix}.bin").st_mtime_ns + 10**9))
    assert dataset_record.inspect(prefix).record is None and len(scans) == 2
    assert preflight.max_token_id(prefix, np.uint16) == preflight.MaxId(9000, f"cache {preflight.cache_path(prefix)}")
    assert len(scans) == 2  # the scan was kept for this very file


def _sampled_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A dataset bound by sampled blocks (the first and the last two tokens), as a .bin over 64 MiB is."""
    from bigscience_ops.data import binding

    for name, value in (("FULL_HASH_BYTES", 64), ("SAMPLES", 2), ("SAMPLE_BYTES", 4)):
        monkeypatch.setattr(binding, name, value)
    return write_indexed(tmp_path / "big_text_document", [list(range(1, 200)), [5, 6, 7]])


def _between_the_blocks(prefix: str, value: int) -> None:
    tokens = np.fromfile(f"{prefix}.bin", dtype=np.uint16)
    tokens[100] = value
    tokens.tofile(f"{prefix}.bin")


def test_an_edit_between_the_sampled_blocks_with_the_mtime_set_back_is_scanned_again(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch
                                                                                     ) -> None:
    """The issue's: a token changed where the sampled hash does not look, the mtime restored. The cache is keyed by
    the file's ctime too, which the write and the utime both moved (and no user can set back)."""
    from bigscience_ops.data import binding

    prefix = _sampled_dataset(tmp_path, monkeypatch)
    assert preflight.max_token_id(prefix, np.uint16) == preflight.MaxId(199, "scan")
    assert preflight.max_token_id(prefix, np.uint16).source == f"cache {preflight.cache_path(prefix)}"
    before, st = binding.compute(prefix), os.stat(f"{prefix}.bin")
    after_a_ctime_tick(f"{prefix}.bin", tmp_path)
    _between_the_blocks(prefix, 9000)
    os.utime(f"{prefix}.bin", ns=(st.st_atime_ns, st.st_mtime_ns))  # inode, size, mtime as before
    assert binding.compute(prefix) == before and os.stat(f"{prefix}.bin").st_ino == st.st_ino
    assert preflight.max_token_id(prefix, np.uint16) == preflight.MaxId(9000, "scan")


def _forged(prefix: str, max_id: int, mac: str | None) -> bytes:
    """A cache beside the data for the .bin as it is now (its binding and file key computed as bsops does), claiming
    `max_id`, with `mac`."""
    from bigscience_ops.data import binding

    data = {"format": binding.CACHE_FORMAT, "key": binding._key(prefix, binding.compute(prefix)), "max_id": max_id}
    if mac is not None:
        data["mac"] = mac
    return json.dumps(data).encode()


@pytest.mark.parametrize("mac", [None, "0" * 64, "another user's key"])
def test_a_scan_cache_this_users_bsops_did_not_write_is_not_used_nor_overwritten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mac: str | None) -> None:
    """The issue's other way round the check: a matching .maxid written beside the data. Its key can be computed by
    anyone who can read the data; its HMAC only with this user's key."""
    import hashlib
    import hmac

    from bigscience_ops.data import binding

    prefix = _sampled_dataset(tmp_path, monkeypatch)
    _between_the_blocks(prefix, 9000)
    if mac == "another user's key":
        key = binding._key(prefix, binding.compute(prefix))
        text = json.dumps({"format": binding.CACHE_FORMAT, "key": key, "max_id": 199}, sort_keys=True)
        mac = hmac.new(os.urandom(32), text.encode(), hashlib.sha256).hexdigest()
    forged = _forged(prefix, 199, mac)
    preflight.cache_path(prefix).write_bytes(forged)
    assert preflight.max_token_id(prefix, np.uint16) == preflight.MaxId(9000, "scan")
    assert preflight.cache_path(prefix).read_bytes() == forged  # left as it was: the scan is kept in the user cache
    user = binding.user_cache_path(prefix)
    assert preflight.max_token_id(prefix, np.uint16) == preflight.MaxId(9000, f"cache {user}")


@pytest.mark.parametrize("spoil", ["readable by others", "a link", "too short"])
def test_without_a_key_only_this_user_holds_nothing_is_kept_or_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         spoil: str) -> None:
    from bigscience_ops.data import binding

    prefix = _sampled_dataset(tmp_path, monkeypatch)
    key = binding.user_cache_root() / binding.KEY_NAME
    binding.user_key()
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == binding.KEY_BYTES
    if spoil == "readable by others":
        key.chmod(0o644)
    elif spoil == "a link":
        other = tmp_path / "known-key"
        other.write_bytes(os.urandom(binding.KEY_BYTES))
        other.chmod(0o600)
        key.unlink()
        key.symlink_to(other)
    else:
        key.write_bytes(b"short")
    found = preflight.max_token_id(prefix, np.uint16)
    assert found.value == 199 and found.source.startswith("scan, not cached: no key for the scan cache")
    assert not preflight.cache_path(prefix).exists() and not binding.user_cache_path(prefix).exists()


def _copy(prefix: str, to: Path) -> str:
    to.mkdir()
    for ext in (".bin", ".idx", ".dataset.json"):
        shutil.copyfile(f"{prefix}{ext}", to / f"{Path(prefix).name}{ext}")
    return str(to / Path(prefix).name)


def test_a_record_reached_through_a_link_is_refused_by_plan_and_launch(trainings: Path, tmp_path: Path,
                                                                       one_output: str) -> None:
    copy = _copy(one_output, tmp_path / "copy")
    os.unlink(f"{copy}.dataset.json")
    os.symlink(f"{one_output}.dataset.json", f"{copy}.dataset.json")  # the record of the very same data
    experiment(trainings, tmp_path, copy)
    refused_by_plan_and_dry_run(trainings, tmp_path, f"{copy}.dataset.json", preflight.LinkedRecord)


def test_a_copied_record_whose_max_id_lies_is_refused_by_plan_and_launch(trainings: Path, tmp_path: Path,
                                                                         one_output: str) -> None:
    copy = _copy(one_output, tmp_path / "copy")
    tokens = np.fromfile(f"{copy}.bin", dtype=np.uint16)
    tokens[3] = 50256  # one token beyond the tiny model's 8192; the original's record kept beside it
    tokens.tofile(f"{copy}.bin")
    experiment(trainings, tmp_path, copy)
    refused_by_plan_and_dry_run(trainings, tmp_path, f"{copy}.bin", preflight.TokenIdBeyondVocab)
    [error] = json.loads(run("plan", "x", "--json", "--trainings-dir", str(trainings)).stdout)["data"]["errors"]
    assert "holds token id 50256" in error["text"] and "below 8192" in error["text"]
    assert f"{copy}.dataset.json" in error["text"]  # the record that claimed otherwise, named


# ----------------------------------------------------------------------------- bsops data verify: the whole dataset

def verified(*args: str) -> tuple[int, dict]:
    result = run("data", "verify", *args, "--json")
    return result.exit_code, json.loads(result.stdout)


def test_data_verify_reads_every_token_and_names_each_one_beyond_the_vocabulary(tmp_path: Path, trainings: Path,
                                                                                monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    """Every token, chunk by chunk (progress after each): the bad ones counted, the first named by document and
    offset; a clean dataset and its record pass. --experiment takes the bound plan and the trainer use."""
    from bigscience_ops.data import binding
    from bigscience_ops.data.verify import verify

    monkeypatch.setattr(binding, "SCAN_CHUNK", 7)  # many chunks: the bad tokens straddle their edges
    docs = [list(range(i, i + 9)) for i in range(1, 40, 9)]
    prefix = write_indexed(tmp_path / "v_text_document", docs)
    code, clean = verified(prefix, "--vocab-size", "100")
    assert code == 0 and clean["ok"] and clean["bad_tokens"] == 0 and (clean["min_id"], clean["max_id"]) == (1, 45)
    assert (clean["documents"], clean["tokens"], clean["record"]) == (5, 45, "none")
    tokens = np.fromfile(f"{prefix}.bin", dtype=np.uint16)
    tokens[[3, 17, 18, 44]] = [100, 65535, 120, 4000]  # document 0 token 3, 1:8, 2:0, 4:8
    tokens.tofile(f"{prefix}.bin")
    code, found = verified(prefix, "--vocab-size", "100")
    assert code == 1 and not found["ok"] and found["bad_tokens"] == 4 and found["limit"] == 100
    assert [(b["document"], b["offset"], b["token"]) for b in found["first_bad"]] == [
        (0, 3, 100), (1, 8, 65535), (2, 0, 120), (4, 8, 4000)]
    code, unbounded = verified(prefix)  # no vocabulary: the ids are shown, not judged
    assert code == 0 and unbounded["limit"] is None and unbounded["max_id"] == 65535
    (trainings / "x.yaml").write_text(tiny_yaml(tmp_path / "runs" / "x", ""))
    code, planned = verified(prefix, "--experiment", "x", "--trainings-dir", str(trainings))
    assert code == 1 and planned["limit"] == 8192 and planned["bad_tokens"] == 1  # tiny's 8192: only 65535
    seen = []
    verify(prefix, 100, lambda done, total: seen.append((done, total)))
    assert seen == [(min(i + 7, 45) * 2, 90) for i in range(0, 45, 7)]


def _spoil_index(prefix: str, part: str, index: int, value: int) -> None:
    from bigscience_ops.data.indexed import HEADER_SIZE, IndexedDataset

    n, m = len(IndexedDataset(prefix)), len(IndexedDataset(prefix).doc_idx)
    offset, dtype = {"sizes": (HEADER_SIZE, "<i4"), "pointers": (HEADER_SIZE + 4 * n, "<i8"),
                     "doc_idx": (HEADER_SIZE + 12 * n, "<i8")}[part]
    array = np.memmap(f"{prefix}.idx", mode="r+", dtype=dtype, offset=offset, shape=(m if part == "doc_idx" else n,))
    array[index] = value
    array.flush()
    del array


@pytest.mark.parametrize("part, index, value", [
    ("pointers", 2, 0),  # document 2 read from the start of the .bin: it overlaps document 0
    ("pointers", 1, 3),  # an odd byte offset: between two tokens
    ("sizes", 1, -5),
    ("doc_idx", 2, 0),  # the document index going back
    ("doc_idx", -1, 9),  # ending past the items
])
def test_data_verify_refuses_an_index_that_does_not_describe_its_bin(tmp_path: Path, part: str, index: int,
                                                                      value: int) -> None:
    prefix = write_indexed(tmp_path / "i_text_document", [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]])
    _spoil_index(prefix, part, index, value)
    code, found = verified(prefix, "--vocab-size", "100")
    assert code == 1 and not found["ok"] and len(found["problems"]) == 1
    assert found["problems"][0].startswith(f"{prefix}.idx") or "not a dataset" in found["problems"][0]


def test_data_verify_checks_the_record_against_what_it_read_and_needs_both_files(tmp_path: Path) -> None:
    from bigscience_ops.data import dataset_record

    prefix = write_indexed(tmp_path / "r_text_document", [[1, 2, 3], [4, 5]])
    dataset_record.write(prefix, None, 5)
    code, found = verified(prefix)
    assert code == 0 and found["record"] == "used"
    tokens = np.fromfile(f"{prefix}.bin", dtype=np.uint16)
    tokens[0] = 77
    tokens.tofile(f"{prefix}.bin")
    code, found = verified(prefix)
    assert code == 1 and found["record"] != "used" and found["problems"] == [found["record"]]
    os.unlink(f"{prefix}.idx")
    result = run("data", "verify", prefix)
    assert result.exit_code == 2 and f"{prefix}.idx" in result.stderr and result.stdout == ""
