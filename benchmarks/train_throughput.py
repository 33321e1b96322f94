"""Tokens/s of the trainer (one process, PP=1, DeepSpeed engine) against a plain PyTorch loop.

Both train the same model (tiny's shape unless overridden), on the same generated data, with the
same global and micro batch, AdamW, gradient clipping and fp32; the two are measured in
alternating rounds in one process so machine noise hits both. Prints both and their ratio.

    python benchmarks/train_throughput.py [--steps 10] [--rounds 3] [--experiment tiny]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _experiment(name: str, out: Path):
    from bigscience_ops.config import load_experiment

    exp = load_experiment(name, REPO / "trainings")
    paths = dataclasses.replace(exp.paths, output=str(out), checkpoints=str(out / "checkpoints"),
                                tensorboard=str(out / "tensorboard"), logs=str(out / "logs"))
    return dataclasses.replace(
        exp, paths=paths,
        parallel=dataclasses.replace(exp.parallel, pipeline=1, tensor=1, zero_stage=0),
        batch=dataclasses.replace(exp.batch, rampup=None),
        train=dataclasses.replace(exp.train, precision="fp32"),
        lr_schedule=dataclasses.replace(exp.lr_schedule, style="constant", warmup_samples=0),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="tiny")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per measured round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29531"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)

    import torch
    import torch.distributed as dist

    from bigscience_ops.render import deepspeed_config
    from bigscience_ops.trainer.data import step_micro_batches
    from bigscience_ops.trainer.model import GPTShape, build_sequential, lm_loss, weight_decay_groups
    from bigscience_ops.trainer.train import Trainer, init_distributed

    import tempfile

    out = Path(tempfile.mkdtemp(prefix="bsops-bench-"))
    exp = _experiment(args.experiment, out)
    init_distributed("cpu")
    trainer = Trainer(exp, deepspeed_config(exp), synthetic_data=True)
    trainer._check_layout()
    trainer._build_engine()
    trainer._build_data()

    shape = GPTShape.from_experiment(exp)
    model = build_sequential(shape, exp.train.seed)
    o = exp.optimizer
    optimizer = torch.optim.AdamW(weight_decay_groups(model, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)
    gbs, mbs = exp.batch.global_batch_size, exp.batch.micro_batch_size
    micro = gbs // mbs
    dataset = trainer.train_ds
    consumed = {"plain": 0}

    def plain_step() -> float:
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for tokens, labels in step_micro_batches(dataset, consumed["plain"], micro, mbs, 0, 1):
            loss = lm_loss(model(tokens), labels) / micro
            loss.backward()
            total += loss.item()
        if o.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_grad)
        optimizer.step()
        consumed["plain"] += gbs
        return total

    def trainer_step() -> float:
        return trainer.train_step()[0]

    tokens_per_step = gbs * exp.model.seq_length
    for step in (plain_step, trainer_step):  # warm-up
        for _ in range(2):
            step()
    times = {"plain PyTorch loop": 0.0, "bsops trainer": 0.0}
    for _ in range(args.rounds):
        for name, step in (("plain PyTorch loop", plain_step), ("bsops trainer", trainer_step)):
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[name] += time.perf_counter() - start
    steps = args.rounds * args.steps
    rates = {name: tokens_per_step * steps / seconds for name, seconds in times.items()}
    print(f"model {exp.name}: {trainer.params} parameters, GBS {gbs}, MBS {mbs}, seq {exp.model.seq_length}, "
          f"fp32, {torch.get_num_threads()} threads, {steps} steps each")
    for name, rate in rates.items():
        print(f"  {name:<20} {rate:10.0f} tokens/s")
    print(f"  ratio trainer / plain: {rates['bsops trainer'] / rates['plain PyTorch loop']:.3f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
