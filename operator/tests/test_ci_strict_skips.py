"""The repository's conftest turns skips into failures under ``CI=true`` (GPU-marked tests excepted)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT_CONFTEST = Path(__file__).resolve().parents[2] / "conftest.py"

TESTS = '''
import pytest

def test_runs():
    assert True

def test_skips_for_a_missing_tool():
    pytest.skip("promtool is not installed")

@pytest.mark.gpu
def test_needs_the_gpu():
    pytest.skip("needs a CUDA GPU")

@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False
'''


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None, module_skip: bool = False):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    pytester.makepyfile(test_tools=TESTS)
    if module_skip:
        pytester.makepyfile(test_mooncake='import pytest\npytest.importorskip("no_such_module_here", reason="Mooncake is not installed")\n\ndef test_x():\n    pass\n')
    return pytester.runpytest_subprocess("-p", "no:cacheprovider")


def test_without_ci_a_skip_is_a_skip(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, None)
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)


def test_in_ci_a_skip_fails_and_names_the_missing_piece(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, "true")
    result.assert_outcomes(passed=1, failed=1, skipped=1, xfailed=1)  # the gpu-marked skip stays a skip
    result.stdout.fnmatch_lines(["*test_skips_for_a_missing_tool skipped in CI: promtool is not installed*"])


def test_in_ci_a_module_level_skip_fails_collection(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, "true", module_skip=True)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*test_mooncake.py skipped in CI: *Mooncake is not installed*"])
