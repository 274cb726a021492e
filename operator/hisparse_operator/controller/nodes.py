"""Node facts for admission and render, kept current by a watch of this process's own.

Every replica answers admission requests, but kopf peering pauses every replica except the leader, so a
cache fed by kopf's node watch would give replicas different verdicts, and admission read every Node live
instead: one unpaginated LIST from etcd per request, inside the webhook's 10 s timeout. :class:`NodeWatch`
runs in every replica, outside kopf, and feeds one :class:`~.cache.NodeFactsCache` that both admission and
reconciles read:

- **list** with ``resourceVersion=0``: the apiserver's watch cache answers at once, without reading etcd
  (it answers such a list in one response, whatever the page size asked); the cache's contents are
  replaced at once, so a snapshot never mixes two lists;
- **watch** from the list's version with bookmarks, so a watch that ends (:data:`WATCH_SECONDS`) or
  breaks resumes from a recent version without listing again;
- **410 Gone** (the version has left the apiserver's window, e.g. after an apiserver restart): list again,
  now at the latest version, in pages of :data:`PAGE_SIZE` (as client-go's reflector does: behind a load
  balancer, another apiserver's cache at version 0 could be older than what this watch has seen).
  Kubernetes 1.34+ serves such pages from its watch cache too (one etcd round trip for the version).

Only :class:`~..api.NodeFacts` are kept (labels, taints, GPUs, memory, cordon), never whole Node objects:
memory grows with the nodes' labels and taints, not with their status, images or managed fields.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Literal

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from pydantic import BaseModel, ConfigDict, Field

from ..api import NodeFacts
from . import metrics
from .cache import NodeFactsCache

log = logging.getLogger("hisparse.operator")

PAGE_SIZE = 500
"""Nodes per LIST page (client-go's reflector uses the same)."""
WATCH_SECONDS = 300
"""Server-side timeout of one watch request; the next resumes from the last version seen."""
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits after consecutive failures (apiserver unreachable, a refused request); the last one repeats."""
LIVE_READ_SECONDS = 6.0
"""Time one live read of every node may take (admission before the watch has synced): under the webhook's
10 s timeout, so a slow read is refused with its reason rather than by the apiserver's timeout."""

ListReason = Literal["start", "expired", "error"]


class Expired(Exception):
    """410 Gone: the version to resume from is no longer served; only a new list helps."""


class _ListMeta(BaseModel):
    resource_version: str = Field("", alias="resourceVersion")
    continue_: str | None = Field(None, alias="continue")


class _NodeMeta(BaseModel):
    name: str
    labels: dict[str, str] | None = None


class _NodeStatus(BaseModel):
    allocatable: dict[str, str] | None = None


class _Node(BaseModel):
    """The parts of a Node :meth:`NodeFacts.from_node` reads; the rest of the JSON (status conditions,
    images, managed fields: most of it) is skipped by the parser without becoming Python objects."""

    metadata: _NodeMeta
    spec: dict[str, Any] | None = None
    status: _NodeStatus | None = None

    def facts(self) -> NodeFacts:
        return NodeFacts.from_node(self.model_dump(exclude_none=True))


class NodeList(BaseModel):
    """One page of ``GET /api/v1/nodes``."""

    metadata: _ListMeta = Field(default_factory=_ListMeta)
    items: list[_Node] = Field(default_factory=list)


class _Status(BaseModel):
    code: int | None = None
    reason: str | None = None
    message: str | None = None


class WatchEvent(BaseModel):
    """One line of a node watch."""

    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]
    object: dict[str, Any]

    def resource_version(self) -> str | None:
        return (self.object.get("metadata") or {}).get("resourceVersion")

    def status(self) -> _Status:
        return _Status.model_validate(self.object)


