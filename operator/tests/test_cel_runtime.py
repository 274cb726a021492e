"""The CEL runtime loads once even when many threads ask for it at the same moment (the operator's
first reconciles run concurrently in kopf's thread pool)."""

from __future__ import annotations

import subprocess
import sys


def test_concurrent_first_use_loads_the_evaluator_once() -> None:
    # A fresh interpreter, so the first load really happens here.
    code = """
import threading
from hisparse_operator.api import _cel
barrier = threading.Barrier(8)
results, errors = [], []
def use():
    barrier.wait()
    try:
        results.append(_cel.evaluate("a + 1", {"a": 1}))
    except BaseException as e:  # a second extension init panics with a BaseException
        errors.append(repr(e))
threads = [threading.Thread(target=use) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
assert not errors, errors
assert results == [2] * 8, results
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "panicked" not in res.stderr, res.stderr[-3000:]
