"""Caches that spare reconciles work, each rebuilt from watches or recomputed after a restart: they hold
copies of cluster state or results of pure functions, nothing of record.

- :class:`ChildCache`: watched objects by (kind, namespace, name), indexed by owner. Filled from the same
  watch events that trigger reconciles, so a reconcile reads live children (and its HiSparseDeployment)
  without a GET per object; a miss falls back to the apiserver. Bodies are kept without ``managedFields``,
  as compact JSON.
- :class:`NodeFactsCache`: the scheduling facts of every Node, and one :class:`ClusterFacts` snapshot that
  is replaced (never changed) when a node's facts change.
- :class:`RenderCache`: the last validation and render of each HiSparseDeployment, reused while its spec
  and metadata and the node facts snapshot are the same.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..api import ClusterFacts, FieldError, HiSparseDeployment, NodeFacts, labels as L

Key = tuple[str, str, str]  # (kind, namespace, name)


GONE_SECONDS = 600.0
"""How long a deleted object's uid is remembered: longer than any reconcile runs between reading an
object and putting it here."""


@dataclass(frozen=True)
class _Entry:
    resource_version: str
    uid: str | None
    owner: str | None
    body: bytes
    """Compact JSON: a quarter to a third of the memory of the parsed body, and a fresh copy on every get."""


class ChildCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Key, _Entry] = {}
        self._by_owner: dict[tuple[str, str], set[Key]] = {}
        self._gone: dict[Key, tuple[str, float]] = {}  # deleted: uid and when, oldest first

    def put(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key = (body["kind"], meta.get("namespace", ""), meta["name"])
        # managedFields are often the larger part of a body, and nothing here reads them.
        slim = {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        entry = _Entry(meta.get("resourceVersion", ""), meta.get("uid"), (meta.get("labels") or {}).get(L.DEPLOYMENT),
                       json.dumps(slim, separators=(",", ":")).encode())
        with self._lock:
            # A reconcile puts what its own GET or write returned. The watch may have delivered the
            # object's deletion meanwhile (that copy must not bring it back) or a later version, e.g. a
            # status update (it must not be replaced by the older one).
            gone = self._gone.get(key)
            if gone is not None and gone[0] == entry.uid:
                return
            if _older(entry.resource_version, self._objects.get(key)):
                return
            self._objects[key] = entry
            if entry.owner:
                self._by_owner.setdefault((key[1], entry.owner), set()).add(key)

    def drop(self, kind: str, namespace: str, name: str, uid: str | None = None) -> None:
        """Forget a deleted object (``uid``: the deleted one's, when the cache may not hold it)."""
        key = (kind, namespace, name)
        now = time.monotonic()
        with self._lock:
            entry = self._objects.pop(key, None)
            uid = uid or (entry.uid if entry else None)
            if uid:
                self._gone.pop(key, None)
                self._gone[key] = (uid, now)
            while self._gone:
                oldest = next(iter(self._gone))
                if now - self._gone[oldest][1] < GONE_SECONDS:
                    break
                del self._gone[oldest]
            if entry is not None and entry.owner:
                self._by_owner.get((namespace, entry.owner), set()).discard(key)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A copy of the cached body (without managedFields); the caller may change it."""
        with self._lock:
            entry = self._objects.get((kind, namespace, name))
        return json.loads(entry.body) if entry is not None else None

    def has(self, kind: str, namespace: str, name: str) -> bool:
        """Whether the object is cached (without parsing its body)."""
        with self._lock:
            return (kind, namespace, name) in self._objects

    def keys(self, kind: str) -> list[Key]:
        with self._lock:
            return [k for k in self._objects if k[0] == kind]

    def owned_by(self, namespace: str, owner: str) -> list[Key]:
        with self._lock:
            return sorted(self._by_owner.get((namespace, owner), set()))


def _older(resource_version: str, cached: _Entry | None) -> bool:
    """Is ``resource_version`` older than the cached body's? (etcd's are increasing integers; anything
    else is treated as not older.)"""
    if cached is None:
        return False
    new, old = resource_version, cached.resource_version
    return new.isdigit() and old.isdigit() and int(new) < int(old)


class NodeFactsCache:
    """Node name -> :class:`NodeFacts`, fed by the node watch (:mod:`.nodes`). Node status heartbeats and condition
    updates leave the facts unchanged and are ignored; a change replaces the snapshot, so a snapshot in
    use is never modified and its identity tells whether the facts changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeFacts] = {}
        self._snapshot: ClusterFacts | None = None

    def put(self, node: dict[str, Any]) -> bool:
        """Record a node; whether its facts changed."""
        facts = NodeFacts.from_node(node)
        with self._lock:
            if self._nodes.get(facts.name) == facts:
                return False
            self._nodes[facts.name] = facts
            self._snapshot = None
            return True

    def drop(self, name: str) -> None:
        with self._lock:
            if self._nodes.pop(name, None) is not None:
                self._snapshot = None

    def replace(self, facts: list[NodeFacts]) -> bool:
        """Hold exactly ``facts`` (a new list of every node); whether anything changed. One step, so a
        snapshot never mixes the old contents and the new."""
        new = {f.name: f for f in facts}
        with self._lock:
            if new == self._nodes:
                return False
            self._nodes = new
            self._snapshot = None
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._nodes)

    def snapshot(self) -> ClusterFacts | None:
        """The current facts (``None`` while no node is known). The same object until a node's facts
        change; treat it as read-only."""
        with self._lock:
            if self._snapshot is None and self._nodes:
                self._snapshot = ClusterFacts(nodes=list(self._nodes.values()))
            return self._snapshot


