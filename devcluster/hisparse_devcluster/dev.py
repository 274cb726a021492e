"""``hisparse dev up | status | down``: the operator and an example on a local control plane.

``up`` starts the dev cluster (or attaches to the one already running in the workdir), adds KWOK GPU
nodes and, where the host can, the real node. With the real node up, the operator runs there as a pod:
the operator image is built here (cached), imported into the node, and ``charts/hisparse`` installed by
``helm upgrade --install`` (:mod:`.operator_pod`). Otherwise (or with ``operator_pod=False``) ``up``
installs the CRD and starts ``hisparse operator run`` as a detached process (its own process group, log in
``<workdir>/logs/operator.log``, pid in ``<workdir>/operator.json`` beside the cluster's ``state.json``).
Then it applies the example and waits until it is Ready. An example whose replicas span several nodes gets
the LeaderWorkerSet controller and the node pools of :mod:`.devcluster.pools` (one per role, racks
that hold a whole group), and each of its roles selects its pool. ``down`` stops the operator, then the cluster, and
checks that no process is left. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hisparse_operator.api import labels as L
from hisparse_operator.controller.webhook import CONFIGURATION as WEBHOOK_CONFIGURATION
from . import Cluster, ClusterError, KubectlError, default_workdir, pools, realnode, storage
from . import _procs as procs
from .operator_pod import OperatorRelease
from ._state import ClusterState

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
DEFAULT_EXAMPLE: Final = REPO_ROOT / "examples" / "deepseek-v32-single-node.yaml"
OPERATOR_STATE: Final = "operator.json"
NODE_PREFIX: Final = "dev-gpu-"
DEFAULT_GPU_NODES: Final = 2
"""GPU nodes for an example whose replicas each fit one node."""
FIELD_MANAGER: Final = "hisparse-dev"
STOP_GRACE_S: Final = 15.0

Echo = Callable[[str], None]


class DevError(RuntimeError):
    """``hisparse dev`` could not do what was asked; the message says why and what to run."""


@dataclass(frozen=True)
class OperatorProcess:
    """The detached operator: its process record and the loopback ports it serves."""

    record: procs.ProcRecord
    webhook_port: int
    metrics_port: int

    def running(self) -> bool:
        return procs.is_running(self.record)

    def save(self, workdir: Path) -> None:
        data = {"process": self.record.to_json(), "webhookPort": self.webhook_port, "metricsPort": self.metrics_port}
        tmp = workdir / f"{OPERATOR_STATE}.tmp"
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, workdir / OPERATOR_STATE)

    @classmethod
    def load(cls, workdir: Path) -> OperatorProcess | None:
        try:
            data = json.loads((workdir / OPERATOR_STATE).read_text())
        except FileNotFoundError:
            return None
        return cls(procs.ProcRecord.from_json(data["process"]), int(data["webhookPort"]), int(data["metricsPort"]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cluster_running(workdir: Path) -> bool:
    state = ClusterState.load(workdir)
    return state is not None and all(procs.is_running(p) for p in state.processes) and bool(state.processes)


# ---- up ----------------------------------------------------------------------------------------------

def up(workdir: Path, *, gpu_nodes: int | None = None, example: Path = DEFAULT_EXAMPLE, timeout: float = 240.0,
       real_node: bool = True, operator_pod: bool = True, cpu_example: bool = True, echo: Echo = print) -> None:
    """Bring everything up (reusing what already runs) and wait until ``example`` is Ready.

    ``gpu_nodes``: GPU nodes to have (default :data:`DEFAULT_GPU_NODES`, or exactly what a multi-node
    example needs; more than that go to the prefill pool). ``real_node``: also run the real node
    (:mod:`.realnode`) when this host can (root, cgroup v1); a missing package or binary stops ``up``
    before anything starts. ``operator_pod``: with the real node, run the operator there as a pod
    installed by Helm (else, or without the node, as a host process). ``cpu_example``: with the real node,
    also serve ``examples/cpu-tiny.yaml`` there for real (its images built and loaded, see
    :mod:`.cpu_example`) and wait until it is Ready too."""
    workdir = workdir.expanduser().resolve()
    doc = _load_example(example)
    multi_node = pools.needs_lws(doc)
    counts = _pool_counts(example, doc, gpu_nodes) if multi_node else {}
    real_node = real_node and _real_node_possible(echo)
    if real_node and operator_pod:
        _check_helm()
    started_cluster = False
    started_node: realnode.RealNode | None = None
    if _cluster_running(workdir):
        cluster = Cluster.attach(workdir)
        echo(f"attached to the dev cluster in {workdir} ({cluster.server})")
        if multi_node and not any(p.name == "lws-manager" for p in cluster.processes):
            raise DevError(f"{example.name} has replicas of several nodes (LeaderWorkerSets), and the dev cluster in "
                           f"{workdir} runs without the LeaderWorkerSet controller: run `hisparse dev down`, then "
                           f"`hisparse dev up --example {example}`")
    else:
        extra = ", LeaderWorkerSet controller" if multi_node else ""
        echo(f"starting a dev cluster in {workdir} (etcd, kube-apiserver, controllers, KWOK{extra}) ...")
        cluster = Cluster.start(workdir, detach=True, lws=multi_node)
        started_cluster = True
    started_operator = False
    installed: OperatorRelease | None = None
    try:
        if multi_node:
            _ensure_pool_nodes(cluster, doc, counts, echo)
            doc = pools.pin_to_pools(doc)
            echo(f"each role selects its node pool: nodeSelector {pools.POOL_LABEL}=<role>")
        else:
            _ensure_gpu_nodes(cluster, gpu_nodes or DEFAULT_GPU_NODES, echo)
        if real_node:
            started_node = _ensure_real_node(cluster, echo)
        alive: Callable[[], str | None]
        if real_node and operator_pod:
            if _stop_operator(workdir) is not None:
                echo("stopped the host-process operator: the operator runs as a pod now")
            release = OperatorRelease(cluster, timeout=timeout)
            node = realnode.RealNode.attach(cluster)
            assert node is not None
            ref = release.load_image(node, echo)
            echo(f"helm upgrade --install {release.release} charts/hisparse -n {release.namespace} "
                 f"(image {ref}, on the real node) ...")
            if not release.installed():
                installed = release
            release.install(ref)
            pod = next(p for p in release.pods() if not p["metadata"].get("deletionTimestamp"))
            echo(f"operator pod {release.namespace}/{pod['metadata']['name']} Running on node "
                 f"{pod['spec'].get('nodeName')} as {release.service_account}; webhook answering")
            alive = _pod_alive(release)
        else:
            release = OperatorRelease(cluster, timeout=timeout)
            if cluster.helm_path is not None and release.installed():
                echo(f"uninstalling the Helm release {release.release}: the operator runs as a host process now")
                release.uninstall()
            _install_crd(cluster)
            op = OperatorProcess.load(workdir)
            if op is not None and op.running() and not started_cluster:
                echo(f"operator already running (pid {op.record.pid})")
            else:
                if op is not None:
                    procs.stop(op.record, grace_s=STOP_GRACE_S)  # it served a cluster that is gone
                op = _start_operator(cluster, workdir)
                started_operator = True
                echo(f"operator started (pid {op.record.pid}, log {op.record.log})")
            _wait_operator(cluster, op, timeout)
            alive = _process_alive(op)
        name, namespace = _apply_example(cluster, doc, timeout)
        echo(f"applied {example.name}: {namespace}/{name}; waiting for Ready ...")
        _wait_ready(cluster, alive, namespace, name, timeout)
        if real_node and cpu_example:
            node = realnode.RealNode.attach(cluster)
            assert node is not None
            from . import cpu_example as cpu

            cpu.prepare(cluster, node, echo=echo)
            cpu_name, cpu_namespace = _apply_example(cluster, cpu.example_doc(), timeout, model_cache=False)
            echo(f"applied {cpu.EXAMPLE.name}: {cpu_namespace}/{cpu_name} on the real node; waiting for Ready "
                 f"(each serving pod imports vLLM's parser first) ...")
            _wait_ready(cluster, alive, cpu_namespace, cpu_name, max(timeout, CPU_EXAMPLE_TIMEOUT))
            echo(cluster.kubectl("get", "pods", "-n", cpu_namespace, "-o", "wide",
                                 "-l", f"{L.DEPLOYMENT}={cpu_name}").stdout.rstrip())
    except BaseException:
        # All or nothing for what this call started; logs stay in the workdir.
        if started_operator or started_cluster:
            _stop_operator(workdir)
        if installed is not None and not started_cluster:
            with contextlib.suppress(ClusterError, subprocess.SubprocessError):
                installed.uninstall()
        if started_node is not None and not started_cluster:
            started_node.stop()
        if started_cluster:
            cluster.stop()  # and the real node with it
        raise
    echo("")
    echo(cluster.kubectl("get", "hsd", "-A").stdout.rstrip())
    echo("")
    echo(cluster.kubectl("get", _child_resources(), "-n", namespace,
                         "-l", f"{L.DEPLOYMENT}={name}").stdout.rstrip())
    echo("")
    echo(f"export KUBECONFIG={cluster.kubeconfig}   # kubectl: {cluster.kubectl_path}")
    default = workdir == default_workdir().expanduser().resolve()
    echo(f"hisparse dev down{'' if default else f' --workdir {workdir}'}   # stops the operator and the cluster")


CPU_EXAMPLE_TIMEOUT: Final = 1200.0
"""Seconds for the CPU example's pods to import vLLM's parser and pass their probes on a loaded 2-core host."""


def _real_node_possible(echo: Echo) -> bool:
    """False (with a note) on a host that cannot run the real node at all; raises when something to
    install or build is missing, so that ``up`` stops before it starts anything."""
    problems = realnode.host_problems()
    if any(not p.installable for p in problems):
        echo("real node left out: " + "; ".join(p.cause for p in problems if not p.installable)
             + " (the cluster runs with KWOK nodes only)")
        return False
    realnode.check_host()
    return True


def _check_helm() -> None:
    """The operator pod is installed by Helm: stop before anything starts when it is not built."""
    from ._tools import Tools

    if Tools.locate().helm is None:
        raise DevError("the operator runs as a pod on the real node, installed by Helm, and helm is not built\n"
                       "fix: run e2e/tools/build.sh helm (scripts/setup does), or pass --operator-process")


def _ensure_real_node(cluster: Cluster, echo: Echo) -> realnode.RealNode | None:
    """Start the real node unless it already runs; returns it when this call started it."""
    node = realnode.RealNode.attach(cluster)
    if node is not None and node.status() and all(node.status().values()):
        echo(f"real node {node.name} already running")
        return None
    echo("starting the real node (containerd, kubelet, kube-proxy, CoreDNS in network namespace "
         f"{realnode.RealNode(cluster).netns}) ...")
    t0 = time.monotonic()
    node = realnode.RealNode(cluster).start()
    key, value = node.label
    echo(f"real node {node.name} Ready in {time.monotonic() - t0:.1f}s: pods select {key}={value} and tolerate "
         f"the taint {node.taint['key']}={node.taint['value']}:{node.taint['effect']}; images go in with "
         f"ctr --address {node.containerd_address} -n k8s.io images import FILE")
    return node


def _load_example(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise DevError(f"{path}: cannot read the example: {e}") from e
    if not isinstance(doc, dict) or doc.get("kind") != L.KIND:
        raise DevError(f"{path}: expected one {L.KIND} manifest")
    doc.setdefault("metadata", {}).setdefault("namespace", "default")
    return doc


def _pool_counts(example: Path, doc: dict[str, Any], gpu_nodes: int | None) -> dict[str, int]:
    """GPU nodes per role pool for a multi-node example; checked before anything starts."""
    need = pools.role_nodes(doc)
    total = sum(need.values())
    if gpu_nodes is None:
        return need
    if gpu_nodes < total:
        detail = ", ".join(f"{role} {n}" for role, n in need.items())
        raise DevError(f"{example.name} needs {total} GPU nodes ({detail}; racks of {pools.group_nodes(doc)}); "
                       f"--gpu-nodes {gpu_nodes} is too few: pass at least {total} or leave it out")
    return {**need, pools.ROLES[-1]: need[pools.ROLES[-1]] + gpu_nodes - total}


def _ensure_pool_nodes(cluster: Cluster, doc: dict[str, Any], counts: dict[str, int], echo: Echo) -> None:
    def have(pool: str) -> int:
        return len(cluster.kubectl("get", "nodes", "-l", f"{pools.POOL_LABEL}={pool}", "-o", "name").stdout.split())

    missing = {role: max(0, want - have(role)) for role, want in counts.items()}
    cpu_missing = 0 if have("cpu") else 1
    if any(missing.values()) or cpu_missing:
        pools.add_pool_nodes(cluster, doc, missing, prefix=NODE_PREFIX, cpu_nodes=cpu_missing)
        added = [f"{n} {role}" for role, n in missing.items() if n] + ([f"{cpu_missing} cpu"] if cpu_missing else [])
        echo(f"added KWOK nodes: {', '.join(added)} (GPU racks of {pools.group_nodes(doc)}, "
             f"label {pools.rack_key(doc)})")


def _ensure_gpu_nodes(cluster: Cluster, count: int, echo: Echo) -> None:
    # Pool nodes (a multi-node example's) are tainted and kept for their roles: not counted here.
    have = [n for n in cluster.kubectl("get", "nodes", "-l", f"!{pools.POOL_LABEL}", "-o", "name").stdout.split()
            if n.removeprefix("node/").startswith(NODE_PREFIX)]
    if len(have) < count:
        added = cluster.add_gpu_nodes(count - len(have), prefix=NODE_PREFIX)
        echo(f"added KWOK GPU nodes: {', '.join(added)}")


def _install_crd(cluster: Cluster) -> None:
    from hisparse_operator.crd import crd_yaml

    cluster.kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}", "-f", "-",
                    input=crd_yaml())
    # kubectl wait fails at once (instead of waiting) while the new CRD has no status yet: poll.
    deadline = time.monotonic() + 60.0
    while True:
        res = cluster.kubectl("get", f"crd/{L.PLURAL}.{L.GROUP}", "-o",
                              "jsonpath={.status.conditions[?(@.type=='Established')].status}", check=False)
        if res.stdout.strip() == "True":
            return
        if time.monotonic() > deadline:
            raise DevError(f"the {L.KIND} CRD was not Established within 60s: {res.stderr.strip() or res.stdout}")
        time.sleep(0.5)


def _start_operator(cluster: Cluster, workdir: Path) -> OperatorProcess:
    webhook_port, metrics_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HISPARSE_WEBHOOK_PORT": str(webhook_port),
        "HISPARSE_WEBHOOK_HOST": "127.0.0.1",
        "HISPARSE_WEBHOOK_CERT_DIR": str(workdir / "operator-certs"),
        "HISPARSE_METRICS_PORT": str(metrics_port),
        "HISPARSE_METRICS_ADDR": "127.0.0.1",
    }
    env.pop("HISPARSE_PEERING", None)  # one local operator: standalone
    argv = [sys.executable, "-m", "hisparse_operator.cli", "operator", "run"]
    record, _ = procs.spawn("hisparse-operator", argv, workdir / "logs" / "operator.log", tie_to_parent=False, env=env)
    op = OperatorProcess(record, webhook_port, metrics_port)
    op.save(workdir)
    return op


def _metrics_up(op: OperatorProcess) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _process_alive(op: OperatorProcess) -> Callable[[], str | None]:
    """None while the host-process operator runs; else why not, with its log's last lines."""
    def alive() -> str | None:
        if op.running():
            return None
        return f"the operator exited; last lines of {op.record.log}:\n{procs.log_tail(op.record.log)}"
    return alive


