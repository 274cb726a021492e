"""Metadata, labels and revision shared by every rendered object."""

from __future__ import annotations

from typing import Any, Final

from ..api import HiSparseDeployment, labels as L
from ..api.kube import Resources

def revision(d: HiSparseDeployment) -> str:
    """Hash of whatever shapes ``d``'s serving pods (see :mod:`.shaping`)."""
    from .shaping import revision as _revision

    return _revision(d)


def instance_labels(d: HiSparseDeployment, component: str) -> dict[str, str]:
    """Labels of a rendered object: ``DEPLOYMENT`` names the resource that owns it (the operator finds
    and prunes its children by it), a candidate's objects included."""
    out = {
        L.APP_NAME: L.APP_NAME_VALUE,
        L.APP_INSTANCE: d.owner_name,
        L.APP_COMPONENT: component,
        L.APP_MANAGED_BY: L.FIELD_MANAGER,
        L.DEPLOYMENT: d.owner_name,
    }
    if d.is_canary:
        out[L.TRACK] = L.TRACK_CANARY
    return out


def selector_labels(d: HiSparseDeployment, component: str) -> dict[str, str]:
    """Immutable selector of a workload: never include values that change between revisions. Pods carry
    their fleet's base name here (``<name>``, or ``<name>-<revision>`` for a fleet a canary started), so
    no selector of one fleet matches another's pods."""
    return {L.DEPLOYMENT: d.name, L.APP_COMPONENT: component}


def owner_references(d: HiSparseDeployment) -> list[dict[str, Any]]:
    if not d.metadata.uid:
        return []  # rendered from a file: the operator adds the reference when it applies
    return [{
        "apiVersion": L.API_VERSION, "kind": L.KIND, "name": d.owner_name, "uid": d.metadata.uid,
        "controller": True, "blockOwnerDeletion": True,
    }]


def meta(d: HiSparseDeployment, name: str, component: str, *, extra_labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {
        "name": name,
        "namespace": d.namespace,
        "labels": {**instance_labels(d, component), **(extra_labels or {})},
    }
    if annotations:
        m["annotations"] = annotations
    refs = owner_references(d)
    if refs:
        m["ownerReferences"] = refs
    return m


def obj(api_version: str, kind: str, metadata: dict[str, Any], **body: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **body}


RESTRICTED_CONTAINER: Final[dict[str, Any]] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""Security context of every container that needs no privilege (EPP, sidecar, Mooncake master)."""


def resources(r: Resources, **extra: str) -> dict[str, Any]:
    """A container's ``resources`` from the API's :class:`Resources` (quantities as strings), with
    ``extra`` set on both requests and limits (``nvidia.com/gpu``)."""
    requests = {k: str(v) for k, v in r.requests.items()} | extra
    limits = {k: str(v) for k, v in r.limits.items()} | extra
    return {"requests": requests, "limits": limits}


def support_placement(d: HiSparseDeployment) -> dict[str, Any]:
    """``nodeSelector`` and ``tolerations`` of the pods that need no GPU (``spec.supportPods``); empty
    fields are left out (the apiserver does not store them, and they would read as drift)."""
    p = d.spec.support_pods
    out: dict[str, Any] = {}
    if p.node_selector:
        out["nodeSelector"] = dict(p.node_selector)
    if p.tolerations:
        out["tolerations"] = [t.to_json_dict() for t in p.tolerations]
    return out

