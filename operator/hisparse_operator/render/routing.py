"""llm-d routing: InferencePool v1, the EPP (Deployment, Service, config, RBAC), HTTPRoute, and the
decode sidecar's RBAC. Shapes follow stock llm-d so its scheduler and sidecar work unchanged."""

from __future__ import annotations

from typing import Any, Final

import yaml
from hisparse_runtime.engine import SERVICE_PORT, RoleSettings, kv_compat_hash

from .. import names
from ..api import HiSparseDeployment, labels as L, llmd
from ..api.spec import PRE_STOP_SLEEP_SECONDS
from .common import RESTRICTED_CONTAINER, meta, obj, resources, selector_labels, support_placement
from .workloads import has_sidecar, sidecar_service_account

INFERENCE_API: Final = "inference.networking.k8s.io/v1"
INFERENCE_GROUP: Final = "inference.networking.k8s.io"
INFERENCE_X_GROUP: Final = "inference.networking.x-k8s.io"
EPP_GRPC_PORT: Final = 9002
EPP_HEALTH_PORT: Final = 9003
EPP_METRICS_PORT: Final = 9090
EPP_CONFIG_FILE: Final = "epp-config.yaml"
ROUTE_REQUEST_TIMEOUT_SECONDS: Final = 600
"""The HTTPRoute's request timeout: the longest a request, and so its ext_proc stream to an EPP, can last."""
EPP_PRE_STOP_SECONDS: Final = PRE_STOP_SLEEP_SECONDS
"""Seconds a deleted EPP pod keeps taking new ext_proc streams (a ``preStop`` sleep) while the gateway and
kube-proxy drop it from the EPP Service's endpoints."""


def pool_selector(d: HiSparseDeployment, decode: RoleSettings) -> dict[str, str]:
    """Serving pods of this deployment *and this KV build*: P and D of different builds never pair."""
    return {L.DEPLOYMENT: d.name, L.LLMD_INFERENCE_SERVING: "true", L.KV_COMPAT: kv_compat_hash(decode)}


def inference_pool(d: HiSparseDeployment, decode: RoleSettings) -> dict[str, Any]:
    # llm-d's port (the decode sidecar's and prefill's vLLM); a decode without prefill has no sidecar
    # and its vLLM serves on its own port.
    port = SERVICE_PORT if has_sidecar(d, decode) else decode.vllm_port
    return obj(INFERENCE_API, "InferencePool", meta(d, names.inference_pool(d.name), "router"), spec={
        "selector": {"matchLabels": pool_selector(d, decode)},
        "targetPorts": [{"number": port}],
        "endpointPickerRef": {
            "kind": "Service",
            "name": names.epp(d.name),
            "port": {"number": EPP_GRPC_PORT},
            "failureMode": d.spec.routing.failure_mode,
        },
    })


def prefix_block_chars(d: HiSparseDeployment) -> int:
    """Prompt characters per prefix-cache hash block: one vLLM KV block, in the inference extension's
    characters-per-token estimate (what its prefix plugin's autoTune would pick from vLLM's metrics),
    fixed so the P/D handler's hit arithmetic uses the same block."""
    return d.spec.engine.block_size * llmd.CHARS_PER_TOKEN


def epp_config(d: HiSparseDeployment) -> dict[str, Any]:
    """EndpointPickerConfig for the EPP's llm-d release (``spec.routing.llmdVersion``): P/D profiles
    with the P/D profile handler when a prefill role exists, else one decode profile."""
    rel = d.spec.routing.epp_release
    prefix = "prefix-cache-scorer"
    block = prefix_block_chars(d)
    scorers = [{"pluginRef": prefix, "weight": 2}, {"pluginRef": "queue-scorer", "weight": 1}]
    common = [
        {"type": prefix, "parameters": {"autoTune": False, "blockSize": block}},
        {"type": "queue-scorer"},
        {"type": "max-score-picker"},
    ]
    head = {"apiVersion": rel.epp_config_api, "kind": "EndpointPickerConfig"}
    if d.spec.prefill is None:
        return {
            **head,
            "plugins": [*common, {"type": "decode-filter"}, {"type": "single-profile-handler"}],
            "schedulingProfiles": [{"name": "default", "plugins": [
                {"pluginRef": "decode-filter"}, {"pluginRef": "max-score-picker"}, *scorers]}],
        }
    return {
        **head,
        "plugins": [
            *common,
            {"type": "prefill-filter"},
            {"type": "decode-filter"},
            # Writes the prefill pod the prefill profile picked into x-prefiller-host-port.
            {"type": rel.prefill_header_plugin},
            {"type": rel.pd_profile_handler,
             "parameters": rel.pd_handler_parameters(d.spec.routing.pd_threshold_tokens, prefix, block)},
        ],
        "schedulingProfiles": [
            {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"}, {"pluginRef": "max-score-picker"}, *scorers]},
            {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}, {"pluginRef": "max-score-picker"}, *scorers]},
        ],
    }


