"""`hisparse dev up` with the real node (the default where the host can run it), `down` leaving
nothing behind, and the one-message failures that start nothing; the README's first command
(`./scripts/demo`) and the local getting-started page's commands, run as written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hisparse_devcluster import Tools
from hisparse_devcluster._procs import ProcRecord, is_running
from hisparse_devcluster.realnode.plan import Names
from e2e_helpers import doc_commands, doc_line
from test_e2e_dev_cli import dev, processes_using, recorded

pytestmark = pytest.mark.host

REPO = Path(__file__).resolve().parents[2]
LOCAL_PAGE = REPO / "docs" / "getting-started" / "local.md"
LOCAL_NOT_RUN = {"./scripts/test": "it is what CI runs (.ci/run): this test is part of it"}
LOCAL_DEV = ("hisparse dev up", "hisparse dev status", "hisparse dev down")
"""The page's ``hisparse dev`` commands: run here through the CLI's module, in the test's own workdir."""
LOCAL_KUBECTL = ("kubectl get hsd -A", "kubectl describe hsd cpu-tiny", "hisparse rollout status cpu-tiny")
"""Run as the page writes them, with ``KUBECONFIG`` from the ``export KUBECONFIG=`` line ``up`` printed."""


def test_every_command_of_the_local_page_is_run_or_says_why_not() -> None:
    commands = doc_commands(LOCAL_PAGE.read_text())
    run = {"./scripts/demo", *LOCAL_DEV, *LOCAL_KUBECTL, "export KUBECONFIG=..."}
    assert set(commands) == set(LOCAL_NOT_RUN) | run, sorted(set(commands) ^ (set(LOCAL_NOT_RUN) | run))


def node_records(workdir: Path) -> list[ProcRecord]:
    state = workdir / "realnode" / "state.json"
    if not state.exists():
        return []
    return [ProcRecord.from_json(p) for p in json.loads(state.read_text())["processes"]]


def host_traces(workdir: Path) -> list[str]:
    """What a real node of ``workdir`` leaves on the host: its netns, cgroup dirs and mounts."""
    n = Names.for_workdir(workdir)
    out = []
    if n.netns_path.exists():
        out.append(f"netns {n.netns}")
    out += [f"cgroup {h}" for h in Path("/sys/fs/cgroup").iterdir() if (h / n.cgroup_root.lstrip("/")).exists()]
    mounts = Path("/proc/mounts").read_text()
    out += [f"mount {ln}" for ln in mounts.splitlines() if str(n.dir) in ln or str(n.run_dir) in ln]
    return out


@pytest.fixture
def workdir(tools: Tools) -> Iterator[Path]:
    # A short path, not pytest's tmp_path: the kubelet binds unix sockets under it (pod-resources), and a
    # socket path may not pass 107 bytes; pytest's numbered directories grow with every run on a machine
    # (pytest-136/test_operator_process_flag_kee0/dev/... made the kubelet's bind fail with EINVAL).
    wd = Path(tempfile.mkdtemp(prefix="hs-dev-")) / "dev"
    try:
        yield wd
    finally:
        if recorded(wd) or node_records(wd):
            dev(wd, "down")
        shutil.rmtree(wd.parent, ignore_errors=True)


