"""Fixtures for the e2e suites: one real control plane per pytest run.

The binaries come from ``e2e/tools/build.sh``. When they are missing the
suite fails (it does not skip), with the command that builds them.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    import hisparse_devcluster  # noqa: F401  (installed package)
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from hisparse_devcluster import Cluster, Tools, ToolsNotBuiltError
from hisparse_devcluster.realnode import RealNode

E2E_DIR = Path(__file__).resolve().parent
_NAMESPACES = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: runs against a real local control plane (needs e2e/tools/build.sh)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def tools() -> Tools:
    try:
        return Tools.locate()
    except ToolsNotBuiltError as e:
        message = str(e)
    pytest.fail(f"{message}\n(the e2e suite needs these binaries; it never skips)", pytrace=False)


@pytest.fixture(scope="session")
def cluster(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The shared control plane, with the upstream CRDs installed and the LWS controller running."""
    c = Cluster.start(tmp_path_factory.mktemp("devcluster"), tools=tools, lws=True)
    try:
        yield c
    finally:
        c.stop()
        left = c.leftover_processes()
        assert not left, f"processes survived teardown: {left}"


@pytest.fixture(scope="session")
def gpu_nodes(cluster: Cluster) -> list[str]:
    """Two Ready KWOK nodes with 8 H200 each, in different racks and zones."""
    return cluster.add_gpu_nodes(2, nodes_per_rack=1)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, named after it; deleted afterwards (without waiting)."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())
    name = f"t{next(_NAMESPACES):03d}-{base}"[:63].rstrip("-")
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def node(cluster: Cluster, tools: Tools) -> Iterator[RealNode]:
    """The real node (kubelet, containerd) for one test module: started here, stopped after the module,
    and nothing of it may be left on the host."""
    n = RealNode(cluster, tools=tools).start()
    try:
        yield n
    finally:
        n.stop()
        assert not n.leftovers(), n.leftovers()