def _pod_alive(release: OperatorRelease) -> Callable[[], str | None]:
    """None while an operator pod is Running (a restart in between is the kubelet's business)."""
    def alive() -> str | None:
        pods = release.pods()
        if any(p.get("status", {}).get("phase") == "Running" for p in pods):
            return None
        phases = {p["metadata"]["name"]: p.get("status", {}).get("phase") for p in pods}
        return f"no operator pod is Running ({phases or 'none'}); log:\n{release.logs()[-3000:]}"
    return alive


def _poll(what: str, alive: Callable[[], str | None], timeout: float, check: Callable[[], bool],
          detail: Callable[[], str] = str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        gone = alive()
        if gone is not None:
            raise DevError(f"{gone}\n(while waiting for {what})")
        if time.monotonic() > deadline:
            raise DevError(f"timed out after {timeout:.0f}s waiting for {what}{detail()}")
        time.sleep(0.5)


def _wait_operator(cluster: Cluster, op: OperatorProcess, timeout: float) -> None:
    def ready() -> bool:
        registered = cluster.kubectl("get", "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION,
                                     "--ignore-not-found", "-o", "name", check=False).stdout.strip()
        return bool(registered) and _metrics_up(op)

    _poll("the operator's webhook and metrics", _process_alive(op), timeout, ready,
          lambda: f"\nlast lines of {op.record.log}:\n{procs.log_tail(op.record.log)}")


def _apply_example(cluster: Cluster, doc: dict[str, Any], timeout: float, *, model_cache: bool = True) -> tuple[str, str]:
    """``model_cache``: give the model cache claim a static volume on the KWOK nodes (there is no provisioner
    here); False where the caller gave it one already (the CPU example's, on the real node)."""
    namespace = doc["metadata"]["namespace"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}))
    if model_cache:
        storage.provide_model_cache(cluster, doc)
    # The webhook configuration can be registered a moment before its server answers: retry briefly.
    deadline = time.monotonic() + min(timeout, 60.0)
    while True:
        try:
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
            return doc["metadata"]["name"], doc["metadata"]["namespace"]
        except KubectlError as e:
            if time.monotonic() > deadline or "denied the request" in e.stderr:
                raise DevError(f"kubectl apply of the example failed:\n{e.stderr.strip()}") from e
            time.sleep(1.0)