def epp_args(d: HiSparseDeployment) -> list[str]:
    """The EPP's flags (the same in both supported releases' runners), and the KV-cache metric where
    the release's default is not the name vLLM 0.33 exports."""
    rel = d.spec.routing.epp_release
    metric = ([f"--kv-cache-usage-percentage-metric={llmd.VLLM_KV_CACHE_USAGE_METRIC}"]
              if rel.epp_kv_cache_metric_default != llmd.VLLM_KV_CACHE_USAGE_METRIC else [])
    return [
        "--pool-name", names.inference_pool(d.name),
        "--pool-namespace", d.namespace,
        "--pool-group", INFERENCE_GROUP,
        "--config-file", f"/config/{EPP_CONFIG_FILE}",
        "--grpc-port", str(EPP_GRPC_PORT),
        "--grpc-health-port", str(EPP_HEALTH_PORT),
        "--metrics-port", str(EPP_METRICS_PORT),
        # Explicit in both directions: GIE's runner turns authentication on when the flag is absent.
        f"--metrics-endpoint-auth={'true' if d.spec.monitoring.epp_metrics_auth else 'false'}",
        *metric,
    ]


def sidecar_args(d: HiSparseDeployment, s: RoleSettings) -> list[str]:
    """The decode routing sidecar's flags for its llm-d release (``spec.routing.sidecarVersion``)."""
    r = d.spec.routing
    args = [f"-port={SERVICE_PORT}", f"-vllm-port={s.vllm_port}", "-connector=nixlv2", "-secure-proxy=false"]
    if r.ssrf_protection:
        args.append("-enable-ssrf-protection=true")
        if r.sidecar_release.sidecar_pool_group_flag:
            args.append(f"-pool-group={INFERENCE_GROUP}")
    return args


def sidecar_env(d: HiSparseDeployment) -> list[dict[str, Any]]:
    """The pool the sidecar's SSRF guard watches (both releases read these variables)."""
    if not d.spec.routing.ssrf_protection:
        return []
    return [
        {"name": "INFERENCE_POOL_NAME", "value": names.inference_pool(d.name)},
        {"name": "INFERENCE_POOL_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]


def _epp_objects(d: HiSparseDeployment) -> list[dict[str, Any]]:
    name, r = names.epp(d.name), d.spec.routing
    config = obj("v1", "ConfigMap", meta(d, name, "epp"),
                 data={EPP_CONFIG_FILE: yaml.safe_dump(epp_config(d), sort_keys=False)})
    # One ServiceAccount (and its Role) for the EPPs of every fleet, named by the resource: an identity that
    # outlives fleets, so a binding made for it (the authenticated /metrics' auth-delegator) keeps working.
    account = names.epp(d.owner_name)
    sa = obj("v1", "ServiceAccount", meta(d, account, "epp"), automountServiceAccountToken=True)
    role = obj("rbac.authorization.k8s.io/v1", "Role", meta(d, account, "epp"), rules=[
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [INFERENCE_GROUP], "resources": ["inferencepools"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [INFERENCE_X_GROUP], "resources": list(r.epp_release.epp_watched_x_resources),
         "verbs": ["get", "list", "watch"]},
    ])
    binding = obj("rbac.authorization.k8s.io/v1", "RoleBinding", meta(d, account, "epp"),
                  roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
                  subjects=[{"kind": "ServiceAccount", "name": account, "namespace": d.namespace}])
    deployment = obj("apps/v1", "Deployment", meta(d, name, "epp"), spec={
        "replicas": r.epp_replicas,
        # A new EPP pod is Ready before an old one goes: an update never leaves fewer pickers than asked for.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "selector": {"matchLabels": selector_labels(d, "epp")},
        "template": {
            "metadata": {"labels": {**selector_labels(d, "epp"), L.APP_NAME: L.APP_NAME_VALUE, L.APP_INSTANCE: d.owner_name}},
            "spec": {
                "serviceAccountName": account,
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                # GIE's runner stops its gRPC servers gracefully on SIGTERM: the streams in flight (each lives
                # as long as the request it routes, response included) finish within the route's timeout.
                "terminationGracePeriodSeconds": EPP_PRE_STOP_SECONDS + ROUTE_REQUEST_TIMEOUT_SECONDS,
                # Replicas on different nodes and zones where the cluster has them; never unschedulable.
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
                     "labelSelector": {"matchLabels": selector_labels(d, "epp")}, "matchLabelKeys": ["pod-template-hash"]}
                    for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")],
                "containers": [{
                    "name": "epp",
                    "image": r.epp_image_ref,
                    "imagePullPolicy": "IfNotPresent",
                    "args": epp_args(d),
                    "ports": [
                        {"name": "grpc", "containerPort": EPP_GRPC_PORT},
                        {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT},
                        {"name": "metrics", "containerPort": EPP_METRICS_PORT},
                    ],
                    # GIE's health service answers SERVING once the pool has synced, before its ext_proc server
                    # listens (6 s later on the real node): a pod Ready then refuses the gateway's connections.
                    # Readiness counts only after ext_proc accepts one.
                    "startupProbe": {"tcpSocket": {"port": EPP_GRPC_PORT}, "periodSeconds": 1, "failureThreshold": 600},
                    "readinessProbe": {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}, "periodSeconds": 5},
                    "livenessProbe": {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}, "periodSeconds": 10},
                    "resources": resources(r.epp_resources),
                    "lifecycle": {"preStop": {"sleep": {"seconds": EPP_PRE_STOP_SECONDS}}},
                    "volumeMounts": [{"name": "config", "mountPath": "/config", "readOnly": True}],
                    "securityContext": RESTRICTED_CONTAINER,
                }],
                "volumes": [{"name": "config", "configMap": {"name": name}}],
                **support_placement(d),
            },
        },
    })
    service = obj("v1", "Service", meta(d, name, "epp"), spec={
        "selector": selector_labels(d, "epp"),
        "ports": [
            {"name": "grpc-ext-proc", "port": EPP_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "http2"},
            {"name": "http-metrics", "port": EPP_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
        ],
    })
    out = [config, sa, role, binding, deployment, service]
    if r.epp_replicas > 1:
        # Active-active replicas (no --ha-enable-leader-election): each serves ext_proc, so a drain may take
        # one at a time and the rest keep routing. (With leader election only the leader is Ready, and its
        # loss leaves no Ready picker until a standby takes the lease: a FailClose gateway fails requests.)
        out.append(obj("policy/v1", "PodDisruptionBudget", meta(d, names.pdb(d.name, "epp"), "epp"), spec={
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(d, "epp")},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        }))
    return out


