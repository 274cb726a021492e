"""The operator's only door to the apiserver: get, server-side apply, prune, status, events.

Every write goes through here, so the metrics (and the no-op benchmark) count them all.
"""

from __future__ import annotations

import datetime
import functools
from typing import Any

from kubernetes import client as k8s
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

from ..api import labels as L
from . import metrics

CHILD_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ConfigMap"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
    ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("inference.networking.k8s.io/v1", "InferencePool"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("batch/v1", "Job"),
    ("apps/v1", "ControllerRevision"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
)
"""Every kind render produces: listed for pruning and watched for drift."""


def _as_dict(_client: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Serializer for the dynamic client's requests: the response as parsed JSON. Its default wraps every
    field of the body in an object (``ResourceInstance``), which ``to_dict`` then copies back."""
    return data


def with_removals(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) that turns ``old`` into ``new``: ``new`` with a null for every key
    it no longer has, at any depth (a merge patch that merely omits a key leaves it in place)."""
    out = dict(new)
    for key, value in old.items():
        if key not in new:
            out[key] = None
        elif isinstance(value, dict) and isinstance(new[key], dict):
            out[key] = with_removals(value, new[key])
    return out


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kube:
    def __init__(self, api_client: k8s.ApiClient) -> None:
        self.api_client = api_client
        self.dynamic = DynamicClient(api_client)

    @functools.cache  # noqa: B019 (one Kube per process; discovery results are stable)
    def resource(self, api_version: str, kind: str) -> Any:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def has_kind(self, api_version: str, kind: str) -> bool:
        try:
            self.resource(api_version, kind)
        except ResourceNotFoundError:
            self.resource.cache_clear()  # it may be installed later
            return False
        return True

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return self.resource(api_version, kind).get(name=name, namespace=namespace, serializer=_as_dict)
        except NotFoundError:
            return None

    def list(self, api_version: str, kind: str, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        return [i.to_dict() for i in self.resource(api_version, kind).get(namespace=namespace, label_selector=selector).items]

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply under the operator's field manager; returns the object as stored."""
        res = self.resource(obj["apiVersion"], obj["kind"])
        live = res.server_side_apply(body=obj, name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"),
                                     field_manager=L.FIELD_MANAGER, force_conflicts=True, serializer=_as_dict)
        metrics.API_WRITES.labels(verb="apply", kind=obj["kind"]).inc()
        return live

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        try:
            self.resource(api_version, kind).delete(name=name, namespace=namespace,
                                                   body={"propagationPolicy": "Background"})
            metrics.API_WRITES.labels(verb="delete", kind=kind).inc()
        except NotFoundError:
            pass

    def patch(self, api_version: str, kind: str, namespace: str | None, name: str, body: dict[str, Any],
              content_type: str) -> dict[str, Any]:
        live = self.resource(api_version, kind).patch(name=name, namespace=namespace, body=body,
                                                      content_type=content_type, field_manager=L.FIELD_MANAGER,
                                                      serializer=_as_dict)
        metrics.API_WRITES.labels(verb="patch", kind=kind).inc()
        return live

    def patch_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Set the HiSparseDeployment's status to ``status`` (``body``: the resource as last read); returns
        the object as stored. The patch carries the resourceVersion read: if the resource changed since,
        the apiserver refuses it (409, ``ConflictError``) and nothing is written."""
        res = self.resource(L.API_VERSION, L.KIND)
        patch = with_removals(body.get("status") or {}, status)
        meta: dict[str, Any] = {}
        if body["metadata"].get("resourceVersion"):
            meta["resourceVersion"] = body["metadata"]["resourceVersion"]
        live = res.status.patch(name=body["metadata"]["name"], namespace=body["metadata"]["namespace"],
                                body={"metadata": meta, "status": patch}, content_type="application/merge-patch+json",
                                serializer=_as_dict)
        metrics.API_WRITES.labels(verb="status", kind=L.KIND).inc()
        return live

    def pod_log(self, namespace: str, pod: str, container: str, *, limit_bytes: int, tail_lines: int) -> str:
        """The end of a container's log (a finished parity pod's report); bounded in size and time."""
        # Raw bytes: the client would otherwise decode a log that happens to be one JSON document.
        response = k8s.CoreV1Api(self.api_client).read_namespaced_pod_log(
            pod, namespace, container=container, limit_bytes=limit_bytes, tail_lines=tail_lines,
            _request_timeout=(5, 20), _preload_content=False)
        return bytes(response.data).decode("utf-8", errors="replace")

    def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = body["metadata"]
        self.resource("v1", "Event").create(namespace=meta["namespace"], serializer=_as_dict, body={
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": body["apiVersion"], "kind": body["kind"], "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024], "source": {"component": L.FIELD_MANAGER},
            "firstTimestamp": now(), "lastTimestamp": now(), "count": 1,
        })
        metrics.API_WRITES.labels(verb="event", kind="Event").inc()