def _conditions(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    res = cluster.kubectl("get", "hsd", name, "-n", namespace, "-o", "json", check=False)
    if res.returncode:
        return {}
    status = json.loads(res.stdout).get("status") or {}
    return {c["type"]: f"{c['status']} ({c.get('reason', '')}: {c.get('message', '')})"
            for c in status.get("conditions", [])}


def _wait_ready(cluster: Cluster, alive: Callable[[], str | None], namespace: str, name: str,
                timeout: float) -> None:
    _poll(f"{namespace}/{name} to be Ready", alive, timeout,
          lambda: _conditions(cluster, namespace, name).get("Ready", "").startswith("True"),
          lambda: f"; conditions: {_conditions(cluster, namespace, name)}")


def _child_resources() -> str:
    from hisparse_operator.controller.kube import CHILD_KINDS
    from hisparse_operator.rbac import plural

    names = ["pods"]
    for api_version, kind in CHILD_KINDS:
        group = api_version.rpartition("/")[0]
        names.append(f"{plural(kind)}.{group}" if group else plural(kind))
    return ",".join(names)


# ---- status ------------------------------------------------------------------------------------------

def status(workdir: Path, *, echo: Echo = print) -> bool:
    """Print what runs; True when the cluster and the operator are all up."""
    workdir = workdir.expanduser().resolve()
    op = OperatorProcess.load(workdir)
    cluster = Cluster.attach(workdir) if ClusterState.load(workdir) is not None else None
    if cluster is None and op is None:
        echo(f"no dev cluster in {workdir} (start one with: hisparse dev up)")
        return False
    running = cluster.status() if cluster is not None else {}
    if cluster is not None:
        echo(f"cluster {cluster.server} (workdir {workdir})")
        for rec in cluster.processes:
            echo(f"  {rec.name:<24} pid {rec.pid:<8} {'running' if running[rec.name] else 'NOT RUNNING'}")
    else:
        echo(f"no dev cluster state in {workdir}")
    node = realnode.RealNode.attach(cluster) if cluster is not None else None
    if node is not None:
        for rec in node.processes:
            up_ = procs.is_running(rec)
            running[f"realnode/{rec.name}"] = up_
            echo(f"  {'realnode/' + rec.name:<24} pid {rec.pid:<8} {'running' if up_ else 'NOT RUNNING'}")
    release = OperatorRelease(cluster) if cluster is not None and running.get("kube-apiserver") else None
    pods = release.pods() if release is not None and release.cluster.helm_path and release.installed() else None
    if op is not None:
        running["hisparse-operator"] = op.running()
        echo(f"  {'hisparse-operator':<24} pid {op.record.pid:<8} "
             f"{'running' if running['hisparse-operator'] else 'NOT RUNNING'}  (log {op.record.log})")
    elif pods is not None and release is not None:
        for p in pods:
            phase = p.get("status", {}).get("phase", "?")
            running[f"pod/{p['metadata']['name']}"] = phase == "Running"
            echo(f"  {'hisparse-operator':<24} pod {release.namespace}/{p['metadata']['name']} {phase} on node "
                 f"{p['spec'].get('nodeName')} (Helm release {release.release})")
        if not pods:
            running["hisparse-operator"] = False
            echo(f"  {'hisparse-operator':<24} Helm release {release.release} has no pod")
    else:
        echo(f"  {'hisparse-operator':<24} not started")
    if cluster is not None and running.get("kube-apiserver"):
        res = cluster.kubectl("get", "hsd", "-A", check=False)
        echo("")
        echo((res.stdout or res.stderr).rstrip())
    return cluster is not None and (op is not None or bool(pods)) and all(running.values())


# ---- down --------------------------------------------------------------------------------------------

def _stop_operator(workdir: Path) -> procs.ProcRecord | None:
    op = OperatorProcess.load(workdir)
    if op is None:
        return None
    procs.stop(op.record, grace_s=STOP_GRACE_S)  # SIGTERM first: the operator withdraws its webhook
    (workdir / OPERATOR_STATE).unlink(missing_ok=True)
    return op.record


def down(workdir: Path, *, clean: bool = False, echo: Echo = print) -> None:
    """Stop the operator, then the cluster; fail if any of their processes is left."""
    workdir = workdir.expanduser().resolve()
    stopped = _stop_operator(workdir)
    if stopped is not None:
        echo(f"stopped the operator (pid {stopped.pid})")
    if ClusterState.load(workdir) is not None:
        cluster = Cluster.attach(workdir)
        node = realnode.RealNode.attach(cluster)
        try:
            cluster.stop(clean=clean)
        except ClusterError as e:
            raise DevError(f"{e}\nsee the logs in {workdir / 'logs'}") from e
        if node is not None:
            echo(f"stopped the real node (network namespace {node.netns} removed; no mounts, cgroups or "
                 "processes left)")
        echo(f"stopped the dev cluster in {workdir}")
    elif stopped is None:
        echo(f"nothing running from {workdir}")
    if clean:
        shutil.rmtree(workdir / "operator-certs", ignore_errors=True)
