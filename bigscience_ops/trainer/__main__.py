"""Entry point of the job script: `python -m bigscience_ops.trainer --experiment X --deepspeed-config Y`."""

from __future__ import annotations

import sys

from bigscience_ops.trainer.train import main

if __name__ == "__main__":
    sys.exit(main())