def test_up_runs_the_real_node_and_down_removes_it(workdir: Path) -> None:
    up = dev(workdir, "up", "--gpu-nodes", "2", "--no-cpu-example")
    assert up.returncode == 0, up.stdout + up.stderr
    assert re.search(r"real node localhost Ready in \d+\.\d+s: pods select hisparse.dev/real-node=true", up.stdout)
    assert re.search(r"^default\s+dsv32\s+1/1\s+1/1\s+True\s", up.stdout, re.M), up.stdout
    # The operator is a pod on the real node, installed by Helm from the image built here.
    assert re.search(r"operator pod hisparse-system/hisparse-\S+ Running on node localhost as "
                     r"system:serviceaccount:hisparse-system:hisparse; webhook answering", up.stdout), up.stdout
    assert "hisparse-operator" not in {p.name for p in recorded(workdir)}, "no host-process operator"
    procs = node_records(workdir)
    assert {p.name for p in procs} >= {"containerd", "kubelet", "kube-proxy"}
    assert all(is_running(p) for p in procs), "the node must outlive `up`"

    status = dev(workdir, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert re.search(r"^\s+realnode/kubelet\s+pid \d+\s+running", status.stdout, re.M), status.stdout
    assert re.search(r"^\s+hisparse-operator\s+pod hisparse-system/hisparse-\S+ Running on node localhost",
                     status.stdout, re.M), status.stdout
    # The example's GPU pods stay on KWOK nodes; only CoreDNS and the operator run on the real node.
    kubeconfig = workdir / "kubeconfig"
    kubectl = json.loads((workdir / "state.json").read_text())["tools"]["kubectl"]
    pods = json.loads(subprocess.run([kubectl, f"--kubeconfig={kubeconfig}", "get", "pods", "-A", "-o", "json"],
                                     capture_output=True, text=True, check=True).stdout)["items"]
    placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
    assert all(node.startswith("dev-gpu-") for name, node in placed.items() if name.startswith("dsv32")), placed
    on_node = sorted(name for name, node in placed.items() if node == "localhost")
    assert on_node == sorted(name for name in placed if name.startswith(("coredns-", "hisparse-"))), placed
    operator_pods = [name for name in on_node if name.startswith("hisparse-")]
    assert len(operator_pods) == 1, on_node

    again = dev(workdir, "up", "--no-cpu-example")
    assert again.returncode == 0 and "real node localhost already running" in again.stdout, again.stdout
    assert [p.pid for p in node_records(workdir)] == [p.pid for p in procs]
    assert f"operator pod hisparse-system/{operator_pods[0]} Running" in again.stdout, "an unchanged upgrade keeps the pod"

    down = dev(workdir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped the real node" in down.stdout
    assert not [p.name for p in procs if is_running(p)]
    assert not processes_using(workdir)
    assert not host_traces(workdir)
    assert not node_records(workdir)


def test_the_readme_s_first_command_serves_both_examples_and_down_removes_it(workdir: Path) -> None:
    """``./scripts/demo`` as the README and the local page run it (setup, cached here; the production example
    validated and rendered; ``hisparse dev up --example examples/hisparse-deployment.yaml``: the cluster, its
    node pools and the real node, the operator installed there by Helm, the production example Ready on KWOK
    GPU nodes, then the CPU example served on the real node), then the local page's commands, then ``down``."""
    env = {**os.environ, "HISPARSE_DEV_WORKDIR": str(workdir)}
    demo = subprocess.run([str(REPO / "scripts" / "demo")], env=env, capture_output=True, text=True, timeout=1800,
                          check=False)
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-4000:]
    assert "examples/hisparse-deployment.yaml: valid" in demo.stdout, demo.stdout[-4000:]
    assert re.search(r"^\s+1 kind: LeaderWorkerSet$", demo.stdout, re.M), demo.stdout[-4000:]
    assert re.search(r"^inference\s+glm52\s+8/8\s+1/1\s+True\s", demo.stdout, re.M), demo.stdout[-4000:]
    assert "applied cpu-tiny.yaml: default/cpu-tiny on the real node" in demo.stdout, demo.stdout[-4000:]
    rows = [ln.split() for ln in demo.stdout.splitlines() if ln.startswith("cpu-tiny-")]
    serving = [r for r in rows if r[0].startswith(("cpu-tiny-prefill-", "cpu-tiny-decode-"))]
    assert len(serving) == 2 and all(r[2] == "Running" and "localhost" in r for r in serving), rows
    kubectl = json.loads((workdir / "state.json").read_text())["tools"]["kubectl"]
    _cpu_example_serves(workdir, kubectl)
    _local_page_commands(demo.stdout, kubectl)
    procs = node_records(workdir)
    down = dev(workdir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not [p.name for p in procs if is_running(p)]
    assert not processes_using(workdir)
    assert not host_traces(workdir)


def _local_page_commands(up_stdout: str, kubectl: str) -> None:
    """The local page's commands once ``up`` served the CPU example, as the page writes them, with the
    ``export KUBECONFIG=`` line ``up`` printed."""
    exported = re.search(r"^export KUBECONFIG=(\S+)", up_stdout, re.M)
    assert exported, up_stdout[-2000:]
    bin_dir = REPO / ".venv" / "bin"
    env = {**os.environ, "KUBECONFIG": exported.group(1),
           "PATH": os.pathsep.join([str(Path(kubectl).parent), str(bin_dir), os.environ.get("PATH", "")])}
    out = {}
    for words in LOCAL_KUBECTL:
        res = subprocess.run(["bash", "-c", doc_line(LOCAL_PAGE.read_text(), words)], env=env, capture_output=True,
                             text=True, timeout=60, check=False)
        assert res.returncode == 0, (words, res.stdout[-2000:], res.stderr[-2000:])
        out[words] = res.stdout
    assert re.search(r"^default\s+cpu-tiny\s+1/1\s+1/1\s+True\s", out[LOCAL_KUBECTL[0]], re.M), out[LOCAL_KUBECTL[0]]
    assert re.search(r"Status:\s+True\s*\n\s*Type:\s+Ready\n", out[LOCAL_KUBECTL[1]]), out[LOCAL_KUBECTL[1]][-3000:]
    assert re.search(r"^stable revision: [0-9a-f]{10} \(fleet cpu-tiny\)", out[LOCAL_KUBECTL[2]], re.M), out[LOCAL_KUBECTL[2]]


def _cpu_example_serves(workdir: Path, kubectl: str) -> None:
    """The CPU example the Helm-installed operator reconciled, judged by the API objects and a completion,
    not by what the CLI printed: the resource Ready at its generation with both roles 1/1, its serving pods
    Running and ready on the real node, and the checkpoint's own greedy tokens through `cpu-tiny-serving`."""
    from hisparse_devcluster import cpu_example

    from hisparse_operator import names

    def get(*args: str) -> Any:
        return json.loads(subprocess.run([kubectl, f"--kubeconfig={workdir / 'kubeconfig'}", "get", *args, "-o", "json"],
                                         capture_output=True, text=True, check=True).stdout)

    doc = yaml.safe_load(cpu_example.EXAMPLE.read_text())
    name, namespace = doc["metadata"]["name"], doc["metadata"]["namespace"]
    hsd = get("hsd", name, "-n", namespace)
    conditions = {c["type"]: c for c in hsd["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True", conditions
    assert hsd["status"]["observedGeneration"] == hsd["metadata"]["generation"], hsd["status"]
    assert hsd["status"]["prefill"]["ready"] == "1/1" and hsd["status"]["decode"]["ready"] == "1/1", hsd["status"]
    pods = {}
    for role in ("prefill", "decode"):
        items = get("pods", "-n", namespace, "-l", f"serving.hisparse.dev/role={role},serving.hisparse.dev/deployment={name}")["items"]
        assert len(items) == 1, [p["metadata"]["name"] for p in items]
        pod = pods[role] = items[0]
        assert pod["spec"]["nodeName"] == "localhost" and pod["status"]["phase"] == "Running", (role, pod["status"])
        assert all(c["ready"] for c in pod["status"]["containerStatuses"]), (role, pod["status"]["containerStatuses"])
    import torch
    from hisparse_kernels.tiny_dsa import TinyDSA
    from hisparse_runtime.cpu_engine import load_checkpoint

    torch.set_num_threads(1)
    checkpoint = load_checkpoint(cpu_example.model_dir(workdir, namespace))
    prompt = list(range(11, 51))
    expected = list(TinyDSA(checkpoint.config, seed=checkpoint.seed, device="cpu").generate(prompt, 8, hisparse=True))
    url = f"http://{names.service_host(names.serving(name), namespace)}:8000/v1/completions"
    body = json.dumps({"model": doc["spec"]["model"]["servedModelName"], "prompt": prompt, "max_tokens": 8,
                       "temperature": 0, "return_token_ids": True})
    script = ("import json, sys, urllib.request; r = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), "
              "headers={'content-type': 'application/json'}); print(urllib.request.urlopen(r, timeout=120).read().decode())")
    out = subprocess.run([kubectl, f"--kubeconfig={workdir / 'kubeconfig'}", "exec", "-n", namespace,
                          pods["decode"]["metadata"]["name"], "-c", "vllm", "--", "python3", "-c", script, url, body],
                         capture_output=True, text=True, timeout=180, check=True).stdout
    assert json.loads(out)["choices"][0]["token_ids"] == expected, out


def test_operator_process_flag_keeps_the_host_process_beside_the_real_node(workdir: Path) -> None:
    up = dev(workdir, "up", "--gpu-nodes", "2", "--operator-process", "--no-cpu-example")
    assert up.returncode == 0, up.stdout + up.stderr
    assert re.search(r"real node localhost Ready in \d+\.\d+s", up.stdout), up.stdout
    assert re.search(r"operator started \(pid \d+", up.stdout) and "operator pod" not in up.stdout, up.stdout
    assert "hisparse-operator" in {p.name for p in recorded(workdir)}
    kubeconfig = workdir / "kubeconfig"
    kubectl = json.loads((workdir / "state.json").read_text())["tools"]["kubectl"]
    pods = json.loads(subprocess.run([kubectl, f"--kubeconfig={kubeconfig}", "get", "pods", "-A", "-o", "json"],
                                     capture_output=True, text=True, check=True).stdout)["items"]
    assert not [p for p in pods if p["metadata"]["name"].startswith("hisparse-")], "no operator pod"
    down = dev(workdir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not processes_using(workdir) and not host_traces(workdir)


def _path_without(tmp: Path, *missing: str) -> str:
    """A PATH holding every executable of the system PATH but ``missing``."""
    d = tmp / "bin"
    d.mkdir()
    for entry in os.environ["PATH"].split(os.pathsep):
        p = Path(entry)
        if not p.is_dir():
            continue
        for exe in p.iterdir():
            if exe.name not in missing and not (d / exe.name).exists() and os.access(exe, os.X_OK):
                (d / exe.name).symlink_to(exe)
    return str(d)


def test_missing_package_stops_up_before_anything_starts(workdir: Path, tmp_path: Path) -> None:
    env = {"PATH": _path_without(tmp_path, "socat")}
    res = dev(workdir, "up", "--no-cpu-example", env=env)
    assert res.returncode == 1
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("error: real node: check the host failed: missing Debian packages: socat"), res.stderr
    assert lines[1].startswith("fix: run scripts/setup (or: apt-get install socat)"), res.stderr
    assert "--no-real-node" in lines[1]
    assert not recorded(workdir) and not node_records(workdir) and not processes_using(workdir)
    assert not host_traces(workdir)


def test_unbuilt_kubelet_stops_up_before_anything_starts(workdir: Path, tools: Tools, tmp_path: Path) -> None:
    # A Kubernetes bin dir with the control plane but not the node's binaries (a failed build).
    partial = tmp_path / "kubernetes-bin"
    partial.mkdir()
    for exe in (tools.kube_apiserver, tools.kube_controller_manager, tools.kube_scheduler, tools.kubectl):
        (partial / exe.name).symlink_to(exe)
    res = dev(workdir, "up", "--no-cpu-example", env={"HISPARSE_KUBERNETES_BIN": str(partial)})
    assert res.returncode == 1
    assert "real node: check the host failed: not built: kubelet, kube-proxy, pause" in res.stderr, res.stderr
    assert "fix: run e2e/tools/build.sh kubernetes coredns" in res.stderr
    assert not recorded(workdir) and not node_records(workdir) and not processes_using(workdir)
