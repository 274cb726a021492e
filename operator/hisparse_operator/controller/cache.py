"""A watch-fed cache of the operator's children, indexed by owner.

Filled from the same watch events that trigger reconciles, so a reconcile reads live children without
a GET per object; a miss falls back to the apiserver. It holds copies of cluster state only: a
restarted operator rebuilds it from the initial listing, nothing of record is lost.
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
        meta = body["metadata"]
        key = (body["kind"], meta.get("namespace", ""), meta["name"])
        owner = (meta.get("labels") or {}).get(L.DEPLOYMENT)
        with self._lock:
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
