"""Every version the dev cluster runs or installs, in one place.

The binaries themselves are pinned by the Go tools modules under
``e2e/tools/*/go.mod``; the constants here must agree with them, and
:mod:`._tools` refuses to start when they do not (so a bump cannot be half done).

Upstream CRDs are read at runtime from the Go module cache
(``go mod download -json MODULE@VERSION``), never copied into the repository.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "COREDNS_VERSION",
    "ETCD_VERSION",
    "HELM_VERSION",
    "KUBERNETES_VERSION",
    "KUBE_ROUTER_VERSION",
    "KWOK_VERSION",
    "LWS_VERSION",
    "PROMETHEUS_MODULE_VERSION",
    "PROMETHEUS_OPERATOR_VERSION",
    "PROMETHEUS_VERSION",
    "UPSTREAM_CRDS",
    "UpstreamCrds",
]

KUBERNETES_VERSION = "v1.35.4"
"""kube-apiserver, kube-controller-manager, kube-scheduler and kubectl, and the real node's kubelet,
kube-proxy and pause (e2e/tools/k8s)."""

COREDNS_VERSION = "v1.15.0"
"""CoreDNS, the real node's cluster DNS (e2e/tools/coredns)."""

ETCD_VERSION = "v3.6.16"
"""etcd server (e2e/tools/etcd)."""

KWOK_VERSION = "v0.8.0"
"""KWOK controller (e2e/tools/kwok); its default Stages are read from the same module."""

HELM_VERSION = "v3.21.4"
"""Helm (e2e/tools/helm), for chart lint, template and install tests."""

LWS_VERSION = "v0.9.0"
"""LeaderWorkerSet controller manager (e2e/tools/lws), the newest LWS release the module proxy
serves here; its CRD, webhook configurations and the manager all come from this one version."""

PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
"""The Prometheus Operator and its config reloader (e2e/tools/prometheus-operator); the monitoring CRDs
and the upstream manifests its deployment is made from are read from the same module."""

PROMETHEUS_VERSION = "v3.5.0"
"""Prometheus, run by the Prometheus Operator on the real node: the operator's default release (the newest of
its compatibility matrix), which its own module requires. The ``Prometheus`` resource declares it as
``spec.version``. Debian 12's package (2.42.0) cannot stand in: it is built without Kubernetes discovery."""

PROMETHEUS_MODULE_VERSION = "v0.305.0"
"""The Go module version Prometheus :data:`PROMETHEUS_VERSION` is published as (3.M.P is v0.3MM.P),
pinned by e2e/tools/prometheus."""


KUBE_ROUTER_VERSION = "v2.6.2"
"""kube-router (e2e/tools/kube-router), only its network policy controller: what enforces NetworkPolicies on
the real node when asked (iptables and ipsets; the kernel here lacks nftables' queue, which
kube-network-policies needs). k3s's fork, which keeps upstream's module path: the module proxy serves no
upstream release newer than v2.1.0 here."""


@dataclass(frozen=True)
class UpstreamCrds:
    """CRD manifests shipped inside a Go module."""

    module: str
    """Go module path, e.g. ``sigs.k8s.io/lws``."""
    version: str
    """Module version as the Go proxy serves it."""
    paths: tuple[str, ...]
    """YAML files or directories (every ``*.yaml`` directly inside) relative to the module root."""
    kinds: tuple[tuple[str, str, str], ...]
    """(group, version, kind) triples the installed CRDs must serve; tests check each one."""


UPSTREAM_CRDS: tuple[UpstreamCrds, ...] = (
    UpstreamCrds(
        module="sigs.k8s.io/lws",
        version=LWS_VERSION,
        # DisaggregatedSet too: the LWS manager watches it, and exits when a watched kind
        # stays unknown past its cache-sync timeout.
        paths=(
            "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
            "config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml",
        ),
        kinds=(
            ("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet"),
            ("disaggregatedset.x-k8s.io", "v1", "DisaggregatedSet"),
        ),
    ),
    UpstreamCrds(
        # v1.7.0 needs Go 1.27; v1.6.x is the newest that Go 1.26 resolves.
        module="sigs.k8s.io/gateway-api",
        version="v1.6.3",
        paths=("config/crd/standard",),
        kinds=(
            ("gateway.networking.k8s.io", "v1", "Gateway"),
            ("gateway.networking.k8s.io", "v1", "GatewayClass"),
            ("gateway.networking.k8s.io", "v1", "HTTPRoute"),
            ("gateway.networking.k8s.io", "v1", "GRPCRoute"),
        ),
    ),
    UpstreamCrds(
        module="sigs.k8s.io/gateway-api-inference-extension",
        version="v1.4.0",
        paths=("config/crd/bases",),
        kinds=(
            ("inference.networking.k8s.io", "v1", "InferencePool"),
            ("inference.networking.x-k8s.io", "v1alpha2", "InferenceObjective"),
        ),
    ),
    UpstreamCrds(
        module="github.com/prometheus-operator/prometheus-operator",
        version=PROMETHEUS_OPERATOR_VERSION,
        # Prometheus and Probe too: the operator's Prometheus controller watches both (it refuses to
        # run without the Prometheus kind and waits forever on an informer of a missing Probe kind).
        paths=(
            "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
            "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
            "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
            "example/prometheus-operator-crd/monitoring.coreos.com_prometheuses.yaml",
            "example/prometheus-operator-crd/monitoring.coreos.com_probes.yaml",
        ),
        kinds=(
            ("monitoring.coreos.com", "v1", "PodMonitor"),
            ("monitoring.coreos.com", "v1", "ServiceMonitor"),
            ("monitoring.coreos.com", "v1", "PrometheusRule"),
            ("monitoring.coreos.com", "v1", "Prometheus"),
            ("monitoring.coreos.com", "v1", "Probe"),
        ),
    ),
)
