"""The Prometheus Operator on the real node, and the Prometheus it runs there.

Made from upstream's own manifests in the pinned Go module (``example/rbac/prometheus-operator/``: the
operator's ServiceAccount, ClusterRole, binding and Deployment; ``example/rbac/prometheus/``: Prometheus's
ServiceAccount, ClusterRole and binding), read from the module cache like the monitoring CRDs, changed only
where this cluster differs from a connected one:

- the namespace (:data:`NAMESPACE`);
- the images: built here from their Go modules (:mod:`.images`: the operator, its config reloader and
  Prometheus, the release the operator's module requires), named by their local references and never
  pulled. Debian 12's ``prometheus`` package cannot serve: it is built without Kubernetes service
  discovery, and every scrape configuration the operator generates uses it (its 2.42 refuses the file:
  ``field kubernetes_sd_configs not found``);
- placement: every pod on the real node (its label and a toleration of its taint);
- the operator's flags: the local config reloader image; no ``--kubelet-service`` (nothing here scrapes
  kubelets, so the operator keeps no kubelet Endpoints).

The ``Prometheus`` resource (:func:`prometheus_object`) selects every ServiceMonitor, PodMonitor and
PrometheusRule of every namespace, as a cluster's one Prometheus would: the chart's ServiceMonitor and
PrometheusRule and the PodMonitors the operator renders for each HiSparseDeployment are consumed exactly
as in production. It declares the Prometheus release as ``spec.version``, so the operator generates flags
and configuration for that release.

Planning is pure (:func:`plan`); :class:`PrometheusStack` does the I/O and queries Prometheus from inside
the node's network namespace, the only place pod addresses exist. Failures raise
:class:`MonitoringError` naming the step, the cause and the fix.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from . import _gomod, versions
from .cluster import ClusterError
from .realnode import real_node_placement

if TYPE_CHECKING:
    from .cluster import Cluster
    from .realnode import RealNode

__all__ = ["APISERVER_METRICS", "IMAGES", "NAMESPACE", "PROMETHEUS_NAME", "MonitoringError", "PrometheusStack",
           "apiserver_monitor", "operator_objects", "plan", "prometheus_object", "self_monitor", "upstream_manifests"]

MODULE: Final = "github.com/prometheus-operator/prometheus-operator"
NAMESPACE: Final = "monitoring"
PROMETHEUS_NAME: Final = "hisparse"
"""The Prometheus resource; the operator names its StatefulSet ``prometheus-<name>`` and its governing
Service ``prometheus-operated``."""
PROMETHEUS_PORT: Final = 9090
OPERATOR_NAME: Final = "prometheus-operator"
PROMETHEUS_SA: Final = "prometheus"
IMAGES: Final = ("prometheus-operator", "prometheus-config-reloader", "prometheus")
"""Image names in :mod:`.images`."""
SCRAPE_INTERVAL: Final = "5s"
"""Short, so a test sees series within seconds; the rules are evaluated at the same interval."""
STACK_CPU_REQUEST: Final = "10m"
"""CPU requested by the Prometheus Operator and by Prometheus: little, so that beside the stack the real
node's 2 CPUs still schedule the CPU example's stable and candidate pods and a parity Job."""
RUN_AS: Final = 65534
"""Every container of the stack runs as nobody, as upstream's manifests run the operator."""

UPSTREAM_FILES: Final = (
    "example/rbac/prometheus-operator/prometheus-operator-service-account.yaml",
    "example/rbac/prometheus-operator/prometheus-operator-cluster-role.yaml",
    "example/rbac/prometheus-operator/prometheus-operator-cluster-role-binding.yaml",
    "example/rbac/prometheus-operator/prometheus-operator-deployment.yaml",
    "example/rbac/prometheus-operator/prometheus-operator-service.yaml",
    "example/rbac/prometheus/prometheus-service-account.yaml",
    "example/rbac/prometheus/prometheus-cluster-role.yaml",
    "example/rbac/prometheus/prometheus-cluster-role-binding.yaml",
)
"""Upstream's manifests the stack is made of (module-relative); its example ``Prometheus`` and
ServiceMonitor are not used: :func:`prometheus_object` and :func:`self_monitor` replace them."""

