"""Small helpers shared by the e2e suites."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hisparse_operator.devcluster import Cluster

T = TypeVar("T")


def eventually(check: Callable[[], T | None], *, what: str, timeout: float = 60.0) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(0.25)


def get_json(cluster: Cluster, *args: str) -> Any:
    """``kubectl get ARGS -o json``, parsed."""
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def exists(cluster: Cluster, *args: str) -> bool:
    res = cluster.kubectl("get", *args, "--ignore-not-found", "-o", "name", check=False)
    assert res.returncode == 0, res.stderr
    return bool(res.stdout.strip())