def list_node_facts(core: k8s.CoreV1Api, *, latest: bool = False,
                    timeout: float | None = None) -> tuple[list[NodeFacts], str]:
    """Every node's facts and the list's resourceVersion: from the apiserver's watch cache as it is
    (``resourceVersion=0``), or at least as new as the latest write (``latest``, in pages). Raises
    :class:`Expired` when a continue token has expired; ``timeout`` bounds the whole read."""
    deadline = None if timeout is None else time.monotonic() + timeout
    facts: list[NodeFacts] = []
    token: str | None = None
    while True:
        # Later pages follow their continue token, which pins the version the first page was read at.
        left = None if deadline is None else max(0.1, deadline - time.monotonic())
        kwargs: dict[str, Any] = {"_continue": token} if token else {} if latest else {"resource_version": "0"}
        try:
            resp = core.list_node(limit=PAGE_SIZE, _preload_content=False, _request_timeout=left, **kwargs)
        except ApiException as e:
            if e.status == 410:
                raise Expired(e.reason or "continue token expired") from e
            raise
        page = NodeList.model_validate_json(resp.data)
        facts += [n.facts() for n in page.items]
        token = page.metadata.continue_
        if not token:
            return facts, page.metadata.resource_version
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"listing nodes took more than {timeout:g}s ({len(facts)} read so far)")


def apply_event(cache: NodeFactsCache, event: WatchEvent) -> str | None:
    """Record one watch event in ``cache``; the version to resume from (``None``: the event carries none).
    Raises :class:`Expired` on 410 and :class:`ApiException` on any other error event."""
    if event.type == "ERROR":
        status = event.status()
        if status.code == 410:
            raise Expired(status.message or "resource version too old")
        raise ApiException(status=status.code or 0, reason=f"watch error: {status.reason}: {status.message}")
    if event.type == "DELETED":
        cache.drop(event.object["metadata"]["name"])
    elif event.type in ("ADDED", "MODIFIED"):
        cache.put(event.object)
    return event.resource_version()


class NodeWatch(threading.Thread):
    """List, then watch, Nodes into ``cache`` until :meth:`stop`; :attr:`synced` is set once the first list
    is in the cache and stays set (a re-list replaces the contents at once, so the cache is never empty
    meanwhile)."""

    def __init__(self, core: k8s.CoreV1Api, cache: NodeFactsCache) -> None:
        super().__init__(name="node-facts-watch", daemon=True)
        self.core, self.cache = core, cache
        self.synced = threading.Event()
        self.stopped = threading.Event()
        self._response: Any = None

    def stop(self) -> None:
        """Returns at once; the thread ends within moments. The watch's socket is shut down for reading,
        which wakes the blocked read with end-of-stream: closing the response instead waits for the
        reader's lock, i.e. for the next event or bookmark (a minute on a quiet cluster), and it was
        called on kopf's event loop at exit."""
        self.stopped.set()
        resp = self._response
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # noqa: BLE001 (the watch ended or was released meanwhile: nothing to wake)
                pass

    def run(self) -> None:
        version: str | None = None
        reason: ListReason = "start"
        failures = 0
        while not self.stopped.is_set():
            try:
                if version is None:
                    version = self._list(reason)
                version = self._watch(version)
                failures = 0
            except Expired as e:
                log.info("node watch: %s; listing the nodes again", e)
                version, reason = None, "expired"
            except Exception as e:  # noqa: BLE001 (the watch must outlive any one failure)
                if self.stopped.is_set():
                    return
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                metrics.NODE_WATCH_ERRORS.inc()
                log.warning("node watch failed (%d in a row), retrying in %.0fs: %s", failures, delay, e)
                if version is None:
                    reason = "error"
                self.stopped.wait(delay)

    def _list(self, reason: ListReason) -> str:
        facts, version = list_node_facts(self.core, latest=reason != "start")
        self.cache.replace(facts)
        metrics.NODE_LISTS.labels(reason=reason).inc()
        metrics.NODE_FACTS_NODES.set(len(facts))
        self.synced.set()
        log.info("node facts: %d nodes listed at version %s (%s)", len(facts), version, reason)
        return version

    def _watch(self, version: str) -> str:
        """Follow one watch from ``version``; the last version seen when it ends."""
        resp = self.core.list_node(watch=True, resource_version=version, allow_watch_bookmarks=True,
                                   timeout_seconds=WATCH_SECONDS, _preload_content=False,
                                   _request_timeout=(10, WATCH_SECONDS + 30))
        self._response = resp
        try:
            for line in iter_resp_lines(resp):
                if self.stopped.is_set():
                    break
                if not line:
                    continue
                version = apply_event(self.cache, WatchEvent.model_validate_json(line)) or version
                metrics.NODE_FACTS_NODES.set(len(self.cache))
        finally:
            self._response = None
            resp.release_conn()
        return version
