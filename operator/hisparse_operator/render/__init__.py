"""Render: ``render(cr, facts) -> list[dict]``, the complete set of Kubernetes objects of a
HiSparseDeployment. Pure: no I/O, no clock, no randomness; the same input gives the same bytes.
``hisparse render`` prints exactly what the operator applies outside a canary (during one, the
operator passes a :class:`Canary` for the candidate's fleet)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hisparse_runtime.engine import RoleSettings

from .. import names
from ..api import ClusterFacts, FieldError, HiSparseDeployment, role_settings, role_spec, validate
from .common import revision
from .config import engine_config_map
from .model import model_objects
from .monitoring import monitoring_objects
from .mooncake import mooncake_objects
from .network import network_policies
from .parity import JudgeImage, parity_job, serving_service
from .policy import pdb
from .routing import routing_objects
from .services import nixl_service
from .workloads import workload

__all__ = ["Canary", "InvalidSpec", "render", "render_deployment", "render_validated", "revision"]


class InvalidSpec(ValueError):
    """The resource breaks the API or an engine constraint; nothing may be rendered."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def render_deployment(d: HiSparseDeployment, facts: ClusterFacts | None = None, *,
                      prometheus_url: str | None = None) -> list[dict[str, Any]]:
    """Objects of an already parsed resource; re-checks the engine constraints first."""
    _, errors = validate(d.model_dump(mode="json", by_alias=True, exclude_none=True), facts, prometheus_url=prometheus_url)
    if errors:
        raise InvalidSpec(errors)
    return render_validated(d)


@dataclass(frozen=True)
class Canary:
    """A candidate revision running beside the stable one (the operator's rollout decides these)."""

    candidate: HiSparseDeployment
    """The resource with the candidate's spec (validated), as the resource itself is named."""
    weight: int
    """Percent of the HTTPRoute's requests sent to the candidate's InferencePool."""
    parity: bool
    """Render the Job that compares the candidate's greedy tokens with the stable revision's."""
    attempt: int = 1
    """The rollout's attempt at this revision (``hisparse rollout retry``): each runs a Job of its own."""
    serving: Literal["stable", "candidate"] = "stable"
    """The fleet the resource's own entry points (the Service ``<name>-serving``, the InferencePool
    ``<name>``) select. ``candidate``: they are rendered as aliases of the candidate's
    (``<name>-canary-serving``, ``<name>-canary``: its pods, its port, its endpoint picker), so clients of
    either never meet a fleet with no ready replica (a selector changes without restarting a pod)."""
    judge: JudgeImage | None = None
    """The parity Job's image when the operator pins one (None: the stable revision's)."""


def render_validated(d: HiSparseDeployment, canary: Canary | None = None) -> list[dict[str, Any]]:
    """Objects of a resource that :func:`validate` accepted; checks nothing itself (the caller validated
    it, against the node facts it has). ``canary``: also the candidate's own complete set of objects,
    named from ``<name>-canary``, the HTTPRoute split between both pools and the parity Job."""
    out = _revision_objects(d, canary.weight if canary else None)
    if canary is not None:
        candidate = canary.candidate.canary()
        # The model cache belongs to the resource: a candidate with the stable's model shares its Job.
        seen = {(o["kind"], o["metadata"]["name"]) for o in out}
        theirs = [o for o in _revision_objects(candidate, None) if (o["kind"], o["metadata"]["name"]) not in seen]
        if canary.serving == "candidate":
            out = [_aliased(o, d, candidate, theirs) for o in out]
        out += theirs
        if canary.parity:
            out.append(parity_job(d, candidate, revision(canary.candidate), attempt=canary.attempt, judge=canary.judge))
    return out


def _aliased(o: dict[str, Any], d: HiSparseDeployment, candidate: HiSparseDeployment,
             theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """``o`` with the spec of the candidate's counterpart when ``o`` is one of ``d``'s entry points (the
    Service ``<name>-serving``, the InferencePool ``<name>``); any other object unchanged."""
    entry = {("Service", names.serving(d.name)): names.serving(candidate.name),
             ("InferencePool", names.inference_pool(d.name)): names.inference_pool(candidate.name)}
    twin = entry.get((o["kind"], o["metadata"]["name"]))
    if twin is None:
        return o
    spec = next(t["spec"] for t in theirs if t["kind"] == o["kind"] and t["metadata"]["name"] == twin)
    return {**o, "spec": copy.deepcopy(spec)}


def _revision_objects(d: HiSparseDeployment, canary_weight: int | None) -> list[dict[str, Any]]:
    roles: dict[str, RoleSettings] = {r: role_settings(d, r) for r in ("prefill", "decode") if role_spec(d, r) is not None}
    # The model's cache and download first: the reconciler applies in this order, and creates a serving
    # workload only once the Job it names has completed.
    out: list[dict[str, Any]] = [*model_objects(d), engine_config_map(d, roles)]
    for role, s in roles.items():
        spec = role_spec(d, role)  # type: ignore[arg-type]
        assert spec is not None
        out.append(workload(d, spec, s))
        if s.disaggregated:
            out.append(nixl_service(d, s))
        out.append(pdb(d, s))
    out.append(serving_service(d))
    out += mooncake_objects(d)
    out += routing_objects(d, roles["decode"], canary_weight)
    out += monitoring_objects(d, list(roles))
    out += network_policies(d, roles)
    return out


def render(cr: dict[str, Any] | HiSparseDeployment, facts: ClusterFacts | None = None,
           spelled: Mapping[tuple[str | int, ...], str] | None = None, *,
           prometheus_url: str | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object for ``cr`` (a manifest dict or a parsed resource); ``prometheus_url``:
    the operator's ``HISPARSE_PROMETHEUS_URL``, which analysis steps without their own query.

    Raises :class:`InvalidSpec` with every field-path error when the resource is invalid."""
    if isinstance(cr, HiSparseDeployment):
        return render_deployment(cr, facts, prometheus_url=prometheus_url)
    d, errors = validate(cr, facts, spelled, prometheus_url=prometheus_url)
    if errors or d is None:
        raise InvalidSpec(errors)
    return render_validated(d)
