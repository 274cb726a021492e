"""The 16-node production example (examples/hisparse-deployment.yaml) on KWOK GPU nodes.

One copy takes 8 prefill nodes (one TP8 pod each) and one rack of 8 decode nodes (a LeaderWorkerSet
group with the rack as its exclusive topology). Nodes are split into two pools, as GPU clusters
split node pools, and each copy selects its pool per role: without that the scheduler spreads
prefill pods over every rack and no rack stays free for a decode group, which LWS places whole.
GPU nodes carry the ``nvidia.com/gpu:NoSchedule`` taint the example tolerates, so pods of other
manifests never land on them; the example's CPU-only pods (EPP, Mooncake master) run on a few
untainted CPU nodes, one per ten copies (plus one).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml
from hisparse_operator.devcluster import Cluster, GpuNodeSpec, nodes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hisparse-deployment.yaml"
POOL_LABEL = "hisparse.dev/pool"
COPIES_PER_CPU_NODE = 10
NODES_PER_COPY = {"prefill": 8, "decode": 8}
"""Nodes one copy of the example takes per role (checked against the example by :func:`manifest`)."""


@functools.cache
def _example() -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    spec = doc["spec"]
    assert spec["prefill"]["replicas"] * spec["prefill"]["parallelism"]["nodes"] == NODES_PER_COPY["prefill"]
    assert spec["decode"]["replicas"] * spec["decode"]["parallelism"]["nodes"] == NODES_PER_COPY["decode"]
    return doc


def rack_key() -> str:
    """The node label the example's decode groups take as their exclusive topology."""
    return str(_example()["spec"]["decode"]["placementTopologyKey"])


def manifest(namespace: str, name: str) -> dict[str, Any]:
    """The example, renamed, with each role's nodeSelector extended by its pool."""
    doc = copy.deepcopy(_example())
    doc["metadata"] = {"name": name, "namespace": namespace}
    for role in ("prefill", "decode"):
        doc["spec"][role]["nodeSelector"] = {**doc["spec"][role].get("nodeSelector", {}), POOL_LABEL: role}
    return doc


def add_nodes(cluster: Cluster, copies: int, *, prefix: str, total: int | None = None,
              batch: int = 200) -> list[str]:
    """GPU nodes for ``copies`` copies: a decode rack of 8 nodes per copy, and a prefill pool of 8
    per copy, or of whatever ``total`` leaves; and the CPU nodes. Created ``batch`` at a time,
    each batch waited Ready."""
    decode = NODES_PER_COPY["decode"] * copies
    prefill = NODES_PER_COPY["prefill"] * copies if total is None else total - decode
    if prefill < NODES_PER_COPY["prefill"] * copies:
        raise ValueError(f"{total} nodes cannot carry {copies} copies of the example")
    taint = ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},)
    names: list[str] = []
    for role, count in (("decode", decode), ("prefill", prefill)):
        spec = GpuNodeSpec(labels={POOL_LABEL: role}, taints=taint,
                           rack_labels=(nodes.RACK_LABEL, rack_key()))
        while count > 0:
            names += cluster.add_gpu_nodes(min(batch, count), spec, prefix=f"{prefix}{role}-",
                                           nodes_per_rack=NODES_PER_COPY["decode"])
            count -= batch
    cpu = GpuNodeSpec(gpus=0, gpu_product="none", instance_type="cpu-224",
                      labels={POOL_LABEL: "cpu", "nvidia.com/gpu.present": "false"})
    names += cluster.add_gpu_nodes(copies // COPIES_PER_CPU_NODE + 1, cpu, prefix=f"{prefix}cpu-")
    return names
