"""The revision of a HiSparseDeployment: a hash of what shapes its serving pods, derived from the
rendered objects themselves (as vLLM's ``compute_hash`` hashes a config minus a documented list of
ignored fields), so a new field or a new rendering rule that reshapes pods is a new revision by default
and goes through the canary gate.

Hashed: each role's rendered workload (Deployment or LeaderWorkerSet: pod template, group size, restart
and rollout policy, placement annotations) and the engine ConfigMap the pods read. ``EXCLUDED`` lists
what is left out, and why.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from ..api import HiSparseDeployment, role_settings, role_spec

REVISION_LENGTH: Final = 10

PLACEHOLDER: Final = ""
"""The value the revision label has while the revision is computed (a hash cannot contain itself)."""

EXCLUDED: Final[dict[tuple[str, ...], str]] = {
    ("metadata", "ownerReferences"): "the resource's uid: the same for every revision of one resource",
    ("spec", "replicas"): "scaling is not a rollout (the canary moves replicas itself)",
}
"""Paths left out of each hashed workload, with the reason."""

_cache: dict[int, tuple[HiSparseDeployment, str]] = {}
_CACHE_SIZE: Final = 256


def _drop(o: dict[str, Any], path: tuple[str, ...]) -> None:
    for key in path[:-1]:
        o = o.get(key) or {}
    o.pop(path[-1], None)


def pod_shaping(d: HiSparseDeployment) -> dict[str, Any]:
    """What the revision hashes, as rendered for ``d`` named as the resource itself (a candidate copy
    renders the same objects under other names, and must have the same revision)."""
    from .config import engine_config_map
    from .workloads import workload

    d = d.as_fleet(d.owner_name)
    roles = {r: role_settings(d, r) for r in ("prefill", "decode") if role_spec(d, r) is not None}
    out: dict[str, Any] = {"engineConfig": engine_config_map(d, roles).get("data")}
    for role, s in roles.items():
        spec = role_spec(d, role)  # type: ignore[arg-type]
        assert spec is not None
        w = workload(d, spec, s, rev=PLACEHOLDER)
        for path in EXCLUDED:
            _drop(w, path)
        out[role] = w
    return out


def revision(d: HiSparseDeployment) -> str:
    """Hash of everything that shapes serving pods; a new value is a new revision to roll out."""
    hit = _cache.get(id(d))
    if hit is not None and hit[0] is d:
        return hit[1]
    text = json.dumps(pod_shaping(d), sort_keys=True, separators=(",", ":"))
    rev = hashlib.sha256(text.encode()).hexdigest()[:REVISION_LENGTH]
    if len(_cache) >= _CACHE_SIZE:
        _cache.clear()
    _cache[id(d)] = (d, rev)  # the models are immutable; the entry keeps ``d`` alive so ids are not reused
    return rev
