"""A watcher for canary tests: it records every HTTPRoute weight change and each InferencePool's ready
endpoints throughout a test, and reports every moment a route sent traffic to a pool with none.

The check is a pure function (:func:`route_violations`) so unit tests of the operator apply the very
same rule to their in-memory cluster; :class:`RouteWatcher` runs it against a real apiserver, on every
watch event of HTTPRoutes, InferencePools, Pods and Deployments of one namespace (``kubectl get --watch``).

    with RouteWatcher(cluster, namespace) as w:
        ...  # roll out
    assert not w.violations, w.violations
    w.weights  # [(t, {"dsv32": 100}), (t, {"dsv32": 90, "dsv32-1aacc6": 10}), ...]: per pool (fleet) name
    w.replicas  # [(t, {"dsv32-decode": 1, "dsv32-1aacc6-decode": 1, ...}), ...]: each Deployment's spec
    w.services  # [(t, {"dsv32-serving": 1, ...}), ...]: each Service's ready endpoints (EndpointSlices)
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any

__all__ = ["RouteWatcher", "ready_endpoints", "route_violations", "service_endpoints", "weights_of"]


def _ready(pod: dict[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def ready_endpoints(pool: dict[str, Any] | None, pods: list[dict[str, Any]]) -> int:
    """Ready, not terminating pods the InferencePool's selector matches (what its EPP can pick)."""
    if pool is None:
        return 0
    selector = ((pool.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return sum(1 for p in pods if _ready(p)
               and all(((p.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in selector.items()))


def service_endpoints(slices: list[dict[str, Any]]) -> dict[str, int]:
    """Service name -> ready endpoints over its EndpointSlices (what kube-proxy sends traffic to; an
    unset ``ready`` condition counts as ready, as the API defines it)."""
    out: dict[str, int] = {}
    for s in slices:
        svc = ((s.get("metadata") or {}).get("labels") or {}).get("kubernetes.io/service-name")
        if not svc:
            continue
        ready = sum(1 for e in s.get("endpoints") or [] if (e.get("conditions") or {}).get("ready") is not False)
        out[svc] = out.get(svc, 0) + ready
    return out


def weights_of(route: dict[str, Any]) -> dict[str, int]:
    """InferencePool name -> weight of a route's first rule."""
    rules = (route.get("spec") or {}).get("rules") or [{}]
    return {b["name"]: int(b.get("weight", 1)) for b in rules[0].get("backendRefs") or []
            if b.get("kind") == "InferencePool"}


def route_violations(route: dict[str, Any], pools: dict[str, dict[str, Any]], pods: list[dict[str, Any]]) -> list[str]:
    """Each backend with a positive weight whose pool has no ready endpoint while another backend's pool
    has one (when no pool has any, as before the first pod is ready, there is nothing better to do)."""
    weights = weights_of(route)
    ready = {name: ready_endpoints(pools.get(name), pods) for name in weights}
    if not any(ready.values()):
        return []
    return [f"HTTPRoute {route['metadata']['name']} sends {w}% to InferencePool {name}, which has no ready "
            f"endpoint (ready: {ready})" for name, w in weights.items() if w > 0 and ready[name] == 0]


class RouteWatcher:
    """Watches one namespace of a :class:`~hisparse_devcluster.Cluster` (anything with ``kubectl_path``
    and ``kubeconfig``) from start to stop; ``violations``, ``weights``, ``endpoints`` and ``replicas`` are
    what it saw."""

    KINDS = ("httproutes.gateway.networking.k8s.io", "inferencepools.inference.networking.k8s.io", "pods",
             "deployments.apps", "endpointslices.discovery.k8s.io")
    SKEW_SECONDS = 1.0
    """The watch streams are not ordered with each other: a route change can arrive before the
    pod event that caused it. A violation counts once it has lasted this long (or is there at stop)."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self._pending: dict[str, float] = {}
        self._stopped = threading.Event()
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.violations: list[tuple[float, str]] = []
        self.weights: list[tuple[float, dict[str, int]]] = []
        self.endpoints: list[tuple[float, dict[str, int]]] = []
        self.replicas: list[tuple[float, dict[str, int]]] = []
        """Each change of the Deployments' ``spec.replicas`` (a deleted Deployment is absent)."""
        self.services: list[tuple[float, dict[str, int]]] = []
        """Each change of a Service's ready endpoints (a Service whose slices are gone is absent)."""
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen[str]] = []
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> RouteWatcher:
        for kind in self.KINDS:
            proc = subprocess.Popen(
                [str(self.cluster.kubectl_path), f"--kubeconfig={self.cluster.kubeconfig}", "get", kind, "-n",
                 self.namespace, "--watch", "--output-watch-events", "-o", "json"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._procs.append(proc)
            t = threading.Thread(target=self._read, args=(proc,), daemon=True)
            t.start()
            self._threads.append(t)
        ticker = threading.Thread(target=self._tick, daemon=True)
        ticker.start()
        self._threads.append(ticker)
        return self

    def _tick(self) -> None:
        while not self._stopped.wait(0.25):
            with self._lock:
                self._check(time.monotonic(), "")

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            self._check(time.monotonic(), "", final=True)
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for t in self._threads:
            t.join(timeout=10)

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        decoder, buf = json.JSONDecoder(), ""
        for line in proc.stdout:
            buf += line
            while buf.strip():
                try:
                    event, end = decoder.raw_decode(buf.lstrip())
                except ValueError:
                    break  # an event spans more lines
                buf = buf.lstrip()[end:]
                self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        key = (obj.get("kind", ""), (obj.get("metadata") or {}).get("name", ""))
        now = time.monotonic()
        with self._lock:
            if event.get("type") == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
            self._check(now, key[0])

    def _check(self, now: float, kind: str, final: bool = False) -> None:
        pods = [o for (k, _), o in self.objects.items() if k == "Pod"]
        pools = {n: o for (k, n), o in self.objects.items() if k == "InferencePool"}
        seen = set()
        for (k, _), route in list(self.objects.items()):
            if k != "HTTPRoute":
                continue
            w = weights_of(route)
            if kind == "HTTPRoute" and (not self.weights or self.weights[-1][1] != w):
                self.weights.append((now, w))
            for v in route_violations(route, pools, pods):
                key = v.split(" (ready:")[0]
                seen.add(key)
                first = self._pending.setdefault(key, now)
                if (now - first >= self.SKEW_SECONDS or final) and first >= 0:
                    self.violations.append((first, v))
                    self._pending[key] = -1.0  # reported; until it clears
        for key in [k for k in self._pending if k not in seen]:
            del self._pending[key]
        counts = {n: ready_endpoints(p, pods) for n, p in pools.items()}
        if not self.endpoints or self.endpoints[-1][1] != counts:
            self.endpoints.append((now, counts))
        reps = {n: int((o.get("spec") or {}).get("replicas", 1)) for (k, n), o in self.objects.items() if k == "Deployment"}
        if not self.replicas or self.replicas[-1][1] != reps:
            self.replicas.append((now, reps))
        svcs = service_endpoints([o for (k, _), o in self.objects.items() if k == "EndpointSlice"])
        if not self.services or self.services[-1][1] != svcs:
            self.services.append((now, svcs))
