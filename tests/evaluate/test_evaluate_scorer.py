"""The evaluation ranks (ops/evaluate/scorer.py, worker.py, launcher.py) on the session's golden run (PP=2).

One checkpoint scored by real ranks in its own layout (PP=2), in TP=2 (the TP shards cut from the merged
layers) and in TP=2 x PP=2: the log-prob sums agree within 1e-5 relative, the greedy flags and next tokens
are the same, and they equal transformers' GPT2LMHeadModel loaded from the `bsops convert` weights of that
checkpoint (within 1e-4 relative). The ranks run worker.main with a stand-in for driver.evaluate that scores
fixed token sequences. A torn, missing or not-yet-complete checkpoint is refused with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from bigscience_ops.checkpoints import layout
from bigscience_ops.ops.evaluate import EvalError, launcher
from tests.fixtures_runs import commit_checkpoint
from tests.fixtures_trainer import concurrently, ranks

BY_DRIVER = """
import json, sys
from bigscience_ops.ops.evaluate import worker
items_file, out_file = sys.argv[1], sys.argv[2]

def evaluate(exp, checkpoint, meta, scorer, log):
    items = json.loads(open(items_file).read())
    result = {"score": scorer.score([tuple(i) for i in items["score"]]), "next": scorer.next_tokens(items["next"]),
              "layout": scorer.layout, "max_length": scorer.max_length, "vocab_size": scorer.vocab_size}
    open(out_file, "w").write(json.dumps(result))
    return out_file

sys.exit(worker.main(sys.argv[3:], evaluate=evaluate))
"""


def _items(vocab: int, seq: int) -> dict:
    """Token sequences of several lengths (the longest max_length + 1), more than one batch of 8."""
    import random

    rng = random.Random(5)
    score = []
    for total in (seq + 1, 3, 17, 9, seq, 2, 25, 12, 30, 5, seq + 1):
        tokens = [rng.randrange(vocab) for _ in range(total)]
        cut = rng.randrange(1, total)
        score.append((tokens[:cut], tokens[cut:]))
    score.append(([7], []))  # an empty continuation: (0.0, True) without the model
    nxt = [[rng.randrange(vocab) for _ in range(n)] for n in (1, 6, seq)]
    return {"score": score, "next": nxt}


def _worker(out: Path, step: int, items: Path, result: Path, nproc: int, *extra: str):
    args = ["-c", BY_DRIVER, str(items), str(result), "--experiment", str(out / "experiment.json"),
            "--step", str(step), *extra]
    return ranks(args, nproc, timeout=120)


def _copy(golden_run, folder: Path, **trained_model) -> tuple:
    """The golden run's latest checkpoint (and `latest`) copied into `folder`/checkpoints, with `trained_model`
    written into its bsops.json's experiment.model; the experiment pointing there, also as `folder`/experiment.json."""
    import dataclasses

    from bigscience_ops.config.loading import to_dict

    exp, out, _ = golden_run
    step = layout.latest_step(out / "checkpoints")
    checkpoints = folder / "checkpoints"
    shutil.copytree(out / "checkpoints" / f"global_step{step}", checkpoints / f"global_step{step}")
    shutil.copy(out / "checkpoints" / "latest", checkpoints / "latest")
    if trained_model:
        meta_file = checkpoints / f"global_step{step}" / layout.META
        meta = json.loads(meta_file.read_text())
        meta["experiment"]["model"].update(trained_model)
        meta_file.write_text(json.dumps(meta))
        commit_checkpoint(meta_file.parent)  # as if the trainer had written it so
    exp = dataclasses.replace(exp, paths=dataclasses.replace(exp.paths, checkpoints=str(checkpoints)))
    (folder / "experiment.json").write_text(json.dumps(to_dict(exp)))
    return exp, checkpoints, step


REAL_VOCAB = 250
"""The golden model's 256 rows read as 250 real tokens padded to 256 (make_vocab_size_divisible_by 256: 256 rows
with TP=1 as trained, 512 with TP=2, the second TP rank's half all padding): padded rows must never score."""


