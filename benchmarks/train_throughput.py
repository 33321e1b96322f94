"""Tokens/s and MFU of the trainer (one process, PP=1, DeepSpeed engine) against a plain PyTorch loop and the same
loop under torch.compile, side by side in one run.

All three train the same model, on the same generated data, with the same global and micro batch,
AdamW (fused on CUDA), gradient clipping and precision; they are measured in alternating rounds in
one process so machine noise hits each. Prints each one's tokens/s, TFLOPs and MFU, and the trainer's
ratio to each loop.

    plain PyTorch loop   nanoGPT's: fp32 weights under bf16 autocast on CUDA, fused AdamW, eager, the
                         kernels the trainer chose (model.kernels resolved: measured per op on CUDA for auto)
    compiled plain loop  the same loop with the whole model under torch.compile (nanoGPT's `compile=True`),
                         its ops the torch references (inductor makes its own kernels)
    bsops trainer        the trainer's engine and step; --model-compile sets model.compile (blocks compiled)

Models (--model): gpt2-124m (12 x 768, 12 heads, seq 1024, vocab 50257); 760m (24 x 1536, 16 heads, seq
1024, vocab 8192: the issue's measured shape); 1.3b (24 x 2048, 16 heads, seq 2048, vocab 50257:
BigScience's 1B3); or an experiment's name (its shape). On CUDA (the default when a GPU is there) bf16,
gpt2-124m by default, MBS 16 (8 for 1.3b) and GBS 4 x MBS; on CPU tiny's shape in fp32, MFU only with
--peak-tflops. On CUDA it also prints the trainer's peak memory (torch.cuda.max_memory_allocated over its
first steps, before the loops' models exist) against the plan's memory per GPU for the same shape.

    python benchmarks/train_throughput.py [--device auto|cpu|cuda] [--model gpt2-124m|760m|1.3b|EXPERIMENT]
                                          [--steps 10] [--rounds 3] [--micro-batch-size N] [--global-batch-size N]
                                          [--kernels auto|triton|torch] [--model-compile] [--no-compile]
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

_COMMON = dict(hidden_dropout=0.0, attention_dropout=0.0)
SHAPES = {
    "gpt2-124m": dict(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=1024,
                      max_position_embeddings=1024, vocab_size=50257, ffn_hidden_size=3072, **_COMMON),
    "760m": dict(num_layers=24, hidden_size=1536, num_attention_heads=16, seq_length=1024,
                 max_position_embeddings=1024, vocab_size=8192, ffn_hidden_size=6144, **_COMMON),
    "1.3b": dict(num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=2048,
                 max_position_embeddings=2048, vocab_size=50257, ffn_hidden_size=8192, **_COMMON),
}
CUDA_MICRO_BATCH = {"1.3b": 8}  # the rest: 16
PLAIN, COMPILED, TRAINER = "plain PyTorch loop", "compiled plain loop", "bsops trainer"


def _experiment(name: str, out: Path, device: str, mbs: int | None, gbs: int | None, peak: float | None,
                kernels: str | None, model_compile: bool):
    from bigscience_ops.config.loading import load_experiment

    exp = load_experiment("tiny" if name in SHAPES else name, REPO / "trainings")
    paths = dataclasses.replace(exp.paths, output=str(out), checkpoints=str(out / "checkpoints"),
                                tensorboard=str(out / "tensorboard"), logs=str(out / "logs"))
    model = dataclasses.replace(exp.model, **SHAPES[name]) if name in SHAPES else exp.model
    model = dataclasses.replace(model, kernels=kernels or model.kernels, compile=model_compile or model.compile)
    mbs = mbs or (CUDA_MICRO_BATCH.get(name, 16) if device == "cuda" else exp.batch.micro_batch_size)
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when available")
    parser.add_argument("--model", "--experiment", dest="model", default=None,
                        help=f"{', '.join(SHAPES)}, or an experiment's shape (default: gpt2-124m on CUDA, tiny on CPU)")
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument("--global-batch-size", type=int, default=None)
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the GPU's peak for MFU")
    parser.add_argument("--kernels", choices=("auto", "triton", "torch"), default=None,
                        help="model.kernels for the trainer and the eager loop (default: the experiment's, auto)")
    parser.add_argument("--model-compile", action="store_true",
                        help="model.compile for the trainer: its transformer blocks under torch.compile")
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled plain loop")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per measured round")
    parser.add_argument("--rounds", type=int, default=3)
    return parser


def main() -> None:
    args = _parser().parse_args()

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

    from bigscience_ops import sizing
    from bigscience_ops.launch.render import deepspeed_config
    from bigscience_ops.sizing import GPTShape
    from bigscience_ops.trainer.data import MicroBatchFeed
    from bigscience_ops.trainer.model import build_sequential, lm_loss, weight_decay_groups
    from bigscience_ops.trainer.pipeline_engine import init_distributed
    from bigscience_ops.trainer.report import mfu, peak_tflops
    from bigscience_ops.trainer.train import Trainer

    out = Path(tempfile.mkdtemp(prefix="bsops-bench-"))
    name = args.model or ("gpt2-124m" if device_kind == "cuda" else "tiny")
    exp = _experiment(name, out, device_kind, args.micro_batch_size, args.global_batch_size, args.peak_tflops,
                      args.kernels, args.model_compile)
    device = init_distributed(device_kind)
    cuda = device.type == "cuda"
    trainer = Trainer(exp, deepspeed_config(exp), synthetic_data=True, device=device)
    trainer._check_layout()
    trainer._build_engine()  # resolves model.kernels (on CUDA, auto measures each op here) and prints the choice
    trainer._build_data()
    trainer._build_feeds()

    def trainer_step() -> float:
        return trainer.train_step()[0]

    trainer_peak = None
    if cuda:  # the trainer's own peak, before the loops' models take memory of their own
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(2):
            trainer_step()
        torch.cuda.synchronize(device)
        trainer_peak = torch.cuda.max_memory_allocated(device)

    shape = GPTShape.from_experiment(exp)
    o = exp.optimizer
    gbs, mbs = exp.batch.global_batch_size, exp.batch.micro_batch_size
    micro = gbs // mbs
    feed = MicroBatchFeed(trainer.train_ds, 0, mbs, 0, 1, exp.data.num_workers, device)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext

    def plain_loop(model, kernels):
        optimizer = torch.optim.AdamW(weight_decay_groups(model, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2),
                                      eps=o.eps, fused=cuda or None)

        def step() -> float:
            optimizer.zero_grad(set_to_none=True)
            total = torch.zeros((), device=device)
            for tokens, labels in feed.take(micro):
                with autocast():
                    loss = lm_loss(model(tokens), labels, kernels) / micro
                loss.backward()
                total += loss.detach()
            if o.clip_grad > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_grad)
            optimizer.step()
            return float(total)  # one host sync per step, as the trainer's
        return step

    steps = {PLAIN: plain_loop(build_sequential(shape, exp.train.seed, trainer.kernels).to(device), trainer.kernels)}
    if not args.no_compile:
        compiled = torch.compile(build_sequential(shape, exp.train.seed, "torch").to(device))
        steps[COMPILED] = plain_loop(compiled, "torch")
    steps[TRAINER] = trainer_step

    for step in steps.values():  # warm-up (the compiled loop compiles here)
        for _ in range(2):
            step()
    times = dict.fromkeys(steps, 0.0)
    for _ in range(args.rounds):
        for contestant, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            if cuda:
                torch.cuda.synchronize(device)
            times[contestant] += time.perf_counter() - start
    n = args.rounds * args.steps
    tokens_per_step = gbs * exp.model.seq_length
    rates = {contestant: tokens_per_step * n / seconds for contestant, seconds in times.items()}
    where = torch.cuda.get_device_name(device) if cuda else f"CPU, {torch.get_num_threads()} threads"
    peak = peak_tflops(exp.estimate.peak_tflops, device)
    print(f"model {name}: {trainer.params} parameters, GBS {gbs}, MBS {mbs}, seq {exp.model.seq_length}, "
          f"{exp.train.precision}, kernels {exp.model.kernels}, model.compile {exp.model.compile}, {where}, "
          f"torch {torch.__version__}, {n} steps each, peak {peak if peak is not None else 'unknown'} TFLOPs")
    print("  " + trainer.kernels.describe())
    for contestant, rate in rates.items():
        achieved = rate * trainer.flops_per_token / 1e12
        share = mfu(achieved, peak)
        print(f"  {contestant:<20} {rate:10.0f} tokens/s  {achieved:8.2f} TFLOPs  MFU "
              + (f"{100 * share:5.1f}%" if share is not None else "unknown"))
    for contestant in (PLAIN, COMPILED):
        if contestant in rates:
            print(f"  ratio trainer / {contestant}: {rates[TRAINER] / rates[contestant]:.3f}")
    if trainer_peak is not None:
        params = sizing.count_parameters(exp.model, 1, 1)
        planned = sizing.memory(exp, params, 1).total_per_stage[0]
        print(f"  trainer peak memory {trainer_peak / 2**30:.2f} GiB (torch.cuda.max_memory_allocated), plan "
              f"{planned / 2**30:.2f} GiB per GPU: plan / measured {planned / trainer_peak:.3f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
