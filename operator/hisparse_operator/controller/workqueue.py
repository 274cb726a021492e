"""The reconcile work queue: one key per HiSparseDeployment, coalesced, on threads of its own.

- **Coalescing**: a burst of child events (a rollout touches ~20 objects) becomes one running reconcile
  plus at most one more, not one per event. A key is queued at most once; a request for a key that is
  running marks it dirty, and the running reconcile goes round once more (it reads the latest state).
  Requests come from kopf's watch handlers, coroutines that only update the caches and request: kopf
  keeps a watch event (the full body) until its handler returns, so handlers that waited for a thread held
  thousands of bodies during a burst.
- **Threads of its own**, not kopf's handler executor: kopf also runs the admission webhook's handler
  there, and a backlog of reconciles (a resync of many deployments) would hold admission requests past
  the apiserver's webhook timeout.
- **Stop** (SIGTERM): queued keys are dropped and a running reconcile does not go round again, so the
  process exits once the reconciles in flight return, well inside a pod's grace period. Nothing is lost:
  reconciles are level-triggered, and the next leader's first list requests every deployment. Without
  this, Python's exit ran the whole backlog first (every queued work item runs before a thread pool's
  workers join), a minute and more with many deployments, and the kubelet's SIGKILL left the peering
  lease to expire instead of being released.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("hisparse.operator")

Key = tuple[str, str]
"""(namespace, name) of one HiSparseDeployment."""


class ReconcileQueue:
    """Runs ``work(key)`` on ``workers`` threads, coalesced per key, until :meth:`stop`. :meth:`request` is
    safe from any thread (kopf's event loop, a retry timer)."""

    def __init__(self, work: Callable[[Key], None], workers: int) -> None:
        self._work = work
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")
        self._guard = threading.Lock()
        self._queued: set[Key] = set()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._stopping = threading.Event()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def request(self, key: Key) -> bool:
        """Queue a reconcile of ``key`` unless one is queued (it will read the latest state) or running (it
        goes round once more); False once stopping (the request is dropped)."""
        with self._guard:
            if self._stopping.is_set():
                return False
            if key in self._running:
                self._dirty.add(key)
                return True
            if key in self._queued:
                return True
            self._queued.add(key)
            self._pool.submit(self._run, key)
        return True

    def _run(self, key: Key) -> None:
        with self._guard:
            self._queued.discard(key)
            if self._stopping.is_set():
                return
            if key in self._running:
                self._dirty.add(key)  # the running reconcile will go round once more
                return
            self._running.add(key)
        while True:
            with self._guard:
                self._dirty.discard(key)
            try:
                self._work(key)
            except Exception:  # work reports its own failures; the queue must outlive any one
                log.exception("%s/%s: reconcile raised", *key)
            with self._guard:  # decide and release under one lock, so no request falls between the two
                if key not in self._dirty or self._stopping.is_set():
                    self._running.discard(key)
                    self._dirty.discard(key)
                    return

    def stop(self) -> tuple[int, set[Key]]:
        """Drop every queued key and let running reconciles finish their pass without going round again;
        returns immediately with (queued keys dropped, keys still running). The threads are joined at
        interpreter exit, i.e. once those passes return."""
        with self._guard:
            self._stopping.set()
            dropped, running = len(self._queued), set(self._running)
            self._queued.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        return dropped, running

    def join(self) -> None:
        """Wait for the running reconciles (after :meth:`stop`)."""
        self._pool.shutdown(wait=True)
