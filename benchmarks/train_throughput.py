"""Tokens/s and MFU of the trainer (one process, PP=1, DeepSpeed engine) against a plain PyTorch loop.

Both train the same model, on the same generated data, with the same global and micro batch,
AdamW (fused on CUDA), gradient clipping and precision; the two are measured in alternating rounds
in one process so machine noise hits both. Prints both, their MFU and their ratio.

On CUDA (the default when a GPU is there): GPT-2 124M (12 x 768, 12 heads, seq 1024, vocab 50257)
in bf16; the plain loop is nanoGPT's (fp32 weights under bf16 autocast, fused AdamW). On CPU:
tiny's shape in fp32, and MFU only with --peak-tflops.

    python benchmarks/train_throughput.py [--device auto|cpu|cuda] [--model gpt2-124m|experiment]
                                          [--steps 10] [--rounds 3] [--micro-batch-size N] [--global-batch-size N]
                                          [--kernels auto|triton|torch]

--kernels sets model.kernels for both (auto: the Triton kernels on CUDA, the torch references on CPU);
run it once with triton and once with torch to see what the fused kernels change in a whole step.
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


GPT2_124M = dict(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=1024, max_position_embeddings=1024,
                 vocab_size=50257, ffn_hidden_size=3072, hidden_dropout=0.0, attention_dropout=0.0)


def _experiment(name: str, out: Path, device: str, mbs: int | None, gbs: int | None, peak: float | None,
                kernels: str | None):
    from bigscience_ops.config import load_experiment

    gpt2 = name == "gpt2-124m"
    exp = load_experiment("tiny" if gpt2 else name, REPO / "trainings")
    paths = dataclasses.replace(exp.paths, output=str(out), checkpoints=str(out / "checkpoints"),
                                tensorboard=str(out / "tensorboard"), logs=str(out / "logs"))
    model = dataclasses.replace(exp.model, **GPT2_124M) if gpt2 else exp.model
    model = dataclasses.replace(model, kernels=kernels or model.kernels)
    mbs = mbs or (16 if device == "cuda" else exp.batch.micro_batch_size)
    gbs = gbs or (4 * mbs if device == "cuda" else exp.batch.global_batch_size)
    return dataclasses.replace(
        exp, paths=paths, model=model,
        parallel=dataclasses.replace(exp.parallel, pipeline=1, tensor=1, zero_stage=0),
        batch=dataclasses.replace(exp.batch, rampup=None, micro_batch_size=mbs, global_batch_size=gbs),
        train=dataclasses.replace(exp.train, precision="bf16" if device == "cuda" else "fp32"),
        lr_schedule=dataclasses.replace(exp.lr_schedule, style="constant", warmup_samples=0),
        slurm=dataclasses.replace(exp.slurm, device="gpu" if device == "cuda" else "cpu", nodes=1, gpus_per_node=1),
        estimate=dataclasses.replace(exp.estimate, peak_tflops=peak),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when available")
    parser.add_argument("--model", "--experiment", dest="model", default=None,
                        help="gpt2-124m, or an experiment's shape (default: gpt2-124m on CUDA, tiny on CPU)")
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument("--global-batch-size", type=int, default=None)
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the GPU's peak for MFU")
    parser.add_argument("--kernels", choices=("auto", "triton", "torch"), default=None,
                        help="model.kernels for both loops (default: the experiment's, auto)")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per measured round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch

    device_kind = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device_kind == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29531"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)

    import contextlib
    import tempfile

    import torch.distributed as dist

    from bigscience_ops.render import deepspeed_config
    from bigscience_ops.sizing import GPTShape
    from bigscience_ops.trainer.data import MicroBatchFeed
    from bigscience_ops.trainer.model import build_sequential, lm_loss, weight_decay_groups
    from bigscience_ops.trainer.report import mfu, peak_tflops
    from bigscience_ops.trainer.pipeline_engine import init_distributed
    from bigscience_ops.trainer.train import Trainer

    out = Path(tempfile.mkdtemp(prefix="bsops-bench-"))
    exp = _experiment(args.model or ("gpt2-124m" if device_kind == "cuda" else "tiny"), out, device_kind,
                      args.micro_batch_size, args.global_batch_size, args.peak_tflops, args.kernels)
    device = init_distributed(device_kind)
    trainer = Trainer(exp, deepspeed_config(exp), synthetic_data=True, device=device)
    trainer._check_layout()
    trainer._build_engine()
    trainer._build_data()
    trainer._build_feeds()

    shape = GPTShape.from_experiment(exp)
    model = build_sequential(shape, exp.train.seed, exp.model.kernels).to(device)
    o = exp.optimizer
    cuda = device.type == "cuda"
    optimizer = torch.optim.AdamW(weight_decay_groups(model, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2),
                                  eps=o.eps, fused=cuda or None)
    gbs, mbs = exp.batch.global_batch_size, exp.batch.micro_batch_size
    micro = gbs // mbs
    feed = MicroBatchFeed(trainer.train_ds, 0, mbs, 0, 1, exp.data.num_workers, device)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext

    def plain_step() -> float:
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for tokens, labels in feed.take(micro):
            with autocast():
                loss = lm_loss(model(tokens), labels) / micro
            loss.backward()
            total += loss.detach()
        if o.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_grad)
        optimizer.step()
        return float(total)  # one host sync per step, as the trainer's

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
    where = torch.cuda.get_device_name(device) if cuda else f"CPU, {torch.get_num_threads()} threads"
    peak = peak_tflops(exp.estimate.peak_tflops, device)
    print(f"model {args.model or ('gpt2-124m' if cuda else exp.name)}: {trainer.params} parameters, GBS {gbs}, "
          f"MBS {mbs}, seq {exp.model.seq_length}, {exp.train.precision}, kernels {exp.model.kernels}, {where}, "
          f"{steps} steps each, "
          f"peak {peak if peak is not None else 'unknown'} TFLOPs")
    for name, rate in rates.items():
        achieved = rate * trainer.flops_per_token / 1e12
        share = mfu(achieved, peak)
        print(f"  {name:<20} {rate:10.0f} tokens/s  {achieved:8.2f} TFLOPs  MFU "
              + (f"{100 * share:5.1f}%" if share is not None else "unknown"))
    print(f"  ratio trainer / plain: {rates['bsops trainer'] / rates['plain PyTorch loop']:.3f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
