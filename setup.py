"""Build steps: copy the bundled folders into the wheel; compile the shuffle helper.

templates/, trainings/, corpus/ and cron/ stay at the top of the source tree; a non-editable
`pip install .` gets a copy inside the package as bigscience_ops/bundled/<name>/, where
bigscience_ops/resources.py finds them.

bigscience_ops/data/_shuffle.c (numpy's RandomState.shuffle with prefetch, for the GPT dataset
index build) is compiled by `pip install .` and `pip install -e .` alike. It is optional: without a
C compiler the install still succeeds and the index build uses numpy's own, slower shuffle.
Everything else is configured in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

BUNDLED = ("templates", "trainings", "corpus", "cron")
# Outputs that live in those folders in a working checkout, never shipped.
IGNORE = shutil.ignore_patterns("build", "logs", "runners", "*.slurm", "__pycache__", ".gitignore")


class BuildPyWithBundled(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the folders from the checkout
        root = Path(__file__).resolve().parent
        for name in BUNDLED:
            dest = Path(self.build_lib) / "bigscience_ops" / "bundled" / name
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(root / name, dest, ignore=IGNORE)


SHUFFLE = Extension("bigscience_ops.data._shuffle", ["bigscience_ops/data/_shuffle.c"],
                    extra_compile_args=["-O3"], optional=True)

setup(cmdclass={"build_py": BuildPyWithBundled}, ext_modules=[SHUFFLE])
