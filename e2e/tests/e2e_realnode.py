"""Helpers for the real-node suites: the smallest image they need (Debian's static busybox), pods on
the real node, and waiting for them."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from hisparse_devcluster import Cluster
from hisparse_devcluster.realnode import real_node_placement, write_image_archive

BUSYBOX_IMAGE = "localhost/hisparse-e2e-busybox:1"
BUSYBOX = Path("/bin/busybox")
"""Debian's busybox-static (scripts/setup installs it): one static binary, so a one-layer image."""


def busybox_archive(out: Path, *, kubectl: Path | None = None) -> Path:
    """An image of just busybox (``/bin/sh`` and ``/bin/busybox``) as a docker-archive tar, with the
    cluster's own static ``kubectl`` as ``/bin/kubectl`` when given: busybox's wget cannot speak TLS
    with the apiserver (its TLS lacks ECDSA), and kubectl is the in-cluster client that verifies the
    apiserver's certificate and resolves names with Go's own resolver."""
    if not BUSYBOX.is_file():
        raise FileNotFoundError(f"{BUSYBOX} is missing: install Debian's busybox-static (scripts/setup does)")
    root = out.parent / "busybox-rootfs"
    shutil.rmtree(root, ignore_errors=True)
    (root / "bin").mkdir(parents=True)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    (root / "bin" / "sh").symlink_to("busybox")
    if kubectl is not None:
        shutil.copy2(kubectl, root / "bin" / "kubectl")
    return write_image_archive(out, BUSYBOX_IMAGE, root, entrypoint=[], cmd=["/bin/sh"])


def busybox_pod(name: str, namespace: str, script: str, *, labels: dict[str, str] | None = None,
                port: int | None = None, grace_s: int = 1) -> dict[str, Any]:
    """A pod on the real node running ``script`` under busybox's sh, unprivileged."""
    container: dict[str, Any] = {
        "name": "main",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/busybox", "sh", "-c", script],
        "env": [{"name": "HOME", "value": "/tmp"}],  # kubectl's cache
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
    }
    if port is not None:
        container["ports"] = [{"containerPort": port}]
        container["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 1}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {**real_node_placement(), "terminationGracePeriodSeconds": grace_s,
                 "containers": [container]},
    }


def wait_pods_ready(cluster: Cluster, namespace: str, names: list[str], timeout: float = 120.0) -> None:
    res = cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"--timeout={int(timeout)}s",
                          *[f"pod/{n}" for n in names], check=False, timeout=timeout + 30)
    if res.returncode:
        detail = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
        events = cluster.kubectl("get", "events", "-n", namespace, check=False).stdout
        raise AssertionError(f"pods {names} not Ready in {timeout:.0f}s: {res.stderr}\n{detail}\n{events}")


def pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)  # type: ignore[no-any-return]


def sh(cluster: Cluster, namespace: str, name: str, script: str, timeout: float = 60.0) -> str:
    """Run ``script`` in the pod (kubectl exec: apiserver -> kubelet -> containerd) and return stdout."""
    return cluster.kubectl("exec", "-n", namespace, name, "--", "/bin/busybox", "sh", "-c", script,
                           timeout=timeout).stdout


def until(what: str, check: Any, timeout: float = 60.0, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
