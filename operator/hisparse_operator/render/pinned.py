"""A revision's pods as the operator that made the revision rendered them, kept so that a later operator
keeps that fleet exactly while it rolls its own rendering through the canary gate.

The revision hashes what shapes serving pods (:mod:`.shaping`): each role's workload and the engine
ConfigMap. Those objects, rendered in a fleet named :data:`FLEET_TOKEN`, are what a revision's snapshot
keeps (:func:`rendering`); :func:`pin` puts them back into another render in place of what the running
operator renders for that fleet now, with the fleet's real name, and the replica counts and owner of the
render they replace. Everything else of the fleet (Services, pools, the EPP, policies) is the running
operator's, so :func:`pin` refuses a render whose selectors would no longer match the kept pods.
"""

from __future__ import annotations

import json
from typing import Any, Final

from .. import names
from ..api import HiSparseDeployment, labels as L, role_spec

FLEET_TOKEN: Final = "hisparse~fleet~"
"""The fleet name the kept objects are rendered under: ``~`` is in no Kubernetes name, label or the
operator's own text, so replacing it is exact (a resource's name never contains it)."""

_WORKLOAD_KINDS: Final = frozenset({"Deployment", "LeaderWorkerSet"})


class PinError(ValueError):
    """The kept rendering cannot be put in place of this render (the message says why)."""


def _shaping_names(base: str, roles: list[str]) -> set[str]:
    return {names.engine_config(base), *(names.role(base, r) for r in roles)}


def _roles(d: HiSparseDeployment) -> list[str]:
    return [r for r in ("prefill", "decode") if role_spec(d, r) is not None]


def rendering(d: HiSparseDeployment) -> list[dict[str, Any]]:
    """The objects that shape ``d``'s serving pods (its workloads and engine ConfigMap), rendered in the
    fleet :data:`FLEET_TOKEN`, without replica counts and owner (those are the fleet's, at each render)."""
    from . import render_validated  # (this module is imported by the package)

    wanted = _shaping_names(FLEET_TOKEN, _roles(d))
    out = []
    for o in render_validated(d.as_fleet(d.owner_name), fleet=FLEET_TOKEN):
        if o["metadata"]["name"] in wanted and (o["kind"] in _WORKLOAD_KINDS or o["kind"] == "ConfigMap"):
            o = json.loads(json.dumps(o))
            o["metadata"].pop("ownerReferences", None)
            (o.get("spec") or {}).pop("replicas", None)
            out.append(o)
    if len(out) != len(wanted):
        raise AssertionError(f"rendering of {d.name}: found {sorted(o['metadata']['name'] for o in out)} of {sorted(wanted)}")
    return out


def _in_fleet(kept: list[dict[str, Any]], base: str) -> list[dict[str, Any]]:
    if "~" in base:
        raise PinError(f"fleet name {base!r} contains '~'")
    return [json.loads(json.dumps(o).replace(FLEET_TOKEN, base)) for o in kept]


def _template(o: dict[str, Any]) -> dict[str, Any]:
    spec = o.get("spec") or {}
    return spec.get("template") or (spec.get("leaderWorkerTemplate") or {}).get("workerTemplate") or {}


def _selectors(o: dict[str, Any]) -> list[dict[str, str]]:
    """The pod selectors of an object (label equality only: the operator renders no other)."""
    spec = o.get("spec") or {}
    out = []
    if o["kind"] == "Service" and isinstance(spec.get("selector"), dict):
        out.append(spec["selector"])
    for key in ("selector", "podSelector"):
        sel = spec.get(key)
        if isinstance(sel, dict) and isinstance(sel.get("matchLabels"), dict):
            out.append(sel["matchLabels"])
    return out


def pin(desired: list[dict[str, Any]], kept: list[dict[str, Any]], *, fleet: str, revision: str) -> list[dict[str, Any]]:
    """``desired`` with fleet ``fleet``'s workloads and engine ConfigMap replaced by ``kept`` (see
    :func:`rendering`), each with the replica count and owner of the object it replaces. Raises
    :class:`PinError` when a kept object has no counterpart in ``desired`` (the running operator names the
    fleet's objects otherwise), is not of ``revision``, or when a selector in ``desired`` that picks a
    role's pods as rendered now would not pick the kept ones."""
    placed = {(o["kind"], o["metadata"]["name"]): o for o in _in_fleet(kept, fleet)}
    at = {(o["kind"], o["metadata"]["name"]): i for i, o in enumerate(desired)}
    missing = sorted(f"{k} {n}" for k, n in placed if (k, n) not in at)
    if missing:
        raise PinError(f"this operator renders no {', '.join(missing)} for fleet {fleet}")
    out = list(desired)
    now_labels, kept_labels = [], []
    for key, o in placed.items():
        if key[0] in _WORKLOAD_KINDS:
            got = (o["metadata"].get("labels") or {}).get(L.REVISION)
            if got != revision:
                raise PinError(f"the kept {key[0]} {key[1]} is of revision {got}, not {revision}")
            now_labels.append((_template(desired[at[key]]).get("metadata") or {}).get("labels") or {})
            kept_labels.append((_template(o).get("metadata") or {}).get("labels") or {})
        live = desired[at[key]]
        o = {**o, "metadata": {**o["metadata"], **({"ownerReferences": live["metadata"]["ownerReferences"]}
                                                    if "ownerReferences" in live["metadata"] else {})}}
        if "replicas" in (live.get("spec") or {}):
            o["spec"] = {**o["spec"], "replicas": live["spec"]["replicas"]}
        out[at[key]] = o
    for obj in out:
        if (obj["kind"], obj["metadata"]["name"]) in placed:
            continue
        for sel in _selectors(obj):
            for now, then in zip(now_labels, kept_labels):
                picks = lambda labels: all(labels.get(k) == v for k, v in sel.items())  # noqa: E731
                if picks(now) and not picks(then):
                    raise PinError(f"{obj['kind']} {obj['metadata']['name']} selects {sel}, which the kept pods "
                                   "of that role do not carry")
    return out
