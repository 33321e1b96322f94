"""No CPU tensor reaches a collective: NCCL's rule, checked on CPU (tests/fixtures_collectives.py explains how).

The checker is first shown to catch the bug class (the patterns `any_rank` (stopping.py) and `params_norm`
once had), then a TP=2 x PP=2 run with validation, params norm, saves and the kill-switch/signal checks
runs under it in every rank: every tensor the project hands to a collective must have been made on
(or moved to) the engine's device.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.fixtures_collectives import ENV, CollectiveDeviceError, install
from tests.fixtures_trainer import ranks, small_experiment, write_run

CPU = torch.device("cpu")
CHECKED_TRAINER = ("from tests.fixtures_collectives import install_from_env; install_from_env(); import runpy; "
                   "runpy.run_module('bigscience_ops.trainer', run_name='__main__', alter_sys=True)")
"""A rank of `python -m bigscience_ops.trainer ARGS` under the checker (BSOPS_COLLECTIVE_CHECK names its reports)."""


@pytest.fixture()
def checker(single_rank_group):
    c = install([__file__], CPU)
    yield c
    c.uninstall()


def test_checker_catches_tensors_made_without_the_engine_device(checker):
    with pytest.raises(CollectiveDeviceError):  # the old _any_rank
        dist.all_reduce(torch.tensor([1, 0], dtype=torch.int64), op=dist.ReduceOp.MAX)
    total = torch.zeros(1, dtype=torch.float64)  # the old params_norm: accumulated in place, then reduced
    total += torch.ones(3, dtype=torch.float64).pow(2).sum()
    with pytest.raises(CollectiveDeviceError):
        dist.all_reduce(total)
    with pytest.raises(CollectiveDeviceError):  # derived from a host-born tensor
        dist.broadcast(torch.arange(4) * 2, src=0)
    with pytest.raises(CollectiveDeviceError):  # moved back to the host
        dist.all_reduce(torch.ones(2, device=CPU).cpu())
    assert len(checker.violations) == 4


def test_checker_passes_tensors_on_the_engine_device(checker):
    t = torch.tensor([1, 0], dtype=torch.int64, device=CPU)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    moved = torch.zeros(2).to(CPU)
    moved += 1
    dist.all_reduce(moved)
    assert not checker.violations and sum(checker.checked.values()) == 2


@pytest.mark.slow
def test_tp2_pp2_run_hands_collectives_only_engine_device_tensors(tmp_path: Path):
    reports = tmp_path / "reports"
    reports.mkdir()
    out = tmp_path / "run"
    exp = small_experiment(out, parallel=dict(tensor=2, pipeline=2, zero_stage=0),
                           train=dict(samples=40), batch=dict(rampup=None),
                           logging=dict(log_interval=2, eval_interval=2, eval_iters=1),
                           checkpoint=dict(save_interval=3, exit_interval=4))
    write_run(exp, out)
    # Each rank installs the checker (as SITECUSTOMIZE does in a fresh interpreter) before it imports the project,
    # then runs the trainer: `python -c` from the repository, so that the ranks are forks of the rank server.
    trainer = ["--experiment", str(out / "experiment.json"), "--deepspeed-config", str(out / "ds_config.json"),
               "--synthetic-data"]
    proc = ranks(["-c", CHECKED_TRAINER, *trainer], 4, env={ENV: str(reports)})
    assert proc.returncode == 0, f"trainer exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert "exit interval 4 reached" in proc.stdout
    assert not list(reports.glob("violations-*.jsonl")), [p.read_text() for p in reports.glob("violations-*")]
    checked: dict[str, int] = {}
    for path in reports.glob("checked-*.json"):
        for caller, n in json.loads(path.read_text()).items():
            checked[caller] = checked.get(caller, 0) + n
    assert len(list(reports.glob("checked-*.json"))) == 4  # every rank ran under the checker
    by_file = {Path(k).name: v for k, v in checked.items()}
    # the trainer's own collectives (stopping.py: kill switch/signal flags, 5 checks; train.py: params norm at
    # iterations 2 and 4) and the TP layers' were all checked
    assert by_file.get("stopping.py", 0) >= 4 * 5, by_file
    assert by_file.get("train.py", 0) >= 4 * 2, by_file
    assert by_file.get("tensor_parallel.py", 0) > 0, by_file
