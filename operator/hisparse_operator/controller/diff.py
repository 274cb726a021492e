"""Does a live object already hold everything we would apply? (Pure.)

Server-side apply of unchanged content is still a write request. The reconciler skips it when every
field of the desired object is present with the same value in the live one (the apiserver adds
defaults and other managers add fields, so "subset", not "equal"). Quantities are compared as numbers,
since the apiserver may re-spell them (``1024Mi`` is returned as ``1Gi``).
"""

from __future__ import annotations

from typing import Any

from ..api import labels as L
from ..api.kube import parse_quantity


def _same_scalar(want: Any, have: Any) -> bool:
    if want == have:
        return True
    if isinstance(want, (str, int)) and isinstance(have, (str, int)) and not isinstance(want, bool):
        try:
            return parse_quantity(want) == parse_quantity(have)
        except (ValueError, KeyError, ArithmeticError):
            return str(want) == str(have)
    return False


def is_subset(want: Any, have: Any) -> bool:
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return False
        return all(k in have and is_subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        # Lists are atomic or keyed in Kubernetes; either way ours must match item by item.
        return isinstance(have, list) and len(want) == len(have) and all(is_subset(w, h) for w, h in zip(want, have))
    return _same_scalar(want, have)


OWN_LABEL_PREFIX = f"{L.GROUP}/"

CREATE_ONLY_KINDS: frozenset[str] = frozenset({"ControllerRevision"})
"""Kinds written once and never updated: a ControllerRevision's ``data`` is immutable."""


def needs_apply(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    if live is None:
        return True
    if desired.get("kind") in CREATE_ONLY_KINDS:
        return False
    dm, lm = desired.get("metadata", {}), live.get("metadata", {})
    for key in ("labels", "annotations"):
        if not is_subset(dm.get(key, {}), lm.get(key) or {}):
            return True
    # Our own labels are only ever ours: one we no longer set (a promoted fleet's ``track``) is removed
    # by applying without it (server-side apply drops what its manager stopped sending).
    if any(k.startswith(OWN_LABEL_PREFIX) and k not in dm.get("labels", {}) for k in lm.get("labels") or {}):
        return True
    want_refs = {(r["uid"], r.get("controller", False)) for r in dm.get("ownerReferences", [])}
    have_refs = {(r.get("uid"), r.get("controller", False)) for r in lm.get("ownerReferences") or []}
    if not want_refs <= have_refs:
        return True
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata")}
    return not is_subset(body, live)