@pytest.fixture(scope="module")
def scored(golden_run, tmp_path_factory) -> dict:
    """layout name -> what the ranks returned for the golden run's latest checkpoint (vocabulary padded as
    REAL_VOCAB says); and the items, step and checkpoint folder."""
    folder = tmp_path_factory.mktemp("scored")
    exp, checkpoints, step = _copy(golden_run, folder, vocab_size=REAL_VOCAB, make_vocab_size_divisible_by=256)
    items = _items(REAL_VOCAB, exp.model.seq_length)
    (folder / "items.json").write_text(json.dumps(items))
    layouts = {"pp2": (2, ()), "tp2": (2, ("--tensor", "2", "--pipeline", "1")),
               "tp2pp2": (4, ("--tensor", "2", "--pipeline", "2"))}

    def job(name: str):
        nproc, extra = layouts[name]
        proc = _worker(folder, step, folder / "items.json", folder / f"{name}.json", nproc, *extra)
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return json.loads((folder / f"{name}.json").read_text())

    found = concurrently({name: (lambda n=name: job(n)) for name in ("tp2pp2", "pp2", "tp2")})
    return {"exp": exp, "step": step, "items": items, "checkpoint": checkpoints / f"global_step{step}", **found}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


@pytest.mark.slow  # the session's golden run (a trainer launch) and its checkpoint
def test_layouts_agree(scored):
    assert scored["pp2"]["layout"] == {"tensor": 1, "pipeline": 2}
    assert scored["tp2"]["layout"] == {"tensor": 2, "pipeline": 1}
    assert scored["pp2"]["vocab_size"] == REAL_VOCAB and scored["pp2"]["max_length"] == 32
    assert all(0 <= t < REAL_VOCAB for t in scored["pp2"]["next"])  # never a padding row
    base = scored["pp2"]["score"]
    assert len(base) == len(scored["items"]["score"])
    assert base[-1] == [0.0, True]
    assert all(s < 0 for s, _ in base[:-1])
    for name in ("tp2", "tp2pp2"):
        other = scored[name]["score"]
        worst = max(_rel(a, b) for (a, _), (b, _) in zip(base, other))
        print(f"max relative difference {name} vs pp2: {worst:.2e}")
        assert worst < 1e-5
        assert [g for _, g in other] == [g for _, g in base]
        assert scored[name]["next"] == scored["pp2"]["next"]


@pytest.fixture
def environment_kept():
    """os.environ as it was before the test: running the model or importing transformers here sets
    TORCHINDUCTOR_CACHE_DIR, and with it changed fixtures_trainer.ranks starts every later launch of this worker
    as fresh interpreters instead of forks (seconds each)."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.mark.slow  # the session's golden run (a trainer launch) and its checkpoint
def test_one_rank_in_process(scored, single_rank_group, environment_kept):
    """TP=1 x PP=1 in this process: one stage holds both ends, the tied head is the embedding itself."""
    from bigscience_ops.ops.evaluate.scorer import Scorer

    scorer = Scorer(scored["exp"], launcher.checkpoint(scored["exp"], scored["step"], tensor=1, pipeline=1))
    assert scorer.head is scorer.layers[0][1]
    mine = scorer.score([tuple(i) for i in scored["items"]["score"]])
    assert max(_rel(a, b) for (a, _), (b, _) in zip(mine, scored["pp2"]["score"])) < 1e-5
    assert [g for _, g in mine] == [g for _, g in scored["pp2"]["score"]]
    assert scorer.next_tokens(scored["items"]["next"]) == scored["pp2"]["next"]
    with pytest.raises(EvalError, match="allowed: whole numbers 0 to 249"):
        scorer.score([([1, 2], [REAL_VOCAB])])
    with pytest.raises(EvalError, match="allowed: at most max_length"):
        scorer.score([([1] * 30, [2] * 4)])
    scorer.close()


@pytest.mark.slow  # the session's golden run (a trainer launch) and its checkpoint
def test_scores_equal_the_converted_model(scored, tmp_path, environment_kept):
    """transformers' GPT-2 on the weights `bsops convert` writes (padding rows removed) gives the same sums, greedy
    flags and next tokens."""
    import torch
    from transformers import GPT2LMHeadModel

    from bigscience_ops.checkpoints import convert

    tag, path, meta = convert.select_checkpoint(scored["checkpoint"].parent, scored["step"])
    config = convert.gpt2_config(meta["model"], REAL_VOCAB, None)
    convert.write_weights(convert.gpt2_tensors(path, meta["model"], meta["parallel"]["tensor"], REAL_VOCAB), tmp_path,
                          convert.parse_size(convert.MAX_SHARD_SIZE))
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert model.config.vocab_size == REAL_VOCAB
    worst = 0.0
    with torch.no_grad():
        for (context, continuation), (mine, greedy) in zip(scored["items"]["score"], scored["pp2"]["score"]):
            if not continuation:
                continue
            whole = torch.tensor([context + continuation])
            logp = torch.log_softmax(model(whole[:, :-1]).logits.double(), dim=-1)[0]
            positions = range(len(context) - 1, whole.shape[1] - 1)
            targets = whole[0, 1:]
            total = sum(float(logp[p, targets[p]]) for p in positions)
            worst = max(worst, _rel(total, mine))
            assert all(int(logp[p].argmax()) == int(targets[p]) for p in positions) == greedy
        nxt = [int(model(torch.tensor([c])).logits[0, -1].argmax()) for c in scored["items"]["next"]]
    print(f"max relative difference pp2 vs transformers: {worst:.2e}")
    assert worst < 1e-4
    assert nxt == scored["pp2"]["next"]


@pytest.fixture
def copied(golden_run, tmp_path):
    """An experiment whose checkpoints folder is a copy of the golden run's latest checkpoint (and `latest`)."""
    return _copy(golden_run, tmp_path)


