"""`hisparse dev up | status | down` as a person runs it: each command its own process, the cluster and
the operator outliving `up`, a dead operator noticed by `status` and restarted by `up`, and nothing
left running after `down`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hisparse_devcluster import Tools
from hisparse_devcluster._procs import ProcRecord, is_running

# The CLI's children must import the same package as this test does.
_PKG_ROOT = str(Path(list(sys.modules["hisparse_operator"].__path__)[0]).parent)
MULTI_NODE_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hisparse-deployment.yaml"


def dev(workdir: Path, *args: str, timeout: float = 420,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HISPARSE_DEV_WORKDIR": str(workdir),
           "PYTHONPATH": os.pathsep.join(filter(None, [_PKG_ROOT, os.environ.get("PYTHONPATH")])), **(env or {})}
    return subprocess.run([sys.executable, "-m", "hisparse_operator.cli", "dev", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def recorded(workdir: Path) -> list[ProcRecord]:
    """Every process the state files name: the cluster's servers and the operator."""
    out = []
    cluster = workdir / "state.json"
    if cluster.exists():
        out += [ProcRecord.from_json(p) for p in json.loads(cluster.read_text())["processes"]]
    operator = workdir / "operator.json"
    if operator.exists():
        out.append(ProcRecord.from_json(json.loads(operator.read_text())["process"]))
    return out


NUL = b"\0"


def processes_using(workdir: Path) -> list[str]:
    """Live processes whose command line or environment mentions ``workdir``."""
    needle = str(workdir).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().split(") ")[-1].startswith("Z"):
                continue
            cmdline = (entry / "cmdline").read_bytes()
            if needle in cmdline or needle in (entry / "environ").read_bytes():
                found.append(f"{entry.name}: {cmdline.replace(NUL, b' ').decode(errors='replace')}")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


@pytest.fixture
def workdir(tools: Tools, tmp_path: Path) -> Iterator[Path]:
    wd = tmp_path / "dev"
    try:
        yield wd
    finally:
        if recorded(wd):  # a failed test must not leave a cluster behind
            dev(wd, "down")


def test_up_status_down(workdir: Path) -> None:
    up = dev(workdir, "up", "--gpu-nodes", "2", "--no-real-node")
    assert up.returncode == 0, up.stdout + up.stderr
    assert re.search(r"^default\s+dsv32\s+1/1\s+1/1\s+True\s", up.stdout, re.M), up.stdout
    assert re.search(r"deployment\.apps/dsv32-decode\s+1/1", up.stdout), up.stdout
    procs = recorded(workdir)
    assert {p.name for p in procs} == {"etcd", "apiserver-egress", "kube-apiserver", "kube-controller-manager",
                                       "kube-scheduler", "kwok", "hisparse-operator"}
    assert all(is_running(p) for p in procs), "everything must outlive the `up` process"

    status = dev(workdir, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    for name in ("kube-apiserver", "kwok", "hisparse-operator"):
        assert re.search(rf"^\s+{name}\s+pid \d+\s+running", status.stdout, re.M), status.stdout
    assert re.search(r"dsv32\s+1/1\s+1/1\s+True", status.stdout), status.stdout

    # A dead operator is reported, and `up` starts a new one on the same cluster.
    operator = next(p for p in procs if p.name == "hisparse-operator")
    os.killpg(operator.pid, signal.SIGKILL)
    down_status = dev(workdir, "status")
    assert down_status.returncode == 1 and re.search(r"hisparse-operator\s+pid \d+\s+NOT RUNNING", down_status.stdout)
    again = dev(workdir, "up", "--no-real-node")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "attached to the dev cluster" in again.stdout and "operator started" in again.stdout
    assert [p.pid for p in recorded(workdir) if p.name == "kube-apiserver"] == [p.pid for p in procs if p.name == "kube-apiserver"]
    procs = recorded(workdir)

    down = dev(workdir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not [p.name for p in procs if is_running(p)]
    assert not processes_using(workdir)
    assert not recorded(workdir), "state files must be gone after down"
    after = dev(workdir, "status")
    assert after.returncode == 1 and "no dev cluster" in after.stdout


def test_missing_example_is_a_clear_error_and_starts_nothing(workdir: Path, tmp_path: Path) -> None:
    res = dev(workdir, "up", "--example", str(tmp_path / "nope.yaml"))
    assert res.returncode == 1
    assert "nope.yaml: cannot read the example" in res.stderr
    assert not processes_using(workdir) and not recorded(workdir)


def test_up_multi_node_example_runs_lws_and_node_pools(workdir: Path) -> None:
    """The 16-node example: `up` starts the LeaderWorkerSet controller, a node pool per role (racks of
    8) and a CPU node, pins each role to its pool, and waits until 8 prefill pods and the decode group
    are Ready; `down` leaves nothing running."""
    up = dev(workdir, "up", "--example", str(MULTI_NODE_EXAMPLE), "--no-real-node")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "added KWOK nodes: 8 decode, 8 prefill, 1 cpu (GPU racks of 8" in up.stdout, up.stdout
    assert re.search(r"^inference\s+glm52\s+8/8\s+1/1\s+True\s", up.stdout, re.M), up.stdout
    assert re.search(r"leaderworkerset\.leaderworkerset\.x-k8s\.io/glm52-decode\s", up.stdout), up.stdout
    assert "lws-manager" in {p.name for p in recorded(workdir)}
    # The small example on the same cluster gets untainted nodes of its own beside the pools.
    small = dev(workdir, "up", "--no-real-node")
    assert small.returncode == 0, small.stdout + small.stderr
    assert "added KWOK GPU nodes: dev-gpu-000, dev-gpu-001" in small.stdout, small.stdout
    assert re.search(r"^default\s+dsv32\s+1/1\s+1/1\s+True\s", small.stdout, re.M), small.stdout
    down = dev(workdir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not processes_using(workdir)


def test_too_few_gpu_nodes_for_a_multi_node_example_is_a_clear_error_and_starts_nothing(workdir: Path) -> None:
    res = dev(workdir, "up", "--example", str(MULTI_NODE_EXAMPLE), "--gpu-nodes", "4")
    assert res.returncode == 1
    assert ("hisparse-deployment.yaml needs 16 GPU nodes (decode 8, prefill 8; racks of 8); --gpu-nodes 4 is "
            "too few") in res.stderr, res.stderr
    assert not processes_using(workdir) and not recorded(workdir)
