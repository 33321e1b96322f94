"""Shared pytest set-up. Area-specific fixtures live in tests/fixtures_<area>.py and are listed here."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Triton kernels run interpreted on CPU; the variable is read when @triton.jit decorates.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

REPO = Path(__file__).resolve().parents[1]


def _bundled_as_committed() -> Path:
    """bsops' bundled folders as the repository holds them, apart from the checkout, named by BSOPS_DATA_DIR for
    this process and every command a test starts: an experiment, a run or a cron job the user keeps in the
    checkout's trainings/ never reaches a test. templates/ and trainings/ are copied (their tracked
    files); corpus/ is the checkout's own (the data bsops builds there is bsops' own)."""
    folder = Path(tempfile.mkdtemp(prefix="bsops-test-bundled-"))
    atexit.register(shutil.rmtree, folder, True)
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "templates", "trainings"],
                             capture_output=True, text=True, timeout=60)
    names = [n for n in tracked.stdout.split("\0") if n] if tracked.returncode == 0 else []
    for name in names or [str(p.relative_to(REPO)) for d in ("templates", "trainings")
                          for p in (REPO / d).rglob("*") if p.is_file()]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, folder / name)
    for name in ("templates", "trainings"):
        (folder / name).mkdir(exist_ok=True)
    (folder / "corpus").symlink_to(REPO / "corpus")
    return folder


os.environ["BSOPS_DATA_DIR"] = str(_bundled_as_committed())


@pytest.fixture(scope="session", autouse=True)
def _session_in_a_folder_of_its_own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The session's fixtures (the shared trained runs, the cluster) start in an empty folder too, and the user cache
    (the tokenizer backend probe's outcome, data/tokenizer_cache.py) is the session's: never read from or written to
    the user's ~/.cache, shared by the session's tests (a probe costs 0.6 CPU s)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("session-cwd"))
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        # Where the watchdog keeps its alert state while a run's log folder cannot be written (never the user's).
        patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
        yield


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in an empty folder of its own: what a bundled experiment writes under the current folder
    (runs/NAME) and what a command reads there (./trainings) is the test's, never the checkout's. Its runs index
    (the launches `bsops runs` lists) is its own too: no test writes the user's."""
    cwd = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("BSOPS_RUNS_INDEX", str(cwd.parent / f"{cwd.name}-runs.jsonl"))
    # The cache `bsops samples` builds index files in (never the data folder) is the test's, never the user's.
    monkeypatch.setenv("BSOPS_CACHE_DIR", str(cwd.parent / f"{cwd.name}-cache"))


pytest_plugins: list[str] = [
    "tests.fixtures_data",
    "tests.fixtures_trainer",
    "tests.fixtures_slurm",
    "tests.fixtures_smtp",
    "tests.fixtures_git",
    "pytester",  # tests/project/test_skip_policy.py runs pytest on a test file of its own
]


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def trainings(tmp_path: Path) -> Path:
    """A copy of the bundled experiments, so a test can add its own next to them (`base: tiny`)."""
    directory = tmp_path / "trainings"
    shutil.copytree(REPO / "trainings", directory)
    return directory


