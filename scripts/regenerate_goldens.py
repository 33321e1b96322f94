"""Rewrite the tests' golden files after an intended change; the tests only ever compare against them.

    python scripts/regenerate_goldens.py render   # tests/assets/golden/: tr1-13B's and tr8-104B's job script and
                                                  # DeepSpeed JSON (after a template or plan change; a second)
    python scripts/regenerate_goldens.py losses   # tests/assets/losses/tiny.txt: the golden run's per-step losses
                                                  # (after a change to the trainer's numbers; a real launch, ~15 s)
    python scripts/regenerate_goldens.py          # both

A test that rewrote its golden and then compared a run with it would compare the run with itself, so regenerating
is this command and never a mode of a test (issue 51). It writes through the tests' own functions
(tests/launch/test_render.py's golden_texts, tests/trainer/test_trainer_runs.py's golden_text), so the files are exactly what the
tests read; review the diff (git diff tests/assets) before committing it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHAT = ("render", "losses")


def regenerate_render(work: Path) -> list[Path]:
    from tests.launch.test_render import GOLDEN_NAMES, golden_texts

    written = []
    for name in GOLDEN_NAMES:
        for path, text in golden_texts(name, work / name).items():
            path.write_text(text)
            written.append(path)
    return written


def regenerate_losses(work: Path) -> list[Path]:
    from tests.fixtures_trainer import GOLDEN_SAVE_SCHEDULE, run_ok, scalars, small_experiment, write_run
    from tests.trainer.test_trainer_runs import GOLDEN, golden_text

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    out = work / "golden"  # the golden_run fixture's experiment (tests/fixtures_trainer.py), trained the same way
    exp = small_experiment(out, checkpoint=dict(save_schedule=GOLDEN_SAVE_SCHEDULE, save_interval=10))
    write_run(exp, out)
    run_ok(out, 2)
    losses = scalars(out / "tensorboard", "lm loss")
    if not losses:
        raise SystemExit(f"error: the golden run in {out} logged no 'lm loss' to TensorBoard: nothing written")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(golden_text(losses))
    return [GOLDEN]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("what", nargs="*", metavar="{render,losses}", help="which goldens to rewrite (default: all)")
    args = parser.parse_args(argv)
    unknown = [w for w in args.what if w not in WHAT]
    if unknown:
        parser.error(f"no golden named {unknown[0]!r}: choose from {', '.join(WHAT)}")
    sys.path.insert(0, str(REPO))
    runners = {"render": regenerate_render, "losses": regenerate_losses}
    with tempfile.TemporaryDirectory(prefix="bsops-goldens-") as folder:
        work = Path(folder)
        os.chdir(work)  # as in the tests: a bundled experiment's run folder goes under the current folder
        for what in dict.fromkeys(args.what or WHAT):
            for path in runners[what](work):
                print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
