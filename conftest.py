"""Repository-wide pytest hooks.

In CI (``CI`` set to true, as ``.ci/run`` does) a skip is a failure: CI installs every component the
project uses (Mooncake, NIXL, vLLM, promtool, hadolint, the Go-built binaries), so a test that would
skip has lost one of them, and a green run without it would claim what was never checked. Tests
marked ``gpu`` are the exception: they need the lent GPU, and CI deselects them (``-m "not gpu"``).
"""

from __future__ import annotations

import os

import pytest

STRICT_SKIPS = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _failed_skip(report: pytest.CollectReport | pytest.TestReport, where: str) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"{where} skipped in CI: {reason.removeprefix('Skipped: ')}. CI installs every component the "
                       "project uses, so this skip means a missing piece: install it from the project's files "
                       "(scripts/setup) rather than skip")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if STRICT_SKIPS and report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("gpu") is None:
        _failed_skip(report, item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if STRICT_SKIPS and report.skipped:
        _failed_skip(report, collector.nodeid)


# ---- where the time goes: wall time per test file, printed at the end of every pytest run -------------

_FILE_SECONDS: dict[str, float] = {}
_FILE_TESTS: dict[str, int] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration  # setup, call and teardown
    if report.when == "call":
        _FILE_TESTS[path] = _FILE_TESTS.get(path, 0) + 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FILE_SECONDS:
        return
    terminalreporter.section("seconds per test file (setup, call and teardown; module fixtures included)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:9.1f} s  {_FILE_TESTS.get(path, 0):5d} tests  {path}")
    terminalreporter.write_line(f"{sum(_FILE_SECONDS.values()):9.1f} s  {sum(_FILE_TESTS.values()):5d} tests  total")