@pytest.mark.slow  # the session's golden run (a trainer launch) and its checkpoint
def test_refuses_what_is_not_a_complete_checkpoint(copied):
    exp, checkpoints, step = copied
    target = launcher.checkpoint(exp, step)
    assert (target.tensor, target.pipeline, target.world_size) == (1, 2, 2)
    assert launcher.checkpoint(exp, step, tensor=2, pipeline=1).world_size == 2
    with pytest.raises(EvalError, match="allowed: 1, 2, 4"):
        launcher.checkpoint(exp, step, tensor=3)
    newer = checkpoints / f"global_step{step + 5}"
    shutil.copytree(checkpoints / f"global_step{step}", newer)  # a copy under another tag: its manifest says so
    with pytest.raises(EvalError, match=f"global_step{step + 5}: not a complete checkpoint .*names 'global_step{step}'"):
        launcher.checkpoint(exp, step + 5)
    (newer / "manifest.json").unlink()  # a save in progress
    with pytest.raises(EvalError, match="no committed manifest: a save in progress"):
        launcher.checkpoint(exp, step + 5)
    with pytest.raises(EvalError, match="no checkpoint global_step3;"):
        launcher.checkpoint(exp, 3)
    file = launcher.layer_file(checkpoints / f"global_step{step}", 1, 1, 0)
    file.write_bytes(file.read_bytes()[:1000])  # cut short
    with pytest.raises(EvalError, match="layer_01-model_states.pt: is 1000 bytes, its manifest says") as info:
        launcher.checkpoint(exp, step)
    assert "\n" not in str(info.value)
    file.unlink()
    with pytest.raises(EvalError, match="layer_01-model_states.pt: missing"):
        launcher.checkpoint(exp, step)
    (checkpoints / f"global_step{step}" / layout.META).unlink()
    with pytest.raises(EvalError, match="bsops.json: missing"):
        launcher.checkpoint(exp, step)


def _foreign_zip(file: Path) -> None:
    """A zip file torch cannot load: passes the launcher's check, fails in the rank that reads it."""
    file.unlink()
    with zipfile.ZipFile(file, "w") as archive:
        archive.writestr("archive/data.pkl", b"not a pickle")


