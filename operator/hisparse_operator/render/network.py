"""NetworkPolicies of one fleet: ingress to every pod of the deployment is denied, then allowed only on the
paths serving needs.

| to                 | from                                                         | ports                      |
|--------------------|--------------------------------------------------------------|----------------------------|
| every pod          | nothing (``<name>-deny-ingress``), except:                   |                            |
| prefill            | decode pods and prefill pods of the same fleet               | all (NIXL side channel and |
|                    |                                                              | UCX data ports, vLLM, link |
|                    |                                                              | check, group traffic)      |
| prefill            | the fleet's EPP, the monitoring namespaces                   | vLLM (API and /metrics)    |
| decode             | decode pods of the same fleet                                | all (a group's DP/EP)      |
| decode             | the gateway's pods and networks, the client namespaces, the  | the serving port           |
|                    | EPP, parity Job pods                                         |                            |
| decode             | the monitoring namespaces                                    | serving and vLLM ports     |
| EPP                | the gateway's pods and networks                              | ext_proc gRPC              |
| EPP                | the monitoring namespaces                                    | metrics                    |
| Mooncake master    | prefill pods of the same fleet                               | RPC, metadata              |
| Mooncake master    | the monitoring namespaces                                    | metrics                    |

Why "all ports" between P/D pods: NIXL over UCX's TCP transport opens data connections to ports the
agents choose at run time (the side channel only carries metadata), and a multi-node group's DP/EP
traffic (NCCL, torch.distributed) uses ports of its own; RDMA traffic does not pass these rules at all.
Selectors use the fleet's own labels (``serving.hisparse.dev/deployment`` is the fleet's base name:
``<name>``, or ``<name>-<revision>`` for a fleet a canary started), so a candidate's decode pods reach
only the candidate's prefill pods, as routing pairs them. The parity Job's pod (selected by the
resource's instance label) reaches the serving port of both fleets.
The gateway's pods are those of ``gatewayNamespaces`` (else ``gatewayRef``'s namespace; with neither,
none, and ``GatewayAdmitted`` says so) that ``gatewayPodLabels`` selects: by default, for a ``gatewayRef`` with no namespaces set,
the Gateway API label an implementation puts on the proxies of that Gateway (GEP-1762), so the other pods
of a shared namespace are kept out; ``gatewayCIDRs`` admit proxies that are not pods (``ipBlock``).
Traffic from a pod's own node (kubelet probes) is always allowed by Kubernetes' rules.

Egress (``networkPolicy.egress.enabled``, off by default) is restricted for the serving pods only:

| from            | to                                                              | ports                  |
|-----------------|-----------------------------------------------------------------|------------------------|
| prefill, decode | prefill and decode pods of the same fleet                       | all (as above; both    |
|                 |                                                                 | ways, as UCX may dial) |
| prefill         | the fleet's Mooncake master                                     | RPC, metadata          |
| prefill, decode | the cluster DNS (``dnsNamespaces`` pods, ``dnsCIDRs``)          | ``dnsPorts``, UDP, TCP |
| prefill, decode | the model source, only where the pods read it themselves        | ``modelSourcePorts``   |
|                 | (``s3://``; ``hf://`` with ``NodeCache`` or ``PodEphemeral``)   |                        |

Nothing else: not the apiserver (vLLM and the sidecar with its SSRF guard off never call it), not another
deployment, not the internet. The EPP (it watches the apiserver), the parity Job and the download Job keep
unrestricted egress; none of them takes a request that could name a destination.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit

from hisparse_runtime.engine import MOONCAKE_MASTER_PORT, MOONCAKE_METADATA_PORT, SERVICE_PORT, RoleSettings

from ..api import HiSparseDeployment, labels as L
from .common import meta, obj
from .mooncake import COMPONENT as MOONCAKE, MASTER_METRICS_PORT, needs_master
from .routing import EPP_GRPC_PORT, EPP_METRICS_PORT
from .workloads import component, has_sidecar

API: Final = "networking.k8s.io/v1"
EPP: Final = "epp"
PARITY: Final = "parity"
NAMESPACE_LABEL: Final = "kubernetes.io/metadata.name"
"""Set by the apiserver on every namespace: selects a namespace by name."""


def _pods(d: HiSparseDeployment, comp: str | None = None) -> dict[str, Any]:
    labels = {L.DEPLOYMENT: d.name}
    if comp is not None:
        labels[L.APP_COMPONENT] = comp
    return {"podSelector": {"matchLabels": labels}}


def _namespaces(names: list[str]) -> list[dict[str, Any]]:
    return [{"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: n}}} for n in sorted(set(names))]


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in sorted(set(ports))]


def gateway_namespaces(d: HiSparseDeployment) -> list[str]:
    """Where the gateway's proxies run: the setting, else the namespace of ``routing.gatewayRef`` (the
    deployment's own for a reference without one); with neither, none: a gateway nothing names is not
    assumed to be any pod of the deployment's namespace."""
    n = d.spec.network_policy
    if n.gateway_namespaces:
        return list(n.gateway_namespaces)
    ref = d.spec.routing.gateway_ref
    if ref is None:
        return []
    return [ref.namespace or d.namespace or "default"]