JOB_SCRIPT_MODULES = {"test_launch", "test_trainer_failure"}
"""Test modules that run the job script outside Slurm (bsops launch --local): their slow tests run one after another
on one worker, beside the cluster's tests if the other worker takes those (a local launch's rendezvous port is drawn
from 20000 up to the kernel's own range, a Slurm job's is slurm.master_port + its job id % 1000, 6000-6999 in the
tests' experiments: they never meet)."""
SESSION_RUNS = {"golden_run", "spiked_run"}
"""Session fixtures that train: the tests that read them run on one worker, which trains each once."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (-n 2 --dist loadgroup, scripts/test.sh's default) each group runs whole on one worker:
    the tests on the Slurm cluster (which each worker would start for itself); the job script's local launches;
    the readers of the session's trained runs (SESSION_RUNS); and each other module's slow tests, which share
    module-scoped runs. A worker takes the next group when it is free, the groups with most tests first; the quick
    tests fill the gaps and the end, mostly beside the cluster's tests, which spend half their time waiting for Slurm."""
    readers = {item.path for item in items if SESSION_RUNS.intersection(getattr(item, "fixturenames", ()))}
    for item in items:
        if item.get_closest_marker("slurm"):
            # Slow as well: the fast loop (-m "not slow", deselected after this hook) never starts the cluster.
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.xdist_group("slurm-cluster"))
        elif item.get_closest_marker("slow") and item.path.stem in JOB_SCRIPT_MODULES:
            item.add_marker(pytest.mark.xdist_group("local-launches"))
        elif item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group("session-runs" if item.path in readers else f"launches-{item.path.stem}"))
    # xdist hands out groups of equal size in collection order: the one-test groups of slow modules go before the
    # quick tests, which then fill the end of the run instead of waiting for a launch.
    if getattr(config.option, "loadgroup", False):
        items.sort(key=lambda item: not item.get_closest_marker("xdist_group"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fail every test of a run on workers that do not group (pytest-xdist writes each test's group into its id when
    collection is modified): each worker would launch trainers and start a Slurm cluster of its own."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        reason = (f"pytest-xdist did not group {len(lost)} tests ({lost[0]}, ...): pytest 9.2 broke --dist loadgroup "
                  "(pytest-xdist issue 1386); install pytest<9.2, as scripts/setup.sh does")
        for item in session.items:
            item.stash[UNGROUPED] = reason


UNGROUPED = pytest.StashKey[str]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if UNGROUPED in item.stash:
        pytest.fail(item.stash[UNGROUPED], pytrace=False)


# --- skips: a test that cannot run fails the run, unless the machine lacks hardware it needs -----------------

ALLOWED_SKIPS: dict[str, str] = {
    "tests/trainer/test_trainer_gpu.py": "needs a CUDA GPU: fp16, NCCL and fused AdamW run only there",
    "tests/kernels/test_kernels_dispatch.py::test_sm_count_is_the_devices": "needs a GPU: the device's SM count",
    "tests/project/test_benchmarks_gpu_acceptance.py::test_each_launched_experiment_plans_and_ends_in_its_array[fp16-cpu]":
        "fp16 on a CPU: the acceptance command skips it",
}
"""The only skips a run accepts: a test file or test id (parameters included, or not for all of them) -> why. Every
other skip is reported under "unlisted skips" and fails the run (exit 1), so that a check that silently cannot run
(a missing package, a file beside one checkout only, what the machine happens to have) is seen, not counted as a
pass. A test needing what scripts/test.sh installs (Slurm, git-lfs, faketime) or root is no reason to skip."""


def allowed_skip(nodeid: str, allowed: dict[str, str] = ALLOWED_SKIPS) -> str | None:
    """Why test `nodeid` may skip (ALLOWED_SKIPS' entry for it), or None. pytest-xdist's `@group` suffix is ignored."""
    nodeid = nodeid.split("@", 1)[0]
    for entry, why in allowed.items():
        if nodeid == entry or nodeid.startswith((entry + "::", entry + "[")):
            return why
    return None


class SkipPolicy:
    """Collects the run's skips (on the controller with pytest-xdist, where every worker's reports arrive), fails
    the run on one ALLOWED_SKIPS does not name, and lists those after pytest's own summary of skips (-ra)."""

    def __init__(self, allowed: dict[str, str]) -> None:
        self.allowed = allowed
        self.unlisted: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail") and allowed_skip(report.nodeid, self.allowed) is None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.unlisted.append((report.nodeid, reason.removeprefix("Skipped: ")))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A whole module skipped as it is collected (pytest.skip(allow_module_level=True), importorskip)."""
        self.pytest_runtest_logreport(report)  # type: ignore[arg-type]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unlisted and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.unlisted:
            terminalreporter.section("unlisted skips", sep="=", red=True, bold=True)
            for nodeid, reason in self.unlisted:
                terminalreporter.line(f"{nodeid}: {reason}")
            terminalreporter.line(f"{len(self.unlisted)} test(s) skipped for a reason tests/conftest.py's "
                                  "ALLOWED_SKIPS does not list: the run fails (make the test run, or list it there)")


def register_skip_policy(config: pytest.Config, allowed: dict[str, str] = ALLOWED_SKIPS) -> None:
    if not hasattr(config, "workerinput"):  # a pytest-xdist worker's reports reach the controller's policy
        config.pluginmanager.register(SkipPolicy(allowed), "bsops-skip-policy")


def pytest_configure(config: pytest.Config) -> None:
    register_skip_policy(config)