@pytest.mark.slow  # the session's golden run (a trainer launch) and its checkpoint
def test_a_rank_that_cannot_load_ends_every_rank_with_one_line(copied, tmp_path):
    """The stage-1 rank fails to read its layer (a file its manifest lists as saved: the manifest cannot tell); rank 0
    says so in one line and both exit 2 at once. A folder that is not a complete checkpoint is refused by every
    rank before the process group forms, rank 0 saying why."""
    exp, checkpoints, step = copied
    _foreign_zip(launcher.layer_file(checkpoints / f"global_step{step}", exp.model.num_layers, 1, 0))
    commit_checkpoint(checkpoints / f"global_step{step}")
    proc = _worker(tmp_path, step, tmp_path / "none.json", tmp_path / "none-out.json", 2)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"layer_{exp.model.num_layers:02d}-model_states.pt" in errors[0], proc.stderr
    assert not (tmp_path / "none-out.json").exists()
    shutil.copytree(checkpoints / f"global_step{step}", checkpoints / f"global_step{step + 5}")
    (checkpoints / f"global_step{step + 5}" / "manifest.json").unlink()  # a save under way
    proc = _worker(tmp_path, step + 5, tmp_path / "none.json", tmp_path / "none-out.json", 2)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "a save in progress" in errors[0], proc.stderr


def test_worker_argv_and_torchrun_argv():
    worker = launcher.worker_argv("tiny", 20, 2, None, "/t", "/c")
    assert worker == ["-m", launcher.WORKER_MODULE, "--experiment", "tiny", "--step", "20", "--trainings-dir", "/t",
                      "--tensor", "2", "--cwd", "/c"]
    argv = launcher.torchrun_argv(4, worker)
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in argv and argv[argv.index("--module") + 1] == launcher.WORKER_MODULE


AGENT_REPORT = """\
error: /c/global_step28/layer_01-model_states.pt: unreadable (RuntimeError: no version); the checkpoint is torn
W1127 08:22:28.626000 29777 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 29861 closing signal
E1127 08:22:28.628000 29777 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) local_rank: 0
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
bigscience_ops.ops.evaluate.worker FAILED
============================================================
"""
RANK_TRACEBACK = """\
Traceback (most recent call last):
  File "/repo/bigscience_ops/ops/evaluate/worker.py", line 120, in run
    path = evaluate(exp, target.path, target.meta, built, _log)
ValueError: boom
"""


def test_torchruns_own_report_is_left_out():
    import io

    for text, kept, errors in ((AGENT_REPORT, AGENT_REPORT.splitlines(True)[0], 1),
                               (RANK_TRACEBACK + AGENT_REPORT, RANK_TRACEBACK + AGENT_REPORT.splitlines(True)[0], 1),
                               (RANK_TRACEBACK, RANK_TRACEBACK, 0)):
        out = io.StringIO()
        noise = launcher.AgentNoise(out)
        noise.pump(io.StringIO(text))
        assert (out.getvalue(), noise.errors) == (kept, errors)


def test_the_ranks_stdout_joins_their_stderr_when_stdout_is_json(tmp_path, capfd):
    """`bsops eval run --json` (run_local's ranks_stdout_to_stderr): the ranks' lines go into the stderr pipe that
    AgentNoise passes through to stderr, so stdout holds the command's JSON alone; without it, stdout is theirs."""
    argv = (sys.executable, "-c", "import sys; print('progress', flush=True); print('error: x', file=sys.stderr)")
    for joined, piped, own in ((True, {"progress", "error: x"}, ""), (False, {"error: x"}, "progress\n")):
        job = launcher.LocalRanks(dict(os.environ), joined).start(launcher.Ranks("t", argv), tmp_path)
        assert set(launcher.LocalRanks.piped(job.proc).read().splitlines()) == piped
        assert job.proc.wait() == 0 and capfd.readouterr().out == own


@pytest.mark.slow
def test_run_local_under_torchrun(copied, tmp_path, capfd):
    """`bsops eval`'s launch: torchrun starts both ranks, the torn layer ends them with exit 2 (no hang)."""
    exp, checkpoints, step = copied
    _foreign_zip(launcher.layer_file(checkpoints / f"global_step{step}", 1, 1, 0))
    commit_checkpoint(checkpoints / f"global_step{step}")  # torn as saved: the manifest cannot tell, the ranks must
    assert launcher.run_local(exp, step) == launcher.EXIT_ERROR
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and "layer_01-model_states.pt" in err[0], err
    with pytest.raises(EvalError, match="no checkpoint global_step"):
        launcher.run_local(exp, step + 1)
