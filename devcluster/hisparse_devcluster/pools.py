"""KWOK node pools for HiSparseDeployments that span several nodes.

A multi-node decode group is a LeaderWorkerSet placed whole in one rack (its exclusive topology). If
prefill pods may land anywhere, the scheduler spreads them over every rack and no rack stays free
for a group, so GPU clusters split node pools and each role selects its pool. Here: one pool label
per role (``hisparse.dev/pool=<role>``) on tainted GPU nodes, racks as large as the largest group,
and a few untainted CPU nodes for the CPU-only pods (endpoint picker, Mooncake master).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Final

from .nodes import RACK_LABEL, GpuNodeSpec

if TYPE_CHECKING:
    from .cluster import Cluster

__all__ = ["COPIES_PER_CPU_NODE", "POOL_LABEL", "ROLES", "add_pool_nodes", "group_nodes", "needs_lws",
           "pin_to_pools", "rack_key", "role_nodes"]

POOL_LABEL: Final = "hisparse.dev/pool"
ROLES: Final = ("decode", "prefill")
"""Pools are filled in this order; nodes beyond what the roles need go to the last one."""
COPIES_PER_CPU_NODE: Final = 10
GPU_TAINT: Final = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _parallelism(doc: dict[str, Any], role: str) -> dict[str, Any]:
    return doc["spec"][role].get("parallelism") or {}


def role_nodes(doc: dict[str, Any]) -> dict[str, int]:
    """GPU nodes each role of one HiSparseDeployment takes: replicas x nodes per replica."""
    return {role: int(doc["spec"][role].get("replicas", 1)) * int(_parallelism(doc, role).get("nodes", 1))
            for role in ROLES}


def group_nodes(doc: dict[str, Any]) -> int:
    """Nodes of the largest replica: a rack must hold one whole group."""
    return max(int(_parallelism(doc, role).get("nodes", 1)) for role in ROLES)


def needs_lws(doc: dict[str, Any]) -> bool:
    """A role with replicas of several nodes is rendered as a LeaderWorkerSet."""
    return group_nodes(doc) > 1


def rack_key(doc: dict[str, Any]) -> str:
    """The node label the roles take as their placement topology (the dev nodes' rack label if none)."""
    keys = [doc["spec"][role].get("placementTopologyKey") for role in ROLES]
    return next((str(k) for k in keys if k), RACK_LABEL)


def pin_to_pools(doc: dict[str, Any], *, name: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    """A copy of ``doc`` whose roles each select their pool (and, if given, a new name and namespace)."""
    out = copy.deepcopy(doc)
    if name is not None or namespace is not None:
        meta = out.setdefault("metadata", {})
        out["metadata"] = {"name": name or meta.get("name"), "namespace": namespace or meta.get("namespace")}
    for role in ROLES:
        out["spec"][role]["nodeSelector"] = {**(out["spec"][role].get("nodeSelector") or {}), POOL_LABEL: role}
    return out


def add_pool_nodes(cluster: Cluster, doc: dict[str, Any], counts: dict[str, int], *, prefix: str,
                   cpu_nodes: int = 1, batch: int = 200) -> list[str]:
    """Add ``counts[role]`` GPU nodes to each role's pool (racks of :func:`group_nodes`, labelled with
    :func:`rack_key` too) and ``cpu_nodes`` CPU nodes, ``batch`` at a time, each batch waited Ready."""
    names: list[str] = []
    per_rack = group_nodes(doc)
    for role in ROLES:
        spec = GpuNodeSpec(labels={POOL_LABEL: role}, taints=(GPU_TAINT,), rack_labels=(RACK_LABEL, rack_key(doc)))
        left = counts.get(role, 0)
        while left > 0:
            names += cluster.add_gpu_nodes(min(batch, left), spec, prefix=f"{prefix}{role}-", nodes_per_rack=per_rack)
            left -= batch
    if cpu_nodes > 0:
        cpu = GpuNodeSpec(gpus=0, gpu_product="none", instance_type="cpu-224",
                          labels={POOL_LABEL: "cpu", "nvidia.com/gpu.present": "false"})
        names += cluster.add_gpu_nodes(cpu_nodes, cpu, prefix=f"{prefix}cpu-")
    return names
