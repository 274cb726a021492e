"""Repository-wide pytest hooks.

In CI (``CI`` set to true, as ``.ci/run`` does) a skip is a failure: CI installs every component the
project uses (Mooncake, NIXL, vLLM, promtool, hadolint, the Go-built binaries), so a test that would
skip has lost one of them, and a green run without it would claim what was never checked. Tests
marked ``gpu`` are the exception: they need the lent GPU, and CI deselects them (``-m "not gpu"``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

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
_WORKER_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration  # setup, call and teardown
    worker = getattr(getattr(report, "node", None), "gateway", None)  # pytest-xdist's controller: the worker's
    if worker is not None:
        _WORKER_SECONDS[worker.id] = _WORKER_SECONDS.get(worker.id, 0.0) + report.duration
    if report.when == "call":
        _FILE_TESTS[path] = _FILE_TESTS.get(path, 0) + 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FILE_SECONDS:
        return
    terminalreporter.section("seconds per test file (setup, call and teardown; module fixtures included)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:9.1f} s  {_FILE_TESTS.get(path, 0):5d} tests  {path}")
    terminalreporter.write_line(f"{sum(_FILE_SECONDS.values()):9.1f} s  {sum(_FILE_TESTS.values()):5d} tests  total")
    for worker, seconds in sorted(_WORKER_SECONDS.items()):  # parallel workers: the longest is the session's wall
        terminalreporter.write_line(f"{seconds:9.1f} s  in worker {worker}")


# ---- parallel sessions: scripts/test runs pytest-xdist workers with --dist loadgroup --------------------
#
# The tests marked ``host`` own something of this machine while they run (the real node's fixed address,
# network namespace and cgroups; network namespaces or a containerd of their own): one worker runs all of
# them, module after module in file order, and first, since together they are the longest unit (the
# real-node modules: about 40 minutes of CI's e2e session). Every other module is a unit of its own, as with
# ``--dist loadfile``, that the other workers take beside it.
#
# xdist's own grouping rewrites node ids, which pytest 9 no longer allows, so the scheduler groups by module:
# the workers, which collect, write the modules marked ``host`` to a file the controller named for them.

HOST_GROUP = "host"
_GROUPS_KEY = "hisparse_host_modules"


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # type: ignore[no-untyped-def]
    """Controller: every worker writes its host modules to one file of this session."""
    path = getattr(node.config, "_hisparse_host_modules", None)
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="hisparse-xdist-")) / "host-modules.json"
        node.config._hisparse_host_modules = path  # type: ignore[attr-defined]
    node.workerinput[_GROUPS_KEY] = str(path)


def pytest_unconfigure(config: pytest.Config) -> None:
    path = getattr(config, "_hisparse_host_modules", None)
    if path is not None:
        shutil.rmtree(path.parent, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    target = getattr(config, "workerinput", {}).get(_GROUPS_KEY)
    if target is None:  # not an xdist worker
        return
    host = sorted({_module(item.nodeid) for item in items if item.get_closest_marker("host")})
    tmp = Path(f"{target}.{os.getpid()}")
    tmp.write_text(json.dumps(host))
    tmp.replace(target)  # every worker collects the same tests, so any complete file is the answer


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class HostFirst(LoadScopeScheduling):
        host: frozenset[str] = frozenset()

        def _split_scope(self, nodeid: str) -> str:
            module = _module(nodeid)
            return HOST_GROUP if module in self.host else module

        def schedule(self) -> None:
            if self.collection is None and self.collection_is_completed:
                path = getattr(config, "_hisparse_host_modules", None)
                self.host = frozenset(json.loads(Path(path).read_text())) if path and Path(path).exists() else frozenset()
                if self.host:
                    # The base class fills this ordered dict by key: a key put there first keeps its place.
                    self.workqueue[HOST_GROUP] = {}
            super().schedule()

    return HostFirst(config, log)
