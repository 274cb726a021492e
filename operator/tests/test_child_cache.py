"""The operator's watch-fed child cache (pure, no cluster)."""

from __future__ import annotations

from typing import Any

from hisparse_operator.controller.cache import ChildCache


def _deployment(rv: str, ready: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d-prefill", "namespace": "ns", "resourceVersion": rv,
                         "labels": {"serving.hisparse.dev/deployment": "d"},
                         "managedFields": [{"manager": "x", "fieldsV1": {"f:spec": {}}}]},
            "status": {"readyReplicas": ready}}


def test_an_older_body_never_replaces_a_newer_one() -> None:
    # A reconcile's apply returned version 10; the watch then delivered the status update (version 12)
    # before the reconcile put its copy: the cache keeps 12, so the next status is not stale.
    cache = ChildCache()
    cache.put(_deployment("12", 8))
    cache.put(_deployment("10", 4))
    assert cache.get("Deployment", "ns", "d-prefill")["status"]["readyReplicas"] == 8
    cache.put(_deployment("13", 7))
    assert cache.get("Deployment", "ns", "d-prefill")["status"]["readyReplicas"] == 7


def test_bodies_are_kept_without_managed_fields_and_indexed_by_owner() -> None:
    cache = ChildCache()
    cache.put(_deployment("1", 0))
    assert "managedFields" not in cache.get("Deployment", "ns", "d-prefill")["metadata"]
    assert cache.owned_by("ns", "d") == [("Deployment", "ns", "d-prefill")]