Echo = Callable[[str], None]


class MonitoringError(ClusterError):
    """The monitoring stack could not be planned, installed or queried."""

    def __init__(self, step: str, cause: str, fix: str) -> None:
        self.step, self.cause, self.fix = step, cause, fix
        super().__init__(f"monitoring: {step} failed: {cause}\nfix: {fix}")


def upstream_manifests() -> list[dict[str, Any]]:
    """:data:`UPSTREAM_FILES` from the pinned module, in order."""
    try:
        root = _gomod.module_dir(MODULE, versions.PROMETHEUS_OPERATOR_VERSION)
        return _gomod.load_documents(_gomod.yaml_files(root, UPSTREAM_FILES))
    except _gomod.GoModuleError as e:
        raise MonitoringError("read upstream's manifests", str(e),
                              "check that the Go module proxy serves "
                              f"{MODULE}@{versions.PROMETHEUS_OPERATOR_VERSION} (scripts/setup downloads it)") from e


def _place(pod_spec: dict[str, Any]) -> None:
    placement = real_node_placement()
    pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **placement["nodeSelector"]}
    pod_spec["tolerations"] = [*(pod_spec.get("tolerations") or []), *placement["tolerations"]]


def operator_objects(manifests: list[dict[str, Any]], images: Mapping[str, str],
                     namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Upstream's objects with this cluster's namespace, images and placement (see the module's doc)."""
    out = []
    for doc in copy.deepcopy(manifests):
        kind = doc["kind"]
        if kind in ("ServiceAccount", "Deployment", "Service"):
            doc["metadata"]["namespace"] = namespace
        if kind == "ClusterRoleBinding":
            for subject in doc["subjects"]:
                subject["namespace"] = namespace
        if kind == "Deployment":
            spec = doc["spec"]["template"]["spec"]
            (container,) = spec["containers"]
            container["image"] = images["prometheus-operator"]
            container["imagePullPolicy"] = "Never"
            args = [a for a in container.get("args", []) if not a.startswith(("--kubelet-", "--prometheus-config-reloader="))]
            container["args"] = [*args, f"--prometheus-config-reloader={images['prometheus-config-reloader']}"]
            # Upstream asks for 100m; the real node's 2 CPUs must still hold the CPU example's pods, a
            # candidate's and its parity Job (500m) beside this stack.
            container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = STACK_CPU_REQUEST
            _place(spec)
        out.append(doc)
    kinds = sorted(d["kind"] for d in out)
    if kinds.count("Deployment") != 1 or kinds.count("ClusterRole") != 2:
        raise MonitoringError("read upstream's manifests", f"expected one Deployment and two ClusterRoles, got {kinds}",
                              f"the layout of {MODULE}'s example/rbac changed: update UPSTREAM_FILES")
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, *out]


def prometheus_object(image: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """One Prometheus on the real node selecting every monitor and rule of every namespace."""
    spec: dict[str, Any] = {
        "image": image,
        "imagePullPolicy": "Never",
        "version": versions.PROMETHEUS_VERSION,
        "replicas": 1,
        "serviceAccountName": PROMETHEUS_SA,
        "scrapeInterval": SCRAPE_INTERVAL,
        "evaluationInterval": SCRAPE_INTERVAL,
        "retention": "2h",
        # The dev cluster publishes the ``kubernetes`` Service's endpoint as an EndpointSlice only (its
        # apiserver runs with --endpoint-reconciler-type=none), as current clusters do.
        "serviceDiscoveryRole": "EndpointSlice",
        "serviceMonitorSelector": {}, "serviceMonitorNamespaceSelector": {},
        "podMonitorSelector": {}, "podMonitorNamespaceSelector": {},
        "ruleSelector": {}, "ruleNamespaceSelector": {},
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS},
        "resources": {"requests": {"cpu": STACK_CPU_REQUEST, "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
    }
    _place(spec)
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
            "metadata": {"name": PROMETHEUS_NAME, "namespace": namespace}, "spec": spec}


def self_monitor(namespace: str = NAMESPACE) -> dict[str, Any]:
    """A PodMonitor of the Prometheus Operator's own metrics (its ``http`` port), the first real target."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": {"name": OPERATOR_NAME, "namespace": namespace},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": OPERATOR_NAME}},
                     "podMetricsEndpoints": [{"port": "http", "path": "/metrics"}]}}


APISERVER_METRICS: Final = "apiserver_admission_webhook_.*"
"""What is kept of the apiserver's metrics: the admission webhook series an alert watches (the rest is
thousands of series a 2-core machine need not store)."""


def apiserver_monitor(namespace: str = NAMESPACE) -> dict[str, Any]:
    """The apiserver scraped through the ``kubernetes`` Service as kube-prometheus does: HTTPS with the
    pod's ServiceAccount token (Prometheus's ClusterRole grants ``get`` on ``/metrics``) and the cluster
    CA, the certificate checked for the Service's name."""
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": "apiserver", "namespace": namespace},
            "spec": {"namespaceSelector": {"matchNames": ["default"]},
                     "selector": {"matchLabels": {"component": "apiserver", "provider": "kubernetes"}},
                     "endpoints": [{"port": "https", "scheme": "https", "bearerTokenFile": f"{sa}/token",
                                    "tlsConfig": {"caFile": f"{sa}/ca.crt", "serverName": "kubernetes"},
                                    "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": APISERVER_METRICS,
                                                           "action": "keep"}]}]}}