def _sidecar_rbac(d: HiSparseDeployment) -> list[dict[str, Any]]:
    """The decode sidecar's SSRF guard watches the InferencePool and the pods it selects."""
    name = sidecar_service_account(d)
    return [
        obj("v1", "ServiceAccount", meta(d, name, "decode"), automountServiceAccountToken=True),
        obj("rbac.authorization.k8s.io/v1", "Role", meta(d, name, "decode"), rules=[
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [INFERENCE_GROUP], "resources": ["inferencepools"], "verbs": ["get", "list", "watch"]},
        ]),
        obj("rbac.authorization.k8s.io/v1", "RoleBinding", meta(d, name, "decode"),
            roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            subjects=[{"kind": "ServiceAccount", "name": name, "namespace": d.namespace}]),
    ]


def http_route(d: HiSparseDeployment, backends: list[tuple[str, int]]) -> dict[str, Any] | None:
    """The resource's route from its Gateway to the InferencePools of its fleets: ``backends`` (pool,
    weight), the stable fleet's first and, during a canary, the candidate's with its share. None without
    routing or a ``gatewayRef``."""
    ref = d.spec.routing.gateway_ref
    if ref is None or not d.spec.routing.enabled:
        return None
    return obj("gateway.networking.k8s.io/v1", "HTTPRoute", meta(d, names.http_route(d.name), "router"), spec={
        "parentRefs": [ref.to_json_dict()],
        "rules": [{
            "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
            "backendRefs": [{"group": INFERENCE_GROUP, "kind": "InferencePool", "name": pool, "weight": weight}
                            for pool, weight in backends],
            "timeouts": {"request": f"{ROUTE_REQUEST_TIMEOUT_SECONDS}s"},
        }],
    })


def routing_objects(d: HiSparseDeployment, decode: RoleSettings, route: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Pool, EPP and sidecar RBAC of the fleet ``d`` (each fleet has its own), and ``route`` (the
    resource's HTTPRoute, rendered with the stable fleet's objects)."""
    if not d.spec.routing.enabled:
        return []
    out = [inference_pool(d, decode), *_epp_objects(d)]
    if has_sidecar(d, decode) and d.spec.routing.ssrf_protection:
        out += _sidecar_rbac(d)
    return out + ([route] if route else [])
