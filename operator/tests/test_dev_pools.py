"""The node pools `hisparse dev up` and the e2e fleet give multi-node examples (pure functions, no cluster)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hisparse_devcluster import nodes, pools

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


def test_the_16_node_example_needs_lws_and_racks_of_8() -> None:
    doc = example("hisparse-deployment.yaml")
    assert pools.role_nodes(doc) == {"decode": 8, "prefill": 8}
    assert pools.group_nodes(doc) == 8
    assert pools.needs_lws(doc)
    assert pools.rack_key(doc) == "topology.kubernetes.io/rack"


def test_the_single_node_example_needs_neither() -> None:
    doc = example("deepseek-v32-single-node.yaml")
    assert pools.group_nodes(doc) == 1
    assert not pools.needs_lws(doc)
    assert pools.rack_key(doc) == nodes.RACK_LABEL  # no placement topology: the dev nodes' own rack label


@pytest.mark.parametrize(("replicas", "per_replica", "expected"), [(3, 2, 6), (1, 16, 16), (4, 1, 4)])
def test_role_nodes_is_replicas_times_nodes(replicas: int, per_replica: int, expected: int) -> None:
    doc = example("hisparse-deployment.yaml")
    doc["spec"]["decode"]["replicas"] = replicas
    doc["spec"]["decode"]["parallelism"]["nodes"] = per_replica
    assert pools.role_nodes(doc)["decode"] == expected
    assert pools.group_nodes(doc) == max(per_replica, doc["spec"]["prefill"]["parallelism"]["nodes"])


def test_pin_to_pools_adds_the_pool_to_each_role_and_leaves_the_input_alone() -> None:
    doc = example("hisparse-deployment.yaml")
    before = copy.deepcopy(doc)
    pinned = pools.pin_to_pools(doc, name="glm52-01", namespace="fleet")
    assert doc == before
    assert pinned["metadata"] == {"name": "glm52-01", "namespace": "fleet"}
    for role in pools.ROLES:
        selector = pinned["spec"][role]["nodeSelector"]
        assert selector == {**before["spec"][role]["nodeSelector"], pools.POOL_LABEL: role}
    assert pools.pin_to_pools(doc)["metadata"] == before["metadata"]  # no rename asked: kept whole
