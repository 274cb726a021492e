"""Serving pods of a role, as a Deployment (one node per replica) or a LeaderWorkerSet (several)."""

from __future__ import annotations

import json
from typing import Any, Final

from hisparse_runtime.engine import (
    ENGINE_CONFIG_DIR,
    LIVENESS_PATH,
    MODEL_MOUNT_PATH,
    PROBE_CHECK_SECONDS,
    PROBE_PORT,
    READINESS_PATH,
    SERVICE_PORT,
    RoleSettings,
    kv_compat_hash,
    render_env,
    termination_grace_seconds,
)
from hisparse_runtime.engine.parity import RUNTIME_COMMAND
from hisparse_runtime.engine.versions import RUNTIME_HOME, RUNTIME_UID

from .. import names
from ..api import HiSparseDeployment, RoleSpec, labels as L
from ..api.facts import GPU_RESOURCE
from ..api.topology import VOLCANO_SCHEDULER
from .common import RESTRICTED_CONTAINER, meta, obj, resources, revision, selector_labels
from .config import settings_file
from . import model as M

SIDECAR_NAME: Final = "routing-proxy"
VLLM_CONTAINER: Final = "vllm"

STARTUP_PROBE_BUDGET_SECONDS: Final = 3600
"""Loading a 700 GB checkpoint and capturing CUDA graphs can take most of an hour; until the startup
probe passes, liveness and readiness do not run."""

EPHEMERAL_STORAGE: Final = "ephemeral-storage"
SCRATCH_EPHEMERAL_GIB: Final = 40
"""Ephemeral storage a serving pod writes besides a PodEphemeral model cache: the /tmp (8Gi) and home (32Gi)
emptyDirs of compile and kernel caches."""

LWS_API: Final = "leaderworkerset.x-k8s.io/v1"
LWS_EXCLUSIVE_TOPOLOGY: Final = "leaderworkerset.sigs.k8s.io/exclusive-topology"


def component(role: str) -> str:
    return role


def pod_labels(d: HiSparseDeployment, s: RoleSettings, rev: str | None = None) -> dict[str, str]:
    return {
        **selector_labels(d, component(s.role)),
        L.APP_NAME: L.APP_NAME_VALUE,
        L.APP_INSTANCE: d.owner_name,
        L.APP_MANAGED_BY: L.FIELD_MANAGER,
        L.ROLE: s.role,
        L.REVISION: revision(d) if rev is None else rev,
        L.KV_COMPAT: kv_compat_hash(s),
        L.LLMD_INFERENCE_SERVING: "true",
        L.LLMD_MODEL: s.model.served_model_name,
        L.LLMD_ROLE: s.role,
    }


def _resources(spec: RoleSpec, s: RoleSettings, cache_gib: int | None) -> dict[str, Any]:
    devices = {GPU_RESOURCE: str(s.parallelism.gpus_per_node)}
    if spec.rdma is not None:
        # A device plugin's resource: requested and limited alike (extended resources are never overcommitted).
        devices[spec.rdma.resource_name] = str(spec.rdma.count)
    out = resources(spec.resources, **devices)
    if spec.resource_claims:
        # DRA: the container names the pod's claims it uses (core/v1 ResourceClaim: name, request).
        out["claims"] = [{"name": c.name, **({"request": c.request} if c.request else {})} for c in spec.resource_claims]
    if cache_gib is not None and EPHEMERAL_STORAGE not in out["requests"]:
        # A PodEphemeral model cache lives on the node's disk: request it, so the scheduler picks a node that
        # has the room and the kubelet does not evict the pod for using it (an explicit request wins).
        out["requests"][EPHEMERAL_STORAGE] = f"{cache_gib + SCRATCH_EPHEMERAL_GIB}Gi"
    return out


PROBE_PORT_NAME: Final = "probes"
PROBE_TIMEOUT_SECONDS: Final = PROBE_CHECK_SECONDS + 5
"""The kubelet waits longer than the entrypoint's own check may take, so a failing pod answers why (in its log)."""


