"""A cluster's whole life across processes, as ``hisparse dev up|status|down`` drives it.

``up`` runs in a child Python process that exits while the cluster keeps
running; this process attaches through the state file, restarts the
apiserver, and a third process stops everything. Tests run in file order.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import eventually, exists, get_json
from hisparse_devcluster import Cluster, ClusterError, Tools
from hisparse_devcluster import cluster as cluster_module
from hisparse_devcluster._procs import is_running

# Child processes must import the same package as this test does.
_PKG_ROOT = str(Path(list(sys.modules["hisparse_operator"].__path__)[0]).parent)


def _devcluster(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [_PKG_ROOT, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "hisparse_devcluster", f"--workdir={workdir}", *args],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )


@pytest.fixture(scope="module")
def up(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """What ``up`` printed, plus the workdir; the cluster is stopped afterwards if still up."""
    workdir = tmp_path_factory.mktemp("lifecycle")
    res = _devcluster(workdir, "up", "--gpu-nodes=1")
    assert res.returncode == 0, res.stderr
    try:
        yield {**json.loads(res.stdout), "workdir": workdir}
    finally:
        try:
            Cluster.attach(workdir).stop()
        except ClusterError:
            pass  # already stopped by the last test


@pytest.fixture(scope="module")
def own(up: dict[str, Any]) -> Cluster:
    return Cluster.attach(up["workdir"])


def test_start_retries_when_a_chosen_port_is_taken(
    tools: Tools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    calls: list[list[int]] = []

    def ports_with_etcd_on_a_taken_one(n: int) -> list[int]:
        ports = real_free_ports(n)
        if not calls:
            ports[0] = taken  # etcd's client port on the first attempt
        calls.append(ports)
        return ports

    real_free_ports = cluster_module._free_ports
    monkeypatch.setattr(cluster_module, "_free_ports", ports_with_etcd_on_a_taken_one)
    try:
        with Cluster.start(tmp_path, tools=tools, install_crds=False) as c:
            assert len(calls) == 2 and c.api_get("/readyz")[0] == 200
            assert "address already in use" not in c.log_path("etcd").read_text()
    finally:
        squatter.close()


def test_up_outlives_its_process_and_reports_where_it_is(up: dict[str, Any], own: Cluster) -> None:
    assert all(own.status().values()), own.status()
    assert up["kubeconfig"] == str(own.kubeconfig) and up["server"] == own.server
    assert up["gpu_nodes"] == ["gpu-node-000"]
    node = get_json(own, "node", "gpu-node-000")
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def test_second_start_in_same_workdir_is_refused(own: Cluster) -> None:
    with pytest.raises(ClusterError, match="already running"):
        Cluster.start(own.workdir, install_crds=False)
    assert all(own.status().values())


def test_apiserver_restart_keeps_objects(own: Cluster) -> None:
    own.kubectl("create", "configmap", "survivor", "--from-literal=k=v")
    before = get_json(own, "configmap", "survivor")["metadata"]["uid"]
    old_pid = next(p.pid for p in own.processes if p.name == "kube-apiserver")

    own.restart_apiserver()

    new_pid = next(p.pid for p in own.processes if p.name == "kube-apiserver")
    assert new_pid != old_pid
    after = get_json(own, "configmap", "survivor")
    assert after["metadata"]["uid"] == before and after["data"] == {"k": "v"}
    # Controllers reconnected: a new namespace still gets its default ServiceAccount.
    own.kubectl("create", "namespace", "after-restart")
    eventually(lambda: exists(own, "serviceaccount", "default", "-n", "after-restart"),
               what="the default ServiceAccount in a namespace made after the restart")


def test_status_from_another_process(own: Cluster) -> None:
    res = _devcluster(own.workdir, "status")
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout)
    assert seen["server"] == own.server
    assert {n: p["running"] for n, p in seen["processes"].items()} == {
        p.name: True for p in own.processes
    }
    # The restarted apiserver is the one recorded.
    assert seen["processes"]["kube-apiserver"]["pid"] == next(
        p.pid for p in own.processes if p.name == "kube-apiserver"
    )


def test_down_from_another_process_leaves_nothing_running(own: Cluster) -> None:
    records = Cluster.attach(own.workdir).processes
    res = _devcluster(own.workdir, "down")
    assert res.returncode == 0, res.stderr
    assert not own.leftover_processes()
    assert not any(is_running(p) for p in records)
    # Nothing anywhere still runs out of this workdir.
    workdir = str(own.workdir)
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            assert workdir not in cmdline, f"pid {proc.name} still runs: {cmdline}"
    res = _devcluster(own.workdir, "status")
    assert res.returncode == 1 and "no dev cluster state" in res.stderr
