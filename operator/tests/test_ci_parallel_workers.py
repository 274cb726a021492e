"""The repository's conftest schedules pytest-xdist workers as scripts/test runs them (``-n 2 --dist loadgroup``):
every module marked ``host`` in one worker, in file order, started first; every other module whole in one worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT_CONFTEST = Path(__file__).resolve().parents[2] / "conftest.py"

# Each test appends (worker, module, test) to a log shared by the workers, so the order they ran in is read back.
MODULE = '''
import json, os, time
{mark}
LOG = {log!r}

def _record(name):
    with open(LOG, "a") as f:
        f.write(json.dumps([os.environ["PYTEST_XDIST_WORKER"], __name__, name, time.monotonic()]) + "\\n")

{tests}
'''
TEST = '''
def test_{i}():
    _record({i})
    time.sleep({pause})
'''


def _module(log: Path, tests: int, pause: float, host: bool) -> str:
    return MODULE.format(mark="import pytest\npytestmark = pytest.mark.host" if host else "", log=str(log),
                         tests="".join(TEST.format(i=i, pause=pause) for i in range(tests)))


def _run(pytester: pytest.Pytester, host: list[str], other: list[str]) -> list[list]:
    """Host modules of 2 tests, others of 5: xdist's own order (most tests first) would start the host unit last."""
    log = pytester.path / "order.jsonl"
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a GPU\n    host: owns part of the machine\n")
    for name in host:
        pytester.makepyfile(**{name: _module(log, 2, 0.3, host=True)})
    for name in other:
        pytester.makepyfile(**{name: _module(log, 5, 0.0, host=False)})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=2 * len(host) + 5 * len(other))
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_host_modules_run_in_one_worker_in_file_order_and_first(pytester: pytest.Pytester) -> None:
    # Named so that file order interleaves them: test_c and test_e are the host's, test_a, test_d, test_f not.
    runs = _run(pytester, host=["test_c", "test_e"], other=["test_a", "test_d", "test_f"])
    host_runs = [r for r in runs if r[1] in ("test_c", "test_e")]
    assert len({r[0] for r in host_runs}) == 1, host_runs
    assert [r[1:3] for r in host_runs] == [["test_c", 0], ["test_c", 1], ["test_e", 0], ["test_e", 1]]
    # First: the host unit is the first its worker runs (xdist's own order would hand both workers a module of
    # five first). Not when it starts beside the others: a worker that boots later under load starts later.
    host_worker = host_runs[0][0]
    assert next(r for r in runs if r[0] == host_worker)[1] == "test_c", runs
    # Every module stays whole in one worker.
    for module in ("test_a", "test_d", "test_f"):
        assert len({r[0] for r in runs if r[1] == module}) == 1, runs
    # And the other worker did the rest beside it.
    assert {r[0] for r in runs} == {"gw0", "gw1"}, runs


def test_without_host_modules_every_module_is_a_unit(pytester: pytest.Pytester) -> None:
    runs = _run(pytester, host=[], other=["test_a", "test_b", "test_c", "test_d"])
    for module in ("test_a", "test_b", "test_c", "test_d"):
        assert len({r[0] for r in runs if r[1] == module}) == 1, runs
    assert {r[0] for r in runs} == {"gw0", "gw1"}, runs


def test_the_controller_leaves_no_file_behind(pytester: pytest.Pytester) -> None:
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("hisparse-xdist-*"))
    _run(pytester, host=["test_c"], other=["test_a"])
    assert set(Path(tempfile.gettempdir()).glob("hisparse-xdist-*")) == before
