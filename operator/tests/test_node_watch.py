"""The node watch's pure parts (no cluster; e2e/tests/test_e2e_admission_nodes.py runs it against a real
apiserver): what a LIST page and a watch event do to the node facts, and a re-list that replaces them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hisparse_devcluster.nodes import GpuNodeSpec, gpu_node_manifest

from hisparse_operator.api import NodeFacts
from hisparse_operator.controller.cache import NodeFactsCache
from hisparse_operator.controller.nodes import Expired, NodeList, WatchEvent, apply_event


def _node(name: str, rv: str = "1", **spec: Any) -> dict[str, Any]:
    """A Node as the apiserver returns it: KWOK's manifest with the fields a live node adds."""
    node = gpu_node_manifest(name, GpuNodeSpec(taints=({"key": "nvidia.com/gpu", "effect": "NoSchedule"},)),
                             zone="zone-a", rack="rack-00")
    node["metadata"].update(resourceVersion=rv, uid=f"uid-{name}", managedFields=[{"manager": "kwok"}])
    node["spec"].update(spec)
    node["status"].update(conditions=[{"type": "Ready", "status": "True"}], images=[{"names": ["x"], "sizeBytes": 1}])
    return node


def _event(type_: str, obj: dict[str, Any]) -> WatchEvent:
    return WatchEvent.model_validate_json(json.dumps({"type": type_, "object": obj}))


def test_a_list_page_reads_the_same_facts_as_the_whole_node() -> None:
    items = [_node("a"), _node("b", unschedulable=True), {"metadata": {"name": "bare"}}]
    page = NodeList.model_validate_json(json.dumps(
        {"kind": "NodeList", "metadata": {"resourceVersion": "42", "continue": "tok"}, "items": items}))
    assert [n.facts() for n in page.items] == [NodeFacts.from_node(n) for n in items]
    assert page.items[1].facts().unschedulable and page.items[0].facts().taints[0]["key"] == "nvidia.com/gpu"
    assert page.items[0].facts().allocatable_gpus == 8
    assert (page.metadata.resource_version, page.metadata.continue_) == ("42", "tok")


def test_events_add_change_and_drop_facts_and_give_the_version_to_resume_from() -> None:
    cache = NodeFactsCache()
    assert apply_event(cache, _event("ADDED", _node("a", "5"))) == "5"
    snapshot = cache.snapshot()
    assert snapshot is not None and [n.name for n in snapshot.nodes] == ["a"]
    heartbeat = _node("a", "6")
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"
    assert apply_event(cache, _event("MODIFIED", heartbeat)) == "6"
    assert cache.snapshot() is snapshot  # nothing admission or render reads changed
    assert apply_event(cache, _event("MODIFIED", _node("a", "7", unschedulable=True))) == "7"
    changed = cache.snapshot()
    assert changed is not snapshot and changed is not None and changed.nodes[0].unschedulable
    assert apply_event(cache, _event("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "9"}})) == "9"
    assert cache.snapshot() is changed
    assert apply_event(cache, _event("DELETED", _node("a", "10"))) == "10"
    assert cache.snapshot() is None and len(cache) == 0


def test_410_gone_asks_for_a_new_list_and_other_errors_raise() -> None:
    cache = NodeFactsCache()
    gone = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410,
            "message": "too old resource version: 5 (9)"}
    with pytest.raises(Expired, match="too old resource version"):
        apply_event(cache, _event("ERROR", gone))
    with pytest.raises(Exception, match="InternalError"):
        apply_event(cache, _event("ERROR", {"kind": "Status", "code": 500, "reason": "InternalError", "message": "x"}))


def test_a_relist_replaces_every_node_at_once_and_keeps_an_unchanged_snapshot() -> None:
    cache = NodeFactsCache()
    for name in ("a", "b"):
        cache.put(_node(name))
    snapshot = cache.snapshot()
    assert not cache.replace([NodeFacts.from_node(_node("a")), NodeFacts.from_node(_node("b"))])
    assert cache.snapshot() is snapshot  # the render cache keeps its renders
    assert cache.replace([NodeFacts.from_node(_node("b")), NodeFacts.from_node(_node("c"))])  # a gone, c new
    after = cache.snapshot()
    assert after is not None and sorted(n.name for n in after.nodes) == ["b", "c"]