_VOLATILE_METADATA = ("resourceVersion", "managedFields")
"""Metadata that changes with every write (a status update included) and that neither validation nor
render reads."""


def fingerprint(manifest: dict[str, Any]) -> str:
    """Everything of a HiSparseDeployment that validation and render can read: apiVersion, kind, spec and
    metadata (uid and generation included) except :data:`_VOLATILE_METADATA`; status is not part of it."""
    meta = {k: v for k, v in (manifest.get("metadata") or {}).items() if k not in _VOLATILE_METADATA}
    return json.dumps({"apiVersion": manifest.get("apiVersion"), "kind": manifest.get("kind"), "metadata": meta,
                       "spec": manifest.get("spec")}, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Rendered:
    """One validation (and, when valid, render) of a HiSparseDeployment against one facts snapshot.
    Shared between reconciles: read-only."""

    fingerprint: str
    facts: ClusterFacts | None
    deployment: HiSparseDeployment | None
    errors: list[FieldError]
    rendered: bytes = b"[]"
    """The rendered objects as compact JSON: a third of the memory of the objects themselves."""
    kv_hash: str | None = None

    @classmethod
    def of(cls, fp: str, facts: ClusterFacts | None, d: HiSparseDeployment, desired: list[dict[str, Any]],
           kv_hash: str) -> Rendered:
        return cls(fp, facts, d, [], json.dumps(desired, separators=(",", ":")).encode(), kv_hash)

    @property
    def desired(self) -> list[dict[str, Any]]:
        """A fresh copy of the rendered objects."""
        return json.loads(self.rendered)


class RenderCache:
    """(namespace, name) -> the last :class:`Rendered`. An entry is reused only for the same
    :func:`fingerprint` and the very same facts snapshot (identity, see :class:`NodeFactsCache`):
    a new generation, any other spec or metadata change, a new uid, or changed node facts render anew."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], Rendered] = {}

    def get(self, namespace: str, name: str, fp: str, facts: ClusterFacts | None) -> Rendered | None:
        with self._lock:
            hit = self._entries.get((namespace, name))
        if hit is None or hit.fingerprint != fp or hit.facts is not facts:
            return None
        return hit

    def put(self, namespace: str, name: str, rendered: Rendered) -> None:
        with self._lock:
            self._entries[(namespace, name)] = rendered

    def drop(self, namespace: str, name: str) -> None:
        with self._lock:
            self._entries.pop((namespace, name), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
