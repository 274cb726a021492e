"""Upstream CRDs our objects use: installed, served, and validating on the server."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from e2e_helpers import exists, get_json
from hisparse_devcluster import Cluster, versions

KINDS = [k for up in versions.UPSTREAM_CRDS for k in up.kinds]


@pytest.mark.parametrize(("group", "version", "kind"), KINDS, ids=[k[2] for k in KINDS])
def test_crd_is_established_and_serves_kind(
    cluster: Cluster, group: str, version: str, kind: str
) -> None:
    status, body = cluster.api_get(f"/apis/{group}/{version}")
    assert status == 200, f"{group}/{version} not served: {body[:300]}"
    resources = {r["kind"]: r for r in json.loads(body)["resources"] if "/" not in r["name"]}
    assert kind in resources, f"{kind} missing from {group}/{version}: {sorted(resources)}"
    crd = get_json(cluster, "crd", f"{resources[kind]['name']}.{group}")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True"
    assert conditions.get("NonStructuralSchema") is None


POD_TEMPLATE = {
    "spec": {"containers": [{"name": "engine", "image": "registry.invalid/engine:1",
                             "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}
}

VALID: dict[str, dict[str, Any]] = {
    "LeaderWorkerSet": {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "decode"},
        "spec": {
            "replicas": 2,
            "leaderWorkerTemplate": {
                "size": 4,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": POD_TEMPLATE,
                "workerTemplate": POD_TEMPLATE,
            },
        },
    },
    "InferencePool": {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "pool"},
        "spec": {
            "selector": {"matchLabels": {"llm-d.ai/inference-serving": "true"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "FailOpen"},
        },
    },
    "HTTPRoute": {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "route"},
        "spec": {
            "parentRefs": [{"name": "gateway"}],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [
                    {"group": "inference.networking.k8s.io", "kind": "InferencePool",
                     "name": "pool", "weight": 90},
                    {"group": "inference.networking.k8s.io", "kind": "InferencePool",
                     "name": "pool-canary", "weight": 10},
                ],
            }],
        },
    },
    "PodMonitor": {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "engines"},
        "spec": {
            "selector": {"matchLabels": {"llm-d.ai/inference-serving": "true"}},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    },
}


def _with(kind: str, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """VALID[kind] with the field at ``path`` set to ``value`` (or removed when value is ...)."""
    obj = copy.deepcopy(VALID[kind])
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


INVALID = {
    "lws-without-worker-template": (
        _with("LeaderWorkerSet", ("spec", "leaderWorkerTemplate", "workerTemplate"), ...),
        # LWS's defaulting webhook (the suites run the LWS manager) fills in an empty
        # workerTemplate first; the CRD schema then refuses its missing containers.
        "workerTemplate.spec.containers",
    ),
    "lws-unknown-restart-policy": (
        _with("LeaderWorkerSet", ("spec", "leaderWorkerTemplate", "restartPolicy"), "Sometimes"),
        "Unsupported value",
    ),
    "pool-without-targetports": (
        _with("InferencePool", ("spec", "targetPorts"), []),
        "targetPorts",
    ),
    "pool-duplicate-ports": (  # CEL rule on the list
        _with("InferencePool", ("spec", "targetPorts"), [{"number": 8000}, {"number": 8000}]),
        "port number must be unique",
    ),
    "pool-epp-service-without-port": (  # CEL rule on endpointPickerRef
        _with("InferencePool", ("spec", "endpointPickerRef", "port"), ...),
        "port is required when kind is 'Service'",
    ),
}


@pytest.mark.parametrize("kind", sorted(VALID))
def test_server_side_dry_run_accepts_valid_object(
    cluster: Cluster, namespace: str, kind: str
) -> None:
    obj = {**VALID[kind], "metadata": {**VALID[kind]["metadata"], "namespace": namespace}}
    res = cluster.apply([obj], dry_run=True)
    assert "(server dry run)" in res.stdout
    # Dry run writes nothing.
    assert not exists(cluster, kind.lower(), obj["metadata"]["name"], "-n", namespace)


@pytest.mark.parametrize("case", sorted(INVALID))
def test_server_side_dry_run_rejects_invalid_object(
    cluster: Cluster, namespace: str, case: str
) -> None:
    obj, expected = INVALID[case]
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    res = cluster.apply([obj], dry_run=True, check=False)
    assert res.returncode != 0, f"accepted: {res.stdout}"
    assert expected in res.stderr, res.stderr
    assert "is invalid" in res.stderr, res.stderr
