"""A watch-fed cache of the operator's children, indexed by owner.

Filled from the same watch events that trigger reconciles, so a reconcile reads live children without
a GET per object; a miss falls back to the apiserver. Bodies are kept without ``managedFields``. It
holds copies of cluster state only: a restarted operator rebuilds it from the initial listing, nothing
of record is lost.
"""

from __future__ import annotations

import threading
from typing import Any

from ..api import labels as L

Key = tuple[str, str, str]  # (kind, namespace, name)


class ChildCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._by_owner: dict[tuple[str, str], set[Key]] = {}

    def put(self, body: dict[str, Any]) -> None:
        # managedFields are often the larger part of a body, and nothing here reads them.
        if "managedFields" in body.get("metadata", {}):
            body = {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "managedFields"}}
        meta = body["metadata"]
        key = (body["kind"], meta.get("namespace", ""), meta["name"])
        owner = (meta.get("labels") or {}).get(L.DEPLOYMENT)
        with self._lock:
            # A reconcile puts what its own GET or apply returned; a watch event for a later version
            # (a status update) may have been put meanwhile, and must not be replaced by the older one.
            if _older(meta, self._objects.get(key)):
                return
            self._objects[key] = body
            if owner:
                self._by_owner.setdefault((key[1], owner), set()).add(key)

    def drop(self, kind: str, namespace: str, name: str) -> None:
        key = (kind, namespace, name)
        with self._lock:
            body = self._objects.pop(key, None)
            owner = ((body or {}).get("metadata", {}).get("labels") or {}).get(L.DEPLOYMENT)
            if owner:
                self._by_owner.get((namespace, owner), set()).discard(key)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((kind, namespace, name))

    def owned_by(self, namespace: str, owner: str) -> list[Key]:
        with self._lock:
            return sorted(self._by_owner.get((namespace, owner), set()))


def _older(meta: dict[str, Any], cached: dict[str, Any] | None) -> bool:
    """Is ``meta``'s resourceVersion older than the cached body's? (etcd's are increasing integers;
    anything else is treated as not older.)"""
    if cached is None:
        return False
    new, old = meta.get("resourceVersion", ""), cached["metadata"].get("resourceVersion", "")
    return new.isdigit() and old.isdigit() and int(new) < int(old)
