"""KWOK GPU nodes, scheduling on nvidia.com/gpu, controllers and garbage collection."""

from __future__ import annotations

import json
from typing import Any

from e2e_helpers import eventually, exists, get_json
from hisparse_devcluster import Cluster, GpuNodeSpec, faults
from hisparse_devcluster.nodes import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    RACK_LABEL,
    ZONE_LABEL,
)


def _ready(node: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", [])
    )


def test_kwok_gpu_nodes_are_ready_with_gpu_capacity(cluster: Cluster, gpu_nodes: list[str]) -> None:
    assert len(gpu_nodes) == 2
    placements = set()
    for name in gpu_nodes:
        node = get_json(cluster, "node", name)
        assert _ready(node), node["status"].get("conditions")
        # KWOK, not a kubelet, reported this node.
        assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("kwok-")
        cap, alloc = node["status"]["capacity"], node["status"]["allocatable"]
        assert cap[GPU_RESOURCE] == "8" and alloc[GPU_RESOURCE] == "8"
        assert cap["cpu"] == "224" and cap["memory"] == "2Ti"
        assert {"hugepages-1Gi", "hugepages-2Mi", "ephemeral-storage"} <= cap.keys()
        labels = node["metadata"]["labels"]
        assert labels[GPU_PRODUCT_LABEL] == "NVIDIA-H200"
        placements.add((labels[ZONE_LABEL], labels[RACK_LABEL]))
    assert len(placements) == 2, "nodes_per_rack=1 puts each node in its own rack and zone"


def _gpu_deployment(name: str, replicas: int, nodes: list[str]) -> dict[str, Any]:
    """Pinned to ``nodes``: other suites add GPU nodes of their own to the shared cluster."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {GPU_PRODUCT_LABEL: "NVIDIA-H200"},
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}},
                    "containers": [{
                        "name": "engine",
                        "image": "registry.invalid/engine:never-pulled",
                        "resources": {
                            "requests": {"cpu": "32", "memory": "256Gi"},
                            "limits": {GPU_RESOURCE: "8"},
                        },
                    }],
                },
            },
        },
    }


def test_full_node_gpu_pods_run_one_per_node(
    cluster: Cluster, gpu_nodes: list[str], namespace: str
) -> None:
    # Three 8-GPU replicas on two 8-GPU nodes: two run, one stays Pending.
    cluster.kubectl("apply", "-n", namespace, "-f", "-",
                    input=json.dumps(_gpu_deployment("engine", 3, gpu_nodes)))

    def pods() -> list[dict[str, Any]] | None:
        items = get_json(cluster, "pods", "-n", namespace, "-l", "app=engine")["items"]
        running = [p for p in items if p["status"].get("phase") == "Running"]
        return items if len(items) == 3 and len(running) == 2 else None

    items = eventually(pods, what="3 pods, 2 Running", timeout=120)
    running = [p for p in items if p["status"]["phase"] == "Running"]
    assert sorted(p["spec"]["nodeName"] for p in running) == sorted(gpu_nodes)
    for p in running:
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
    pending = [p for p in items if p["status"].get("phase") != "Running"]
    assert len(pending) == 1 and not pending[0]["spec"].get("nodeName")

    def unschedulable() -> str | None:
        pod = get_json(cluster, "pod", "-n", namespace, pending[0]["metadata"]["name"])
        for c in pod["status"].get("conditions", []):
            if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                return str(c.get("message"))
        return None

    message = eventually(unschedulable, what="the scheduler to report the third pod", timeout=60)
    assert f"Insufficient {GPU_RESOURCE}" in message

    # Deployment -> ReplicaSet -> Pod, with owner references set by the controllers.
    rs = get_json(cluster, "replicasets", "-n", namespace, "-l", "app=engine")["items"]
    assert len(rs) == 1
    assert rs[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == rs[0]["metadata"]["uid"] for p in items)

    # Scaling down frees a node and the deployment reports 2/2 available.
    cluster.kubectl("scale", "deployment/engine", "-n", namespace, "--replicas=2")
    cluster.kubectl("rollout", "status", "deployment/engine", "-n", namespace, "--timeout=120s",
                    timeout=150)
    dep = get_json(cluster, "deployment", "engine", "-n", namespace)
    assert dep["status"]["availableReplicas"] == 2


def test_garbage_collector_deletes_dependents_of_a_deleted_owner(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    uid = get_json(cluster, "configmap", "owner", "-n", namespace)["metadata"]["uid"]
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "namespace": namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}],
        },
    }
    orphan = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bystander",
                                                                     "namespace": namespace}}
    cluster.apply([child, orphan])
    assert exists(cluster, "configmap", "child", "-n", namespace)

    cluster.kubectl("delete", "configmap", "owner", "-n", namespace, "--wait=false")
    eventually(lambda: not exists(cluster, "configmap", "child", "-n", namespace),
               what="the garbage collector to delete the child", timeout=60)
    assert exists(cluster, "configmap", "bystander", "-n", namespace)


def test_kwok_chaos_labels_fail_a_pod_and_a_node(cluster: Cluster, namespace: str) -> None:
    # A tainted node of its own, so the other tests never schedule onto it.
    taint = {"key": "hisparse.dev/e2e", "value": "chaos", "effect": "NoSchedule"}
    (node,) = cluster.add_gpu_nodes(1, GpuNodeSpec(taints=(taint,)), prefix="chaos-node-")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "doomed", "namespace": namespace,
                     "labels": {faults.POD_CONTAINER_FAILED: "true"},
                     "annotations": {f"{faults.POD_CONTAINER_FAILED}/exit-code": "3"}},
        "spec": {
            "nodeName": node,
            "tolerations": [{**taint, "operator": "Equal"}],
            "containers": [{"name": "engine", "image": "registry.invalid/engine:1"}],
        },
    }
    cluster.apply([pod])

    def failed() -> dict[str, Any] | None:
        status = get_json(cluster, "pod", "doomed", "-n", namespace)["status"]
        return status if status.get("phase") == "Failed" else None

    status = eventually(failed, what="KWOK to fail the labelled pod", timeout=60)
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3

    cluster.kubectl("label", "node", node, f"{faults.NODE_NOT_READY}=true")

    def not_ready() -> bool:
        conditions = get_json(cluster, "node", node)["status"]["conditions"]
        return any(c["type"] == "Ready" and c["status"] != "True" for c in conditions)

    eventually(not_ready, what="KWOK to mark the labelled node NotReady", timeout=60)
    cluster.kubectl("delete", "node", node)