def _probe_http(path: str, *, period: int, failures: int) -> dict[str, Any]:
    """An HTTP GET the kubelet makes itself, answered by the entrypoint (``hisparse_runtime.probe_server``): no
    process is started in the container per probe, as an exec probe would (a Python start, about a second of CPU)."""
    return {"httpGet": {"path": path, "port": PROBE_PORT_NAME}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": PROBE_TIMEOUT_SECONDS}


def _vllm_container(d: HiSparseDeployment, spec: RoleSpec, s: RoleSettings) -> dict[str, Any]:
    nixl = s.kv_transfer.nixl
    ports = [{"name": "vllm", "containerPort": s.vllm_port, "protocol": "TCP"},
             {"name": PROBE_PORT_NAME, "containerPort": PROBE_PORT, "protocol": "TCP"}]
    if s.disaggregated:
        ports += [
            {"name": "nixl", "containerPort": nixl.side_channel_port, "protocol": "TCP"},
            {"name": "nixl-check", "containerPort": nixl.link_check_port, "protocol": "TCP"},
        ]
    mounts = [
        {"name": "engine-config", "mountPath": ENGINE_CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        # The root filesystem is read-only: what vLLM, Triton, torch.compile and the runtime write goes here.
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": RUNTIME_HOME},
    ]
    if s.model.pvc_claim:
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT_PATH, "readOnly": True})
    _, model_mounts, _, cache_gib = M.pod_parts(d)
    mounts += model_mounts
    mounts += spec.extra_volume_mounts
    env = render_env(s)
    if s.model.scheme == "s3":
        env = [*env, *M.credential_env(s.model)]  # vLLM's run:ai streamer reads the object store itself
    # Probe periods bound how long a pod that can serve waits to be counted: up to one startup period after
    # /health first answers, then up to one readiness period; all three are HTTP GETs the kubelet makes itself,
    # so short periods cost nothing in the container. A failing readiness leaves the pool after 15 x 2 s.
    startup_period, period = 2, 2
    return {
        "name": VLLM_CONTAINER,
        "image": d.spec.engine.image,
        "imagePullPolicy": d.spec.engine.image_pull_policy,
        "command": [RUNTIME_COMMAND, "serve"],
        "args": ["--role", s.role, "--config", f"{ENGINE_CONFIG_DIR}/{settings_file(s.role)}"],
        "env": env,
        "ports": ports,
        "resources": _resources(spec, s, cache_gib),
        "volumeMounts": mounts,
        "startupProbe": {"httpGet": {"path": "/health", "port": "vllm"}, "periodSeconds": startup_period,
                         "failureThreshold": STARTUP_PROBE_BUDGET_SECONDS // startup_period, "timeoutSeconds": 5},
        # Decode is ready only once a real prefill -> decode KV transfer succeeded (see runtime probes).
        "readinessProbe": _probe_http(READINESS_PATH, period=period, failures=15),
        # Never restarts a pod that is draining or unpinning its host pool. A busy node must not read as a
        # hung engine: on the real node, with 10 s, a serving prefill pod was killed mid-canary because the
        # probe's Python start plus /health under CPU pressure took longer.
        "livenessProbe": _probe_http(LIVENESS_PATH, period=30, failures=6),
        # Deleted, the pod keeps serving while the EPP and kube-proxy drop it (they drop a pod once it has a
        # deletionTimestamp), then vLLM gets SIGTERM and drains: the kubelet's own sleep, no binary needed.
        **({"lifecycle": {"preStop": {"sleep": {"seconds": spec.pre_stop_sleep_seconds}}}}
           if spec.pre_stop_sleep_seconds else {}),
        "securityContext": {
            # RDMA registration of the pinned host pool and NIXL/UCX buffers needs locked memory beyond
            # the container's RLIMIT_MEMLOCK: IPC_LOCK is the one capability kept (engine.ipcLock).
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"], **({"add": ["IPC_LOCK"]} if d.spec.engine.ipc_lock else {})},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _sidecar(d: HiSparseDeployment, s: RoleSettings) -> dict[str, Any]:
    from .routing import sidecar_args, sidecar_env  # routing imports this module

    routing = d.spec.routing
    args, env = sidecar_args(d, s), sidecar_env(d)
    return {
        "name": SIDECAR_NAME,
        "image": routing.sidecar_image_ref,
        "imagePullPolicy": "IfNotPresent",
        # A native sidecar: starts before vLLM and stops after it, as llm-d's charts run it.
        "restartPolicy": "Always",
        "args": args,
        # No env without the SSRF guard: an empty list is not stored, and would read as drift.
        **({"env": env} if env else {}),
        "ports": [{"name": "http", "containerPort": SERVICE_PORT, "protocol": "TCP"}],
        "resources": resources(routing.sidecar_resources),
        "securityContext": RESTRICTED_CONTAINER,
    }


def has_sidecar(d: HiSparseDeployment, s: RoleSettings) -> bool:
    return s.role == "decode" and d.spec.routing.enabled and s.disaggregated


def sidecar_service_account(d: HiSparseDeployment) -> str:
    return f"{names.role(d.name, 'decode')}-sidecar"


def pod_template(d: HiSparseDeployment, spec: RoleSpec, s: RoleSettings, rev: str | None = None) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [
        {"name": "engine-config", "configMap": {"name": names.engine_config(d.name)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "8Gi"}},
        {"name": "home", "emptyDir": {"sizeLimit": "32Gi"}},
    ]
    if s.model.pvc_claim:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": s.model.pvc_claim, "readOnly": True}})
    model_volumes, _, fetch, _ = M.pod_parts(d)
    volumes += model_volumes
    volumes += spec.extra_volumes
    vllm = _vllm_container(d, spec, s)
    # The download runs before vLLM, never beside it: its requests stay within vLLM's, so it never makes the
    # pod's footprint larger than the role asked for (the scheduler counts the larger of the two).
    fetch = [M.within(c, vllm["resources"].get("requests") or {}) for c in fetch]
    pod: dict[str, Any] = {
        # The preStop sleep counts against the grace period: the drain and the unpinning come after it.
        "terminationGracePeriodSeconds": spec.pre_stop_sleep_seconds + termination_grace_seconds(s),
        # The runtime image's own user (runtime/Dockerfile RUNTIME_UID); every container runs as it.
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUNTIME_UID, "runAsGroup": RUNTIME_UID,
                            "fsGroup": RUNTIME_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [vllm],
        "volumes": volumes,
        "enableServiceLinks": False,
    }
    sidecar = has_sidecar(d, s) and d.spec.routing.ssrf_protection
    # NodeCache, PodEphemeral: the model is fetched first, before the sidecar announces an endpoint that cannot serve.
    init = [*fetch, *([_sidecar(d, s)] if has_sidecar(d, s) else [])]
    if init:
        pod["initContainers"] = init
    model_identity = M.service_account(s.model) if (fetch or s.model.scheme == "s3") else None
    if sidecar:
        pod["serviceAccountName"] = sidecar_service_account(d)  # the sidecar watches the InferencePool
    else:
        if model_identity:
            pod["serviceAccountName"] = model_identity  # identity-based access to the model source
        pod["automountServiceAccountToken"] = False  # vLLM never talks to the apiserver
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [t.to_json_dict() for t in spec.tolerations]
    if spec.affinity:
        pod["affinity"] = spec.affinity
    if spec.topology_spread_constraints:
        pod["topologySpreadConstraints"] = spec.topology_spread_constraints
    if spec.priority_class_name:
        pod["priorityClassName"] = spec.priority_class_name
    pod.update(_topology_pod_fields(spec))
    # The user's labels first: the operator's own keys are refused there, and would win here anyway.
    metadata: dict[str, Any] = {"labels": {**spec.pod_labels, **pod_labels(d, s, rev)}}
    annotations = pod_annotations(spec, s)
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod}


def scheduler_name(spec: RoleSpec) -> str | None:
    """The role's ``schedulerName``: its own, else Volcano's with ``gangScheduling.volcano``, else unset."""
    if spec.scheduler_name:
        return spec.scheduler_name
    if spec.gang_scheduling is not None and spec.gang_scheduling.volcano is not None:
        return VOLCANO_SCHEDULER
    return None


def _topology_pod_fields(spec: RoleSpec) -> dict[str, Any]:
    """``runtimeClassName``, ``schedulerName`` and DRA ``resourceClaims`` of the pod spec; none when unset."""
    out: dict[str, Any] = {}
    if spec.runtime_class_name:
        out["runtimeClassName"] = spec.runtime_class_name
    scheduler = scheduler_name(spec)
    if scheduler:
        out["schedulerName"] = scheduler
    if spec.resource_claims:
        # core/v1 PodResourceClaim; the request a container uses is on its own claim (see _resources).
        out["resourceClaims"] = [{"name": c.name, **({"resourceClaimName": c.resource_claim_name} if c.resource_claim_name else {}),
                                  **({"resourceClaimTemplateName": c.resource_claim_template_name}
                                     if c.resource_claim_template_name else {})} for c in spec.resource_claims]
    return out


def pod_annotations(spec: RoleSpec, s: RoleSettings) -> dict[str, str]:
    """The role's pod annotations: the user's, Multus's networks, and a single-node role's Volcano queue (a
    multi-node role's queue goes on the LeaderWorkerSet, where LWS reads it for the group's PodGroup)."""
    out = dict(spec.pod_annotations)
    if spec.networks:
        out[L.MULTUS_NETWORKS] = json.dumps([n.to_json_dict() for n in spec.networks], separators=(",", ":"))
    volcano = spec.gang_scheduling.volcano if spec.gang_scheduling is not None else None
    if volcano is not None and volcano.queue and s.parallelism.nodes == 1:
        out[L.VOLCANO_QUEUE_NAME] = volcano.queue
    return out


def workload_labels(spec: RoleSpec) -> dict[str, str]:
    """Labels of the workload object other projects read: Kueue's LocalQueue."""
    kueue = spec.gang_scheduling.kueue if spec.gang_scheduling is not None else None
    return {L.KUEUE_QUEUE_NAME: kueue.queue_name} if kueue is not None else {}


def lws_annotations(spec: RoleSpec) -> dict[str, str]:
    """Annotations of a LeaderWorkerSet other projects read: the Volcano queue of each group's PodGroup."""
    volcano = spec.gang_scheduling.volcano if spec.gang_scheduling is not None else None
    return {L.VOLCANO_QUEUE_NAME: volcano.queue} if volcano is not None and volcano.queue else {}


def workload(d: HiSparseDeployment, spec: RoleSpec, s: RoleSettings, rev: str | None = None) -> dict[str, Any]:
    """``rev``: the revision label (default: ``d``'s revision; the revision itself renders with a
    placeholder)."""
    name = names.role(d.name, s.role)
    template = pod_template(d, spec, s, rev)
    labels = {L.ROLE: s.role, L.REVISION: template["metadata"]["labels"][L.REVISION], **workload_labels(spec)}
    job = M.fetch_job_name(d)
    fetch = {L.MODEL_FETCH: job} if job else {}
    if s.parallelism.nodes == 1:
        return obj("apps/v1", "Deployment", meta(d, name, component(s.role), extra_labels=labels, annotations=fetch or None), spec={
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(d, component(s.role))},
            # Engines hold GPUs: never surge a second copy onto nodes that have none to spare.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "revisionHistoryLimit": 3,
            "template": template,
        })
    annotations = {**({LWS_EXCLUSIVE_TOPOLOGY: spec.placement_topology_key} if spec.placement_topology_key else {}),
                   **lws_annotations(spec), **fetch} or None
    return obj(LWS_API, "LeaderWorkerSet", meta(d, name, component(s.role), extra_labels=labels, annotations=annotations), spec={
        "replicas": spec.replicas,
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
        "leaderWorkerTemplate": {
            "size": s.parallelism.nodes,
            # One DP/EP group: a lost pod breaks the all-to-all, so the whole group restarts together.
            "restartPolicy": "RecreateGroupOnPodRestart",
            "workerTemplate": template,
        },
    })