def plan(images: Mapping[str, str], namespace: str = NAMESPACE,
         manifests: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every object of the stack, in apply order."""
    missing = [name for name in IMAGES if name not in images]
    if missing:
        raise MonitoringError("plan", f"no image reference for {missing}", "load the images first (images.load)")
    docs = manifests if manifests is not None else upstream_manifests()
    return [*operator_objects(docs, images, namespace), prometheus_object(images["prometheus"], namespace),
            self_monitor(namespace), apiserver_monitor(namespace)]


class PrometheusStack:
    """The stack on one cluster's real node: install, wait, query, remove."""

    def __init__(self, cluster: Cluster, node: RealNode, *, namespace: str = NAMESPACE, timeout: float = 300.0) -> None:
        self.cluster, self.node, self.namespace, self.timeout = cluster, node, namespace, timeout
        self.images: dict[str, str] = {}

    # ---- install -----------------------------------------------------------------------------------

    def load_images(self, echo: Echo = print) -> dict[str, str]:
        from . import images

        try:
            self.images = images.load(self.node.import_image, IMAGES, echo=echo)
        except images.ImageError as e:
            raise MonitoringError("build and load the monitoring images", str(e), e.fix) from e
        return self.images

    def install(self, echo: Echo = print) -> None:
        """Load the images, apply the plan, and wait until Prometheus answers and scrapes the operator."""
        if not self.images:
            self.load_images(echo)
        started = time.monotonic()
        self.cluster.apply(plan(self.images, self.namespace))
        self._wait("the Prometheus Operator Deployment available", lambda: self._kubectl_ok(
            "wait", "-n", self.namespace, "--for=condition=Available", f"deployment/{OPERATOR_NAME}", "--timeout=5s"))
        self._wait(f"pod {self.pod_name} Ready (the StatefulSet the operator made)", lambda: self._kubectl_ok(
            "wait", "-n", self.namespace, "--for=condition=Ready", f"pod/{self.pod_name}", "--timeout=5s"))
        self._wait("Prometheus ready", lambda: self.get("/-/ready", raw=True) is not None)
        echo(f"monitoring: Prometheus {versions.PROMETHEUS_VERSION} run by the Prometheus Operator "
             f"{versions.PROMETHEUS_OPERATOR_VERSION} on the real node in {time.monotonic() - started:.0f}s")

    def uninstall(self) -> None:
        self.cluster.kubectl("delete", "prometheus", PROMETHEUS_NAME, "-n", self.namespace, "--ignore-not-found",
                             "--wait=true", "--timeout=120s", check=False)
        self.cluster.kubectl("delete", "namespace", self.namespace, "--ignore-not-found", "--wait=true",
                             "--timeout=180s", check=False)
        for kind, name in (("clusterrolebinding", OPERATOR_NAME), ("clusterrole", OPERATOR_NAME),
                           ("clusterrolebinding", PROMETHEUS_SA), ("clusterrole", PROMETHEUS_SA)):
            self.cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)

    # ---- the pod and its API -------------------------------------------------------------------------

    @property
    def pod_name(self) -> str:
        return f"prometheus-{PROMETHEUS_NAME}-0"

    def pod(self) -> dict[str, Any]:
        return dict(json.loads(self.cluster.kubectl("get", "pod", self.pod_name, "-n", self.namespace,
                                                    "-o", "json").stdout))

    def url(self, path: str) -> str:
        ip = self.pod()["status"].get("podIP")
        if not ip:
            raise MonitoringError("find Prometheus", f"pod {self.pod_name} has no IP yet", "wait for it to start")
        return f"http://{ip}:{PROMETHEUS_PORT}{path}"

    def get(self, path: str, params: Mapping[str, str] | None = None, *, raw: bool = False) -> Any:
        """GET ``path`` of Prometheus's HTTP API from inside the node's network namespace. Returns the
        ``data`` of an API answer (raises on ``status: error``), the body with ``raw``, or None when
        Prometheus does not answer."""
        from urllib.parse import urlencode

        url = self.url(path) + (f"?{urlencode(params)}" if params else "")
        script = ("import sys, urllib.request, urllib.error\n"
                  "try:\n    r = urllib.request.urlopen(sys.argv[1], timeout=20); sys.stdout.write(r.read().decode())\n"
                  "except urllib.error.HTTPError as e:\n    sys.stdout.write(e.read().decode())\n"
                  "except OSError as e:\n    sys.stderr.write(str(e)); sys.exit(3)\n")
        res = subprocess.run(["nsenter", f"--net={self.node.names.netns_path}", "--", sys.executable, "-c", script, url],
                             capture_output=True, text=True, timeout=60, check=False)
        if res.returncode == 3:
            return None
        if res.returncode:
            raise MonitoringError(f"GET {path}", res.stderr.strip()[-500:], "run as root with the real node started")
        if raw:
            return res.stdout
        body = json.loads(res.stdout)
        if body.get("status") != "success":
            raise MonitoringError(f"GET {path}", f"{body.get('errorType')}: {body.get('error')}",
                                  "the query or the request is wrong: see the error")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; the result's series (a scalar comes back as one unlabelled series)."""
        data = self.get("/api/v1/query", {"query": expr})
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/targets", {"state": "active"})["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        return [r for g in self.get("/api/v1/rules")["groups"] for r in g["rules"]]

    def wait_for(self, what: str, ok: Callable[[], bool], timeout: float | None = None) -> None:
        self._wait(what, ok, timeout)

    def diagnosis(self) -> str:
        pods = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-o", "wide", check=False).stdout
        events = self.cluster.kubectl("get", "events", "-n", self.namespace, "--sort-by=.lastTimestamp",
                                      check=False).stdout
        log = self.cluster.kubectl("logs", "-n", self.namespace, f"deployment/{OPERATOR_NAME}", "--tail=25",
                                   check=False).stdout
        return f"pods:\n{pods}\nevents (last lines):\n{chr(10).join(events.splitlines()[-15:])}\n" \
               f"Prometheus Operator log (last lines):\n{log}"

    def _kubectl_ok(self, *args: str) -> bool:
        return self.cluster.kubectl(*args, check=False).returncode == 0

    def _wait(self, what: str, ok: Callable[[], bool], timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            try:
                if ok():
                    return
            except MonitoringError:
                pass
            if time.monotonic() > deadline:
                raise MonitoringError(f"wait for {what}", f"not within {timeout or self.timeout:.0f}s\n{self.diagnosis()}",
                                      "read the events and the Prometheus Operator's log above")
            time.sleep(1.0)


def module_root() -> Path:
    """The pinned module's directory in the Go module cache (for tests that read upstream files)."""
    return _gomod.module_dir(MODULE, versions.PROMETHEUS_OPERATOR_VERSION)
