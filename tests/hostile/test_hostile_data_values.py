"""Hostile data and values through the public CLI (issue 48): data changed where the checks do not look, values
not as typed, experiment files pointing elsewhere.

Each row sets something up in the test's folders (a dataset changed between the sampled blocks of its binding with
its mtime set back, a scan cache written by someone else, an override a comment would cut, a run folder of `/`, a
trainings folder that is not there, an experiment file that is a link to a secret) and runs one bsops command on it:
`plan`, `launch --local`, `render`, `status`, `eval`, `info` or `data verify`. Every row expects the exit code of a
refusal (or, for `data verify` and plan's data checks, of problems found), at most one `error:` line, no traceback,
no byte of a secret file in the output, and nothing written where the command must not write. Data rows bind the
.bin by sampled blocks, as a .bin over 64 MiB is (binding.FULL_HASH_BYTES patched), so that the issue's way round
the pre-flight is the one tried. The trainer's own check (a token changed after the launch's check) is one slow
test in tests/trainer/test_trainer_data.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.data import binding
from tests.fixtures_data import write_indexed, after_a_ctime_tick
from tests.fixtures_experiments import tiny_yaml

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "corpus" / "tokenizer.json"
SECRET = "the-secret-line-of-a-file-no-error-may-show"
BEYOND = 9000  # past tiny's vocabulary of 8192
DOCS = [[(i * 31 + j) % 8000 + 1 for j in range(50)] for i in range(40)]  # 2000 tokens, ids below 8192


@dataclass
class Ctx:
    """A row's folders: a trainings folder (a copy of the bundled experiments), a dataset `prefix` that experiment `x`
    reads, and where the run of `x` goes."""

    tmp: Path
    trainings: Path
    prefix: str
    patch: pytest.MonkeyPatch

    @property
    def run(self) -> Path:
        return self.tmp / "runs" / "x"

    def write(self, name: str, text: str) -> Path:
        path = self.trainings / f"{name}.yaml"
        path.write_text(text)
        return path

    def experiment(self) -> list[str]:
        """`base: tiny` experiment x on the dataset; the arguments that name it."""
        data = (f"data: {{blend: [{{prefix: {json.dumps(self.prefix)}}}], tokenizer: {{kind: json, json_file: "
                f"{json.dumps(str(TOKENIZER))}}}}}\n")
        self.write("x", tiny_yaml(self.run, data))
        return ["x", "--trainings-dir", str(self.trainings)]

    def secret(self) -> Path:
        path = self.tmp / "elsewhere" / "private.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"{SECRET}: x\n{SECRET}\nmodel: {{hidden_size: [\n")
        return path

    # --- data

    def sampled(self) -> None:
        """Bind the .bin by 2 sampled blocks of 4 bytes (its first and last two tokens), as a large .bin is."""
        for name, value in (("FULL_HASH_BYTES", 64), ("SAMPLES", 2), ("SAMPLE_BYTES", 4)):
            self.patch.setattr(binding, name, value)

    def tokens(self) -> np.ndarray:
        return np.fromfile(f"{self.prefix}.bin", dtype=np.uint16)

    def between_the_blocks(self) -> None:
        """The issue's: most tokens set beyond the vocabulary, none in a sampled block, the .bin's mtime set back."""
        st = os.stat(f"{self.prefix}.bin")
        after_a_ctime_tick(f"{self.prefix}.bin", self.tmp)
        tokens = self.tokens()
        tokens[2:-2] = BEYOND
        tokens.tofile(f"{self.prefix}.bin")
        os.utime(f"{self.prefix}.bin", ns=(st.st_atime_ns, st.st_mtime_ns))

    def forged_cache(self, secret: bytes | None) -> None:
        """A scan cache beside the data for the .bin as it is now, claiming a good largest id, signed with `secret`
        (None: not signed)."""
        key = binding._key(self.prefix, binding.compute(self.prefix))
        data = {"format": binding.CACHE_FORMAT, "key": key, "max_id": 8000}
        if secret is not None:
            text = json.dumps(data, sort_keys=True)
            data["mac"] = hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()
        binding.cache_path(self.prefix).write_text(json.dumps(data))


@dataclass(frozen=True)
class Row:
    setup: Callable[[Ctx], list[str]]  # prepares, returns the command's arguments
    code: int  # the exit code the command must give
    check: Callable[[Ctx, object], None] | None = None  # more checks on the result


# ------------------------------------------------------------------------ data changed where the checks do not look

def _planned_after_an_edit_between_the_blocks(c: Ctx) -> list[str]:
    c.sampled()
    args = c.experiment()
    assert _run(["plan", *args, "--json"]).exit_code == 0  # scanned, and the scan kept beside the data
    assert binding.cache_path(c.prefix).is_file()
    c.between_the_blocks()
    return ["plan", *args, "--json"]


def _refused_beyond(c: Ctx, result) -> None:
    data = json.loads(result.stdout)["data"]
    assert data["refused"] and [e["kind"] for e in data["errors"]] == ["TokenIdBeyondVocab"]
    assert data["entries"][0]["max_id"]["value"] == BEYOND and data["entries"][0]["max_id"]["source"].startswith("scan")


def _forged_cache(secret: Callable[[], bytes | None]) -> Callable[[Ctx], list[str]]:
    def setup(c: Ctx) -> list[str]:
        c.sampled()
        args = c.experiment()
        c.between_the_blocks()
        c.forged_cache(secret())
        return ["plan", *args, "--json"]
    return setup


def _signed_with_a_key_others_can_read(c: Ctx) -> list[str]:
    c.sampled()
    args = c.experiment()
    key = binding.user_cache_root() / binding.KEY_NAME
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_bytes(b"k" * binding.KEY_BYTES)
    key.chmod(0o644)  # a key anyone may read signs nothing
    c.between_the_blocks()
    c.forged_cache(key.read_bytes())
    return ["plan", *args, "--json"]


def _launch_after_an_edit_between_the_blocks(c: Ctx) -> list[str]:
    _planned_after_an_edit_between_the_blocks(c)
    return ["launch", "x", "--local", "--trainings-dir", str(c.trainings)]


def _nothing_launched(c: Ctx, result) -> None:
    assert not c.run.exists() and "TokenIdBeyondVocab" not in result.stderr  # refused in words, before the run


def _verify_after_an_edit_between_the_blocks(c: Ctx) -> list[str]:
    _planned_after_an_edit_between_the_blocks(c)
    return ["data", "verify", c.prefix, "--experiment", "x", "--trainings-dir", str(c.trainings), "--json"]


def _verified_bad(count: int, first: tuple[int, int] | None = None) -> Callable[[Ctx, object], None]:
    def check(c: Ctx, result) -> None:
        found = json.loads(result.stdout)
        assert not found["ok"] and found["bad_tokens"] == count and found["limit"] == 8192
        if first is not None:
            assert (found["first_bad"][0]["document"], found["first_bad"][0]["offset"]) == first
    return check


def _verify_one_token(c: Ctx) -> list[str]:
    tokens = c.tokens()
    tokens[50 * 17 + 9] = 65535  # document 17, token 9
    tokens.tofile(f"{c.prefix}.bin")
    return ["data", "verify", c.prefix, "--vocab-size", "8192", "--json"]


def _verify_overlapping_documents(c: Ctx) -> list[str]:
    from bigscience_ops.data.indexed import HEADER_SIZE

    pointers = np.memmap(f"{c.prefix}.idx", mode="r+", dtype="<i8", offset=HEADER_SIZE + 4 * 40, shape=(40,))
    pointers[5] = 0  # document 5 read from document 0's bytes
    pointers.flush()
    del pointers
    return ["data", "verify", c.prefix, "--json"]


def _verify_a_cut_bin(c: Ctx) -> list[str]:
    with open(f"{c.prefix}.bin", "r+b") as f:
        f.truncate(1000)
    return ["data", "verify", c.prefix, "--json"]


def _one_problem(c: Ctx, result) -> None:
    found = json.loads(result.stdout)
    assert not found["ok"] and len(found["problems"]) == 1 and found["bad_tokens"] == 0


def _verify_a_lying_record(c: Ctx) -> list[str]:
    from bigscience_ops.data import dataset_record

    dataset_record.write(c.prefix, None, 0)  # bound to the data, its largest id the scan's
    record = json.loads(Path(f"{c.prefix}.dataset.json").read_text())
    Path(f"{c.prefix}.dataset.json").write_text(json.dumps({**record, "max_id": 12}))
    return ["data", "verify", c.prefix, "--json"]


def _record_refuted(c: Ctx, result) -> None:
    found = json.loads(result.stdout)
    assert found["record"] != "used" and found["problems"] == [found["record"]] and "12" in found["record"]


def _verify_a_fifo(c: Ctx) -> list[str]:
    os.unlink(f"{c.prefix}.bin")
    os.mkfifo(f"{c.prefix}.bin")  # never opened, so never waited on
    return ["data", "verify", c.prefix]


# ----------------------------------------------------------------------------- values not as typed

def _override(*texts: str, command: str = "plan", local: bool = False) -> Callable[[Ctx], list[str]]:
    def setup(c: Ctx) -> list[str]:
        values = [t.format(tmp=c.tmp, home=os.path.expanduser("~")) for t in texts]
        return [command, "tiny", *(["--local"] if local else []), *values]
    return setup


def _no_run_folder(*names: str) -> Callable[[Ctx, object], None]:
    def check(c: Ctx, result) -> None:
        assert not [n for n in names if os.path.lexists(c.tmp / n)] and not Path("runs").exists()
    return check


def _missing_trainings_dir(command: str, *more: str) -> Callable[[Ctx], list[str]]:
    def setup(c: Ctx) -> list[str]:
        return [*command.split(), "tiny", *more, "--trainings-dir", str(c.tmp / "no-such-trainings")]
    return setup


def _missing_trainings_env(c: Ctx) -> list[str]:
    c.patch.setenv("BSOPS_TRAININGS", str(c.tmp / "no-such-trainings"))
    return ["plan", "tiny"]


def _record_naming_the_root(c: Ctx) -> list[str]:
    out = c.tmp / "rendered"
    assert _run(["render", "tiny", "--out", str(out)]).exit_code == 0
    record = json.loads((out / "experiment.json").read_text())
    record["paths"]["checkpoints"] = "/"  # a hand-edited or hostile record: retention would delete there
    (out / "experiment.json").write_text(json.dumps(record))
    return ["info", "--run", str(out)]


# ----------------------------------------------------------------------------- a run's files pointing elsewhere

def _experiment_link_to_a_secret(c: Ctx) -> list[str]:
    (c.trainings / "x.yaml").symlink_to(c.secret())
    return ["plan", "x", "--trainings-dir", str(c.trainings)]


def _base_link_to_a_secret(c: Ctx) -> list[str]:
    (c.trainings / "secret-base.yaml").symlink_to(c.secret())
    c.write("x", "base: secret-base\n")
    return ["plan", "x", "--trainings-dir", str(c.trainings)]


def _experiment_path_link_to_a_secret(c: Ctx) -> list[str]:
    link = c.tmp / "x.yaml"
    link.symlink_to(c.secret())
    return ["render", str(link), "--out", str(c.tmp / "out")]


def _experiment_fifo(c: Ctx) -> list[str]:
    os.mkfifo(c.trainings / "x.yaml")
    return ["plan", "x", "--trainings-dir", str(c.trainings)]


def _base_a_folder(c: Ctx) -> list[str]:
    (c.trainings / "folder-base.yaml").mkdir()
    c.write("x", "base: folder-base\n")
    return ["plan", "x", "--trainings-dir", str(c.trainings)]


def _yaml_error_on_a_secret_line(c: Ctx) -> list[str]:
    c.write("x", f"base: tiny\nmodel: {{hidden_size: [1,\n  {SECRET}: b: c\n")
    return ["plan", "x", "--trainings-dir", str(c.trainings)]


ROWS: dict[str, Row] = {
    # data changed where the check does not look
    "plan: an edit between the sampled blocks, mtime set back": Row(_planned_after_an_edit_between_the_blocks, 1,
                                                                    _refused_beyond),
    "plan: a matching .maxid beside the data, unsigned": Row(_forged_cache(lambda: None), 1, _refused_beyond),
    "plan: a matching .maxid signed with another user's key": Row(_forged_cache(lambda: os.urandom(32)), 1,
                                                                  _refused_beyond),
    "plan: a .maxid signed with a key others can read": Row(_signed_with_a_key_others_can_read, 1, _refused_beyond),
    "launch --local: an edit between the sampled blocks": Row(_launch_after_an_edit_between_the_blocks, 2,
                                                              _nothing_launched),
    "data verify: an edit between the sampled blocks": Row(_verify_after_an_edit_between_the_blocks, 1,
                                                           _verified_bad(1996, (0, 2))),
    "data verify: one token beyond the vocabulary": Row(_verify_one_token, 1, _verified_bad(1, (17, 9))),
    "data verify: overlapping documents in the .idx": Row(_verify_overlapping_documents, 1, _one_problem),
    "data verify: a .bin cut short": Row(_verify_a_cut_bin, 1, _one_problem),
    "data verify: a record whose largest id lies": Row(_verify_a_lying_record, 1, _record_refuted),
    "data verify: a FIFO as the .bin": Row(_verify_a_fifo, 2),
    # values not as typed
    "plan: ' #' in paths.output": Row(_override("paths.output={tmp}/run #2"), 2, _no_run_folder("run", "run #2")),
    "launch --local: ' #' in paths.output": Row(_override("paths.output={tmp}/run #2", command="launch", local=True),
                                               2, _no_run_folder("run", "run #2")),
    "launch --local: a comment-only value": Row(_override("paths.output= #{tmp}/run", command="launch", local=True), 2,
                                               _no_run_folder("run")),
    "launch --local: paths.output=/": Row(_override("paths.output=/", command="launch", local=True), 2,
                                          _no_run_folder()),
    "plan: paths.output is the home folder": Row(_override("paths.output='{home}'"), 2),
    "render: paths.checkpoints=/etc": Row(_override("paths.checkpoints=/etc", "--out={tmp}/out", command="render"),
                                          2, _no_run_folder("out")),
    "plan: paths.logs inside /usr": Row(_override("paths.logs=/usr/local/logs"), 2),
    "plan: paths.tensorboard climbing to /": Row(_override("paths.tensorboard=../../../../../../../../../.."), 2),
    "plan: a document marker in a value": Row(_override("description=--- x"), 2),
    "plan: a --trainings-dir that is not there": Row(_missing_trainings_dir("plan"), 2),
    "status (the hourly job): a --trainings-dir that is not there": Row(_missing_trainings_dir("status", "--no-email"),
                                                                        2),
    "eval next (the hourly job): a --trainings-dir that is not there": Row(_missing_trainings_dir("eval next"), 2),
    "plan: a $BSOPS_TRAININGS that is not there": Row(_missing_trainings_env, 2),
    "info: a run record naming / as its checkpoints": Row(_record_naming_the_root, 2),
    # a run's files pointing elsewhere
    "plan: the experiment file a link to a secret": Row(_experiment_link_to_a_secret, 2),
    "plan: its base a link to a secret": Row(_base_link_to_a_secret, 2),
    "render: an experiment path that is a link": Row(_experiment_path_link_to_a_secret, 2, _no_run_folder("out")),
    "plan: the experiment file a FIFO": Row(_experiment_fifo, 2),
    "plan: its base a folder": Row(_base_a_folder, 2),
    "plan: a YAML error on a line of the file": Row(_yaml_error_on_a_secret_line, 2),
}


def _run(args: list[str]):
    return CliRunner().invoke(main, args)


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_indexed(tmp_path_factory.mktemp("original") / "h_text_document", DOCS)


@pytest.mark.parametrize("name", list(ROWS))
def test_hostile_data_and_values(name: str, original: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = ROWS[name]
    (tmp_path / "data").mkdir()
    prefix = str(tmp_path / "data" / Path(original).name)
    for ext in (".bin", ".idx"):
        shutil.copyfile(f"{original}{ext}", f"{prefix}{ext}")
    trainings = tmp_path / "trainings"
    shutil.copytree(REPO / "trainings", trainings)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))  # no cluster is asked anything
    ctx = Ctx(tmp_path, trainings, prefix, monkeypatch)
    args = row.setup(ctx)
    result = _run(args)
    assert result.exit_code == row.code, (args, result.output[-2000:])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output and SECRET not in result.output
    assert len([line for line in result.stderr.splitlines() if line.startswith("error:")]) <= 1, result.stderr
    if row.check is not None:
        row.check(ctx, result)
