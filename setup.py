"""Build steps: copy the bundled folders into the wheel; compile the shuffle helper.

templates/, trainings/ and corpus/ stay at the top of the source tree; a non-editable
`pip install .` gets a copy inside the package as bigscience_ops/bundled/<name>/, where
bigscience_ops/resources.py finds them.

bigscience_ops/data/_shuffle.c (numpy's RandomState.shuffle with prefetch, for the GPT dataset
index build) is compiled by `pip install .` and `pip install -e .` alike. It is optional: without a
C compiler the install still succeeds and the index build uses numpy's own, slower shuffle.

Both installs also put bigscience_ops_lm_eval.pth at the root of site-packages: the one line that makes lm-eval's
own `lm_eval --model bsops` find bsops' model (bigscience_ops/ops/evaluate/lm_eval_hook.py says how, and why a .pth:
lm-eval 0.4.13 has no plugin entry point). pip records it, so uninstalling removes it.

Everything else is configured in pyproject.toml.
"""

import runpy
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

BUNDLED = ("templates", "trainings", "corpus")
# Outputs that live in those folders in a working checkout, never shipped.
IGNORE = shutil.ignore_patterns("build", "logs", "runners", "*.slurm", "__pycache__", ".gitignore")
HOOK = Path("bigscience_ops", "ops", "evaluate", "lm_eval_hook.py")


class BuildPyWithBundled(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent
        hook = runpy.run_path(str(root / HOOK))  # standard library only: nothing of the package is imported
        if getattr(self, "editable_mode", False):
            # an editable install reads the folders from the checkout; its wheel's root is the install command's
            # install_lib (setuptools' editable_wheel writes the files it does not link there)
            lib = Path(self.get_finalized_command("install").install_lib)
            (lib / hook["PTH_NAME"]).write_text(hook["PTH_LINE"], encoding="utf-8")
            return
        (Path(self.build_lib) / hook["PTH_NAME"]).write_text(hook["PTH_LINE"], encoding="utf-8")
        for name in BUNDLED:
            dest = Path(self.build_lib) / "bigscience_ops" / "bundled" / name
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(root / name, dest, ignore=IGNORE)


SHUFFLE = Extension("bigscience_ops.data._shuffle", ["bigscience_ops/data/_shuffle.c"],
                    extra_compile_args=["-O3"], optional=True)

setup(cmdclass={"build_py": BuildPyWithBundled}, ext_modules=[SHUFFLE])
