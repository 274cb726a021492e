"""The 16-node production example (examples/hisparse-deployment.yaml) on KWOK GPU nodes.

One copy takes 8 prefill nodes (one TP8 pod each) and one rack of 8 decode nodes (a LeaderWorkerSet
group with the rack as its exclusive topology), on the node pools of
``hisparse_devcluster.pools`` (one per role, each copy selecting its pool per role). GPU
nodes carry the ``nvidia.com/gpu:NoSchedule`` taint the example tolerates, so pods of other
manifests never land on them; the example's CPU-only pods (EPP, Mooncake master) run on a few
untainted CPU nodes, one per ten copies (plus one).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml
from hisparse_devcluster import Cluster, pools

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hisparse-deployment.yaml"
POOL_LABEL = pools.POOL_LABEL
COPIES_PER_CPU_NODE = pools.COPIES_PER_CPU_NODE
NODES_PER_COPY = {"prefill": 8, "decode": 8}
"""Nodes one copy of the example takes per role (checked against the example by :func:`_example`)."""


@functools.cache
def _example() -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    assert pools.role_nodes(doc) == NODES_PER_COPY, pools.role_nodes(doc)
    return doc


def rack_key() -> str:
    """The node label the example's decode groups take as their exclusive topology."""
    return pools.rack_key(_example())


def manifest(namespace: str, name: str) -> dict[str, Any]:
    """The example, renamed, with each role's nodeSelector extended by its pool."""
    return pools.pin_to_pools(_example(), name=name, namespace=namespace)


def add_nodes(cluster: Cluster, copies: int, *, prefix: str, total: int | None = None,
              batch: int = 200) -> list[str]:
    """GPU nodes for ``copies`` copies: a decode rack of 8 nodes per copy, and a prefill pool of 8
    per copy, or of whatever ``total`` leaves; and the CPU nodes. Created ``batch`` at a time,
    each batch waited Ready."""
    decode = NODES_PER_COPY["decode"] * copies
    prefill = NODES_PER_COPY["prefill"] * copies if total is None else total - decode
    if prefill < NODES_PER_COPY["prefill"] * copies:
        raise ValueError(f"{total} nodes cannot carry {copies} copies of the example")
    return pools.add_pool_nodes(cluster, _example(), {"decode": decode, "prefill": prefill}, prefix=prefix,
                                cpu_nodes=copies // COPIES_PER_CPU_NODE + 1, batch=batch)
