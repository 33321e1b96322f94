"""Entry point of the job script: `python -m bigscience_ops.trainer --experiment X --deepspeed-config Y`."""

from __future__ import annotations

import sys

from bigscience_ops.trainer.stacks import serve_stack_dumps

if __name__ == "__main__":
    serve_stack_dumps()  # before torch is imported: it starts a thread, and threads inherit the signal mask
    from bigscience_ops.trainer.train import main

    sys.exit(main())
