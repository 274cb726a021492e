"""Helpers for the real-node suites: the smallest image they need (Debian's static busybox), pods on
the real node, and waiting for them."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from hisparse_devcluster import Cluster
from hisparse_operator.api import labels as L
from hisparse_devcluster.realnode import RealNode, real_node_placement, write_image_archive

REPO = Path(__file__).resolve().parents[2]

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


def epp_address(cluster: Cluster, namespace: str, pool: str) -> str:
    """Where a gateway sends ext_proc for the InferencePool ``pool``: the Service its ``endpointPickerRef``
    names, at its ClusterIP (kube-proxy on the node picks a ready EPP pod for each connection)."""
    ref = json.loads(cluster.kubectl("get", "inferencepool", pool, "-n", namespace, "-o", "json").stdout)["spec"][
        "endpointPickerRef"]
    svc = json.loads(cluster.kubectl("get", "service", ref["name"], "-n", namespace, "-o", "json").stdout)
    return f"{svc['spec']['clusterIP']}:{ref['port']['number']}"


def _standin_argv(cluster: Cluster, node: RealNode, namespace: str, pool: str, timeout_s: int) -> list[str]:
    from hisparse_devcluster.realnode import POD_SUBNET

    return ["nsenter", f"--net={node.names.netns_path}", "--", str(_standin()),
            f"-epp={epp_address(cluster, namespace, pool)}", f"-allow-cidr={POD_SUBNET}", f"-timeout={timeout_s}s"]


def via_envoy_standin(cluster: Cluster, node: RealNode, namespace: str, model: str, prompt: str,
                      max_tokens: int, *, pool: str) -> dict[str, Any]:
    """One completion through llm-d as a gateway sends it: ``envoy-standin`` (the STAND-IN FOR ENVOY,
    e2e/tools/llmd) in the node's network namespace speaks ext_proc to the EPP Service of the InferencePool
    ``pool``, then sends the request where the EPP said, with the headers it set. Returns the stand-in's JSON
    (status, destination, headers, body)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "return_token_ids": True})
    r = subprocess.run(_standin_argv(cluster, node, namespace, pool, 120), input=body, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, f"envoy-standin failed: {r.stderr}\n" + cluster.kubectl(
        "logs", "-n", namespace, "-l", f"{L.APP_COMPONENT}=epp", "--tail=40", "--prefix", check=False).stdout
    return dict(json.loads(r.stdout))


class LlmdLoad:
    """A bounded client load through llm-d as a gateway sends it (the STAND-IN FOR ENVOY, as in
    :func:`via_envoy_standin`, to the EPP Service of the InferencePool ``pool``, read again every 2 s), on a
    thread: one completion at a time, back to back, each alternating a short
    prompt (decode alone) and one over the P/D threshold (prefill, then a NIXL pull), until :meth:`stop`.
    Every result is kept, with when it started and where the EPP sent it."""

    RESOLVE_S = 2.0
    """Seconds between reads of the InferencePool's EPP Service."""

    def __init__(self, cluster: Cluster, node: RealNode, namespace: str, model: str, long_prompt: str, *,
                 pool: str) -> None:
        self._where = (cluster, node, namespace, pool)
        self._argv = _standin_argv(cluster, node, namespace, pool, 60)
        self._resolved = time.monotonic()
        self._bodies = [json.dumps({"model": model, "prompt": p, "max_tokens": 4, "temperature": 0})
                        for p in ("short prompt", long_prompt)]
        self.results: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmd-load", daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            started = time.monotonic()
            if started - self._resolved > self.RESOLVE_S:
                # As a gateway follows the InferencePool: a promotion re-points it at another fleet's EPP.
                try:
                    self._argv = _standin_argv(*self._where, 60)
                except (subprocess.SubprocessError, KeyError, ValueError):
                    pass  # the apiserver busy: the last address stands, and the request's result says if it still works
                self._resolved = started
            r = subprocess.run(self._argv, input=self._bodies[i % 2], capture_output=True, text=True, timeout=120)
            try:
                out = json.loads(r.stdout) if r.returncode == 0 else {}
            except json.JSONDecodeError:
                out = {}
            epp = next(a for a in self._argv if a.startswith("-epp=")).removeprefix("-epp=")
            self.results.append({"at": started, "epp": epp, "rc": r.returncode, "status": out.get("status"),
                                 "destination": out.get("destination"), "eppStatus": out.get("eppStatus"),
                                 "error": r.stderr[-400:] if r.returncode else ""})
            i += 1

    def __enter__(self) -> LlmdLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(timeout=180)
        return self.results

    @staticmethod
    def failed(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in results if r["rc"] != 0 or r["status"] != 200]


def _standin() -> Path:
    env = dict(line.split("=", 1) for line in subprocess.run(
        ["bash", str(REPO / "e2e" / "tools" / "build.sh"), "--print-env"], capture_output=True, text=True,
        check=True).stdout.splitlines() if "=" in line)
    return Path(env["HISPARSE_LLMD_BIN"]) / "envoy-standin"


SERVICE_LOAD = """
import json, sys, time, urllib.request
url, body, seconds = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])
end = time.monotonic() + seconds if seconds > 0 else float("inf")
while time.monotonic() < end:
    r = {"at": time.time()}
    try:
        req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            r.update(status=resp.status, tokens=len(json.loads(resp.read())["choices"][0].get("token_ids") or []))
    except Exception as e:
        r.update(status=getattr(e, "code", None), error=repr(e)[:300])
        time.sleep(0.2)
    r["end"] = time.time()
    print(json.dumps(r), flush=True)
"""
"""A bounded client load from inside a pod: completions back to back to ``url`` for ``seconds`` (0: until the
process or its pod goes), one JSON line per result as it ends (wall-clock start and end, HTTP status, tokens
returned, the error): read them with :func:`load_results`."""


def load_results(out: str) -> list[dict[str, Any]]:
    """The results :data:`SERVICE_LOAD` printed."""
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]
