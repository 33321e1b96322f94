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
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and installs it into a fresh venv

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["pyproject.toml", "setup.py", "README.md", "bigscience_ops", "templates", "trainings", "corpus"]
SKIP = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "logs", "runners", "*.slurm", "*.so")


def copy_source(into: Path) -> Path:
    """The files a `pip install` of the checkout reads, copied into `into/source` (no build output, no run files)."""
    source = into / "source"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=SKIP)
        else:
            shutil.copy(path, source / name)
    return source


def _run(argv: list, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict]:
    """(the fresh venv's bin folder, an environment without the checkout) after `pip install` of the wheel."""
    tmp = tmp_path_factory.mktemp("install")
    source = copy_source(tmp)
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
    _run(pip + ["--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel),
                str(_other_kernels_wheel(tmp, pip, env))], tmp, env)
    shutil.rmtree(source)  # nothing may come from the source tree
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    return venv / "bin", env


def _other_kernels_wheel(tmp: Path, pip: list, env: dict) -> Path:
    """A wheel of another project's top-level package `kernels` (on the package index that name is Hugging Face's
    kernel hub, which transformers looks for), installed beside bsops as a user may have it."""
    source = tmp / "other-kernels"
    (source / "kernels").mkdir(parents=True)
    (source / "kernels" / "__init__.py").write_text('OWNER = "the other project"\n')
    (source / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                                           '"setuptools.build_meta"\n[project]\nname = "kernels"\nversion = "9.9"\n'
                                           '[tool.setuptools]\npackages = ["kernels"]\n')
    _run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "other-dist"), str(source)], tmp, env)
    [wheel] = (tmp / "other-dist").glob("kernels-*.whl")
    return wheel


def test_the_fused_kernels_live_in_bsops_namespace_beside_another_kernels_package(installed) -> None:
    """bsops' wheel holds no top-level `kernels`: a distribution of that name installed beside it keeps its
    `import kernels`, and the trainer's model still finds bsops' own kernels."""
    bin_dir, env = installed
    code = ("import json, kernels, torch, bigscience_ops.trainer.model as model; "
            "from bigscience_ops.kernels.layernorm import layer_norm_reference; "
            "x, w, b = torch.randn(3, 8), torch.ones(8), torch.zeros(8); "
            "same = torch.equal(model.fused.layer_norm(x, w, b, 1e-5), layer_norm_reference(x, w, b, 1e-5)); "
            "print(json.dumps([kernels.OWNER, kernels.__file__, model.fused.__name__, same]))")
    owner, path, fused, same = json.loads(_run([str(bin_dir / "python"), "-c", code], bin_dir, env).stdout)
    assert owner == "the other project" and path.startswith(str(bin_dir.parent)), path
    assert fused == "bigscience_ops.kernels" and same
    [record] = bin_dir.parent.glob("lib/python*/site-packages/bigscience_ops-*.dist-info/RECORD")
    tops = {line.split("/", 1)[0] for line in record.read_text().splitlines() if "/" in line}
    assert "kernels" not in tops and "bigscience_ops" in tops, sorted(tops)


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
    assert not (bundled / "cron").exists() and not (bundled / "corpus" / "build").exists()


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


def _bsops(bin_dir: Path, cwd: Path, env: dict, *args: str, code: int = 0) -> subprocess.CompletedProcess:
    result = subprocess.run([str(bin_dir / "bsops"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == code, f"bsops {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result


def test_everyday_use_in_a_fresh_folder_with_and_without_slurm(installed, tmp_path: Path, slurm_cluster) -> None:
    """docs/OPERATOR.md's "Everyday use" walked as a new user would, in a folder of their own against the wheel: the
    bundled experiments stay reachable after `bsops new`, the new file's blanks are a to-do render refuses,
    a dry run and the on-call check work without Slurm (one line naming SLURM_CONF, at once) and with it,
    every run command names its run folder, cron jobs go to the user's folder, info reads the run."""
    bin_dir, env = installed
    here = tmp_path / "work"
    here.mkdir()
    env = {**env, "HOME": str(tmp_path / "home"), "SLURM_CONF": str(tmp_path / "no-slurm.conf")}
    env.pop("XDG_DATA_HOME", None)
    venv = str(bin_dir.parent)
    tiny_folder = f"run folder: {here}/runs/tiny (tiny is bundled with bsops: its runs go under the current folder)"

    new = _bsops(bin_dir, here, env, "new", "myrun", "--base", "tr1-13B")
    assert [line.split(":")[0].strip() for line in new.stdout.splitlines()[2:]] == [
        "data.blend", "data.tokenizer", "slurm.env_setup", "alerts.email_to"]
    listed = _bsops(bin_dir, here, env, "list").stdout.splitlines()
    assert listed[:2] == [f"local ({here}/trainings):", "  myrun                tr1-13B on this cluster"]
    assert listed[2].startswith(f"bundled with bsops ({venv}") and any(line.startswith("  tiny ") for line in listed)
    plan = _bsops(bin_dir, here, env, "plan", "myrun", code=1)  # (show, and render's refusal: tests/cli/test_cli.py)
    assert "to do before a job can run: 4 value(s)" in plan.stdout and "bsops new" not in plan.stdout + new.stdout
    rendered = _bsops(bin_dir, here, env, "render", "tiny")
    assert rendered.stdout.startswith(tiny_folder + "\n") and (here / "rendered" / "tiny" / "tiny.slurm").is_file()

    started = time.monotonic()
    dry = _bsops(bin_dir, here, env, "launch", "tiny", "--dry-run")
    # A hang detector, not a speed test: the dry run takes about a second; squeue run on the missing file would
    # retry it for 60 s, past this deadline of 30.
    assert time.monotonic() - started < 30
    assert f"queue not checked: Slurm's configuration SLURM_CONF={tmp_path}/no-slurm.conf does not exist" in dry.stdout
    assert "sbatch command: sbatch --parsable" in dry.stdout and dry.stdout.startswith(tiny_folder)
    status = _bsops(bin_dir, here, env, "status", "tiny", "--no-email", code=2)
    assert status.stdout.startswith(tiny_folder + "\n") and "--format" not in status.stdout + status.stderr
    assert len(status.stdout.splitlines()) == 2 and "SLURM_CONF=" in status.stdout.splitlines()[1]

    cron_dir = tmp_path / "home" / ".local" / "share" / "bsops" / "cron"
    added = _bsops(bin_dir, here, env, "cron", "add", "tiny")
    assert f"wrote {cron_dir}/cron.hourly/tiny-slurm-status.slurm" in added.stdout
    assert "not adding the backup job: backup.dest is not set" in added.stdout
    assert _bsops(bin_dir, here, env, "cron", "list").stdout.split() == [
        "tiny", "status", "hourly", f"{cron_dir}/cron.hourly/tiny-slurm-status.slurm"]
    _bsops(bin_dir, here, env, "cron", "remove", "tiny")
    assert not list((cron_dir / "cron.hourly").iterdir())
    info = _bsops(bin_dir, here, env, "info", "tiny")
    assert info.stdout.startswith(tiny_folder + "\n") and "backup:      none (backup.dest is not set)" in info.stdout

    env["SLURM_CONF"] = str(slurm_cluster.conf)  # with a reachable Slurm
    dry = _bsops(bin_dir, here, env, "launch", "tiny", "--dry-run")
    assert dry.stdout.splitlines()[2].startswith("queue checked: ") and dry.stdout.startswith(tiny_folder)
