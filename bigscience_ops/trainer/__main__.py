"""Entry point of the job script: `python -m bigscience_ops.trainer --experiment X --deepspeed-config Y`."""

from __future__ import annotations

import gc
import sys

from bigscience_ops.trainer.stacks import serve_stack_dumps


def start() -> int:
    """Import the trainer with the cyclic garbage collector off, then freeze what the imports made, and train.

    torch, DeepSpeed and torch._dynamo make about a million objects that live as long as the rank. Collections
    during the imports walk them again and again (a fifth of the imports' time), and every later full collection
    would walk them once more: DeepSpeed's bf16 optimizer forces six while it is built, about 0.2 s each on rank 0.
    Frozen (gc.freeze), they are left out of every collection; objects made after are collected as usual.
    """
    gc.disable()
    try:
        from bigscience_ops.trainer.train import main
    finally:
        gc.freeze()
        gc.enable()
    return main()


if __name__ == "__main__":
    serve_stack_dumps()  # before torch is imported: it starts a thread, and threads inherit the signal mask
    sys.exit(start())