def gateway_pod_labels(d: HiSparseDeployment) -> dict[str, str]:
    """Labels the gateway's proxy pods carry: the setting, else for a ``gatewayRef`` whose namespace is the
    gateway namespace, Gateway API's label for the proxies of that Gateway; else none (every pod)."""
    n = d.spec.network_policy
    if n.gateway_pod_labels is not None:
        return dict(n.gateway_pod_labels)
    ref = d.spec.routing.gateway_ref
    return {L.GATEWAY_NAME: ref.name} if ref is not None and not n.gateway_namespaces else {}


def gateway_peers(d: HiSparseDeployment) -> list[dict[str, Any]]:
    """The gateway's proxies as NetworkPolicy peers: its pods (namespace and labels) and its networks."""
    labels = gateway_pod_labels(d)
    pods = [{**ns, "podSelector": {"matchLabels": labels}} if labels else ns
            for ns in _namespaces(gateway_namespaces(d))]
    return [*pods, *({"ipBlock": {"cidr": c}} for c in d.spec.network_policy.gateway_cidrs)]


def _policy(d: HiSparseDeployment, suffix: str, comp: str | None, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    # No rules: deny all ingress. The key is left out then, as the apiserver stores it (an empty list
    # would read as drift on every reconcile).
    spec = {**_pods(d, comp), "policyTypes": ["Ingress"], **({"ingress": ingress} if ingress else {})}
    return obj(API, "NetworkPolicy", meta(d, f"{d.name}-{suffix}", comp or "network"), spec=spec)


def model_source_ports(d: HiSparseDeployment) -> list[int]:
    """The model source's TCP ports for egress: the setting, else ``model.endpoint``'s (by its scheme when
    it names none), else HTTPS."""
    e, model = d.spec.network_policy.egress, d.spec.model
    if e.model_source_ports:
        return sorted(set(e.model_source_ports))
    if model.scheme == "hf" and model.endpoint:
        url = urlsplit(model.endpoint)
        return [url.port or (443 if url.scheme == "https" else 80)]
    return [443]


def _egress_policy(d: HiSparseDeployment, role: str, egress: list[dict[str, Any]]) -> dict[str, Any]:
    comp = component(role)
    spec = {**_pods(d, comp), "policyTypes": ["Egress"], "egress": egress}
    return obj(API, "NetworkPolicy", meta(d, f"{d.name}-{role}-egress", comp), spec=spec)


def egress_policies(d: HiSparseDeployment, roles: dict[str, RoleSettings]) -> list[dict[str, Any]]:
    """The serving pods' egress (see the module's second table); none unless ``egress.enabled``."""
    e = d.spec.network_policy.egress
    if not (d.spec.network_policy.enabled and e.enabled):
        return []
    fleet = [_pods(d, component(r)) for r in sorted(roles)]
    dns = [*({**ns, "podSelector": {"matchLabels": dict(e.dns_pod_labels)}} for ns in _namespaces(list(e.dns_namespaces))),
           *({"ipBlock": {"cidr": c}} for c in e.dns_cidrs)]
    dns_ports = [{"protocol": proto, "port": p} for p in sorted(set(e.dns_ports)) for proto in ("UDP", "TCP")]
    common: list[dict[str, Any]] = [{"to": fleet}, {"to": dns, "ports": dns_ports}]
    if d.spec.model.read_by_serving_pods:
        labels = dict(e.model_source_pod_labels)
        source = [*({**ns, "podSelector": {"matchLabels": labels}} if labels else ns
                    for ns in _namespaces(list(e.model_source_namespaces))),
                  *({"ipBlock": {"cidr": c}} for c in e.model_source_cidrs)]
        common.append({"to": source, "ports": _tcp(*model_source_ports(d))})
    out = []
    for role in sorted(roles):
        rules = list(common)
        if role == "prefill" and needs_master(d):
            rules.insert(1, {"to": [_pods(d, MOONCAKE)], "ports": _tcp(MOONCAKE_MASTER_PORT, MOONCAKE_METADATA_PORT)})
        out.append(_egress_policy(d, role, rules))
    return out


def network_policies(d: HiSparseDeployment, roles: dict[str, RoleSettings]) -> list[dict[str, Any]]:
    n = d.spec.network_policy
    if not n.enabled:
        return []
    monitoring = _namespaces(list(n.monitoring_namespaces))
    out = [_policy(d, "deny-ingress", None, [])]
    decode = roles["decode"]
    prefill = roles.get("prefill")
    routing = d.spec.routing.enabled
    if prefill is not None:
        ingress: list[dict[str, Any]] = [{"from": [_pods(d, component("decode")), _pods(d, component("prefill"))]}]
        if routing:
            ingress.append({"from": [_pods(d, EPP)], "ports": _tcp(prefill.vllm_port)})
        if monitoring:
            ingress.append({"from": monitoring, "ports": _tcp(prefill.vllm_port)})
        out.append(_policy(d, "prefill-ingress", component("prefill"), ingress))
    serving = SERVICE_PORT if has_sidecar(d, decode) else decode.vllm_port
    callers = [*gateway_peers(d), *_namespaces(list(n.client_namespaces)),
               # the parity Job's pod, whichever fleet it runs for, reaches both fleets
               {"podSelector": {"matchLabels": {L.APP_INSTANCE: d.owner_name, L.APP_COMPONENT: PARITY}}}]
    if routing:
        callers.append(_pods(d, EPP))
    ingress = [{"from": [_pods(d, component("decode"))]}, {"from": callers, "ports": _tcp(serving)}]
    if monitoring:
        ingress.append({"from": monitoring, "ports": _tcp(serving, decode.vllm_port)})
    out.append(_policy(d, "decode-ingress", component("decode"), ingress))
    if routing:
        # An empty "from" admits every source: with no gateway named, no rule at all.
        gateway = gateway_peers(d)
        ingress = [{"from": gateway, "ports": _tcp(EPP_GRPC_PORT)}] if gateway else []
        if monitoring:
            ingress.append({"from": monitoring, "ports": _tcp(EPP_METRICS_PORT)})
        out.append(_policy(d, "epp-ingress", EPP, ingress))
    if needs_master(d):
        ingress = [{"from": [_pods(d, component("prefill"))], "ports": _tcp(MOONCAKE_MASTER_PORT, MOONCAKE_METADATA_PORT)}]
        if monitoring:
            ingress.append({"from": monitoring, "ports": _tcp(MASTER_METRICS_PORT)})
        out.append(_policy(d, "mooncake-ingress", MOONCAKE, ingress))
    return out + egress_policies(d, roles)
