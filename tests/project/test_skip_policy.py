"""A run fails on a skip tests/conftest.py's ALLOWED_SKIPS does not list, and says which (issue 51: no check that
silently cannot run). Each run is pytest on a small test file of its own, with the policy registered as
tests/conftest.py registers it, once in this process and once as scripts/test.sh runs the suite (-n 2)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import ALLOWED_SKIPS, REPO, allowed_skip

TESTS = """
import pytest

def test_passes():
    pass

def test_listed():
    pytest.skip("needs a GPU")

@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_listed_row(device):
    if device == "cpu":
        pytest.skip("fp16 on a CPU")

@pytest.mark.skipif(True, reason="what this machine happens to have")
def test_unlisted():
    pass

@pytest.mark.xfail(reason="a known bug, no skip", strict=True)
def test_expected_to_fail():
    assert False
"""
CONFTEST = """
from tests.conftest import register_skip_policy

def pytest_configure(config):
    register_skip_policy(config, {"test_skipping.py::test_listed": "a GPU",
                                  "test_skipping.py::test_listed_row[cpu]": "fp16 on a CPU"})
"""


@pytest.fixture
def skipping(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_skipping=TESTS)
    return pytester


def test_an_unlisted_skip_fails_the_run_and_is_named(skipping: pytest.Pytester) -> None:
    result = skipping.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=2, skipped=3, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    summary = result.outlines[[i for i, line in enumerate(result.outlines) if "unlisted skips" in line][0]:]
    assert summary[1] == "test_skipping.py::test_unlisted: what this machine happens to have"
    assert summary[2].startswith("1 test(s) skipped")
    assert sum("SKIPPED" in line for line in result.outlines) == 3  # -rs still lists every skip, listed or not


def test_listed_skips_alone_pass(skipping: pytest.Pytester) -> None:
    result = skipping.runpytest("-p", "no:cacheprovider", "-k", "not test_unlisted")
    result.assert_outcomes(passed=2, skipped=2, xfailed=1)
    assert result.ret == pytest.ExitCode.OK and "unlisted skips" not in result.stdout.str()


def test_with_two_workers_the_controller_fails_the_run(skipping: pytest.Pytester) -> None:
    """The workers' skips reach the controller, whose exit status is the run's (scripts/test.sh runs -n 2)."""
    result = skipping.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert [line for line in result.outlines if line.startswith("test_skipping.py::")] == [
        "test_skipping.py::test_unlisted: what this machine happens to have"]


def test_a_module_skipped_as_it_is_collected_fails_the_run_too(skipping: pytest.Pytester) -> None:
    skipping.makepyfile(test_module_skip="import pytest\npytest.importorskip('no_such_module_anywhere')\n")
    result = skipping.runpytest("-p", "no:cacheprovider", "-k", "not test_unlisted")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert [line for line in result.outlines if line.startswith("test_module_skip.py")] == [
        "test_module_skip.py: could not import 'no_such_module_anywhere': No module named 'no_such_module_anywhere'"]


def test_the_allowed_list_names_hardware_only_and_matches_ids_with_their_rows() -> None:
    assert len(ALLOWED_SKIPS) <= 5 and all(("GPU" in why or "CPU" in why) for why in ALLOWED_SKIPS.values())
    assert allowed_skip("tests/trainer/test_trainer_gpu.py::test_gpu_precision_trains_saves_and_resumes[fp16]@launches")
    assert allowed_skip("tests/kernels/test_kernels_dispatch.py::test_sm_count_is_the_devices") is not None
    assert allowed_skip("tests/kernels/test_kernels_dispatch.py::test_sm_count_is_the_devices_too") is None
    gpu_acceptance = ("tests/project/test_benchmarks_gpu_acceptance.py::"
                      "test_each_launched_experiment_plans_and_ends_in_its_array")
    assert allowed_skip(f"{gpu_acceptance}[fp16-cpu]") and allowed_skip(f"{gpu_acceptance}[bf16-cpu]") is None
    assert allowed_skip("tests/trainer/test_trainer_gpu_more.py::test_x") is None
