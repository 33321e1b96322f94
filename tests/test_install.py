"""A non-editable install works from any folder: templates/, trainings/, corpus/ and cron/ ship in the wheel.

The wheel is built from a copy of the source (no build isolation: setuptools comes from .venv) and
installed with --no-deps into a fresh venv that borrows .venv's site-packages for the dependencies
(a .pth line, so .venv's editable bsops finder is not loaded). Nothing of the checkout is on the path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and installs it into a fresh venv

REPO = Path(__file__).resolve().parents[1]
SOURCES = ["pyproject.toml", "setup.py", "README.md", "bigscience_ops", "kernels", "templates", "trainings", "corpus",
           "cron"]
SKIP = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "logs", "runners", "*.slurm")


def _run(argv: list, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict]:
    """(the fresh venv's bin folder, an environment without the checkout) after `pip install` of the wheel."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=SKIP)
        else:
            shutil.copy(path, source / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "BSOPS_TRAININGS", "BSOPS_CRON_DIR",
                                                            "BSOPS_DATA_DIR", "VIRTUAL_ENV")}
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(source)], tmp, env)
    [wheel] = (tmp / "dist").glob("bigscience_ops-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    purelib = Path(_run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        tmp, env).stdout.strip())
    (purelib / "zz_borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(pip + ["--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel)], tmp, env)
    shutil.rmtree(source)  # nothing may come from the source tree
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    return venv / "bin", env


def test_wheel_holds_the_bundled_folders(installed) -> None:
    bin_dir, env = installed
    code = ("import bigscience_ops, json; from bigscience_ops import resources; "
            "print(json.dumps([bigscience_ops.__file__] + [str(resources.bundled(n)) for n in resources.NAMES]))")
    paths = json.loads(_run([str(bin_dir / "python"), "-c", code], bin_dir, env).stdout)
    venv = str(bin_dir.parent)
    assert all(p.startswith(venv) for p in paths), paths
    assert all(not p.startswith(str(REPO)) for p in paths), paths
    bundled = Path(paths[1]).parent
    assert sorted(p.name for p in (bundled / "templates").glob("*.j2")) == sorted(
        p.name for p in (REPO / "templates").glob("*.j2"))
    assert (bundled / "trainings" / "tiny.yaml").read_bytes() == (REPO / "trainings" / "tiny.yaml").read_bytes()
    assert (bundled / "corpus" / "kjv.jsonl.xz").stat().st_size == (REPO / "corpus" / "kjv.jsonl.xz").stat().st_size
    assert (bundled / "cron" / "cron.hourly").is_dir() and not (bundled / "corpus" / "build").exists()


def test_plan_and_render_from_another_folder(installed, tmp_path: Path) -> None:
    bin_dir, env = installed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plan = json.loads(_run([str(bin_dir / "bsops"), "plan", "tiny", "--json"], elsewhere, env).stdout)
    assert plan["name"] == "tiny" and plan["train_iters"] > 0 and plan["problems"] == []
    _run([str(bin_dir / "bsops"), "render", "tiny"], elsewhere, env)
    rendered = elsewhere / "rendered" / "tiny"
    assert sorted(p.name for p in rendered.iterdir()) == ["ds_config.json", "experiment.json", "tiny.slurm"]
    experiment = json.loads((rendered / "experiment.json").read_text())
    # Outputs go under the current folder, the corpus and tokenizer come from the installed package.
    assert experiment["paths"]["output"] == str(elsewhere / "runs" / "tiny")
    assert experiment["data"]["tokenizer"]["json_file"].startswith(str(bin_dir.parent))
    assert Path(experiment["data"]["tokenizer"]["json_file"]).is_file()
