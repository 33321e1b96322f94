"""Build step: copy the bundled folders into the wheel as bigscience_ops/bundled/<name>/.

templates/, trainings/, corpus/ and cron/ stay at the top of the source tree; a non-editable
`pip install .` gets a copy inside the package, where bigscience_ops/resources.py finds them.
Everything else is configured in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
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


setup(cmdclass={"build_py": BuildPyWithBundled})
