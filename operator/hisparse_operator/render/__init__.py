"""Render: ``render(cr, facts) -> list[dict]``, the complete set of Kubernetes objects of a
HiSparseDeployment. Pure: no I/O, no clock, no randomness; the same input gives the same bytes.
``hisparse render`` prints exactly what the operator applies outside a canary while the stable fleet is
the resource's first (``status.stableFleet`` unset; after a promotion the operator renders the same spec
under the promoted fleet's name, and during a canary it passes a :class:`Canary` for the candidate's)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hisparse_runtime.engine import RoleSettings

from .. import names
from ..api import ClusterFacts, FieldError, HiSparseDeployment, labels as L, role_settings, role_spec, validate
from .common import revision
from .config import engine_config_map
from .model import fetch_job_name, model_objects, shared_cache, with_retention
from .monitoring import monitoring_objects
from .mooncake import mooncake_objects
from .network import network_policies
from .parity import JudgeImage, parity_job, serving_service
from .policy import pdb
from .routing import http_route, routing_objects
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
    ``<name>``) select. They are rendered as aliases of that fleet's own (its pods, its port, its
    endpoint picker) whenever that fleet is not named ``<name>``, so clients of either never meet a fleet
    with no ready replica (a selector changes without restarting a pod)."""
    judge: JudgeImage | None = None
    """The parity Job's image when the operator pins one (None: the stable revision's)."""
    fleet: str | None = None
    """Base name of the candidate's fleet (``status.canary.fleet``; None: :func:`..names.fleet` of its
    revision)."""


def render_validated(d: HiSparseDeployment, canary: Canary | None = None, *, fleet: str | None = None) -> list[dict[str, Any]]:
    """Objects of a resource that :func:`validate` accepted; checks nothing itself (the caller validated
    it, against the node facts it has). ``fleet``: the base name of the fleet ``d``'s spec runs in (the
    stable one, ``status.stableFleet``; None: ``<name>``). ``canary``: also the candidate's own complete
    set of objects, named from its fleet, the HTTPRoute split between both pools and the parity Job. The
    resource's own entry points (``<name>-serving``, the InferencePool ``<name>``) are always rendered,
    as aliases of the serving fleet's when that fleet has another name."""
    resource = d.as_fleet(d.owner_name)
    stable = d.as_fleet(fleet or d.owner_name)
    if canary is None:
        route = http_route(resource, [(names.inference_pool(stable.name), 100)])
        return _with_entry_points(resource, stable, _revision_objects(stable, route))
    base = canary.fleet or names.fleet(resource.name, revision(canary.candidate), besides=stable.name)
    cand = canary.candidate.as_fleet(base, candidate=True)
    backends = [(names.inference_pool(stable.name), 100 - canary.weight), (names.inference_pool(cand.name), canary.weight)]
    out = _revision_objects(stable, http_route(resource, backends))
    # The model cache belongs to the resource: a candidate with the stable's model shares its Job. A Job of
    # the candidate's own removes what neither fleet serves once it has filled its revision.
    seen = {(o["kind"], o["metadata"]["name"]) for o in out}
    keep = [stable.spec.model.cache_dir] if stable.spec.model.cache_dir and shared_cache(stable) else []
    own_job = fetch_job_name(cand) if keep else None
    out += [with_retention(o, keep) if o["kind"] == "Job" and o["metadata"]["name"] == own_job else o
            for o in _revision_objects(cand, None) if (o["kind"], o["metadata"]["name"]) not in seen]
    if canary.parity:
        out.append(parity_job(stable, cand, revision(canary.candidate), attempt=canary.attempt, judge=canary.judge))
    return _with_entry_points(resource, cand if canary.serving == "candidate" else stable, out)


def _with_entry_points(resource: HiSparseDeployment, fleet: HiSparseDeployment,
                       out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``out`` with the resource's entry points (the Service ``<name>-serving``, the InferencePool
    ``<name>``) selecting ``fleet``: its own when it is named ``<name>``, else copies of its counterparts
    under the resource's names (an existing one takes the copy's spec in place)."""
    if fleet.name == resource.name:
        return out
    out = list(out)
    for kind, entry, twin_name in (("Service", names.serving(resource.name), names.serving(fleet.name)),
                                   ("InferencePool", names.inference_pool(resource.name), names.inference_pool(fleet.name))):
        twin = next((o for o in out if o["kind"] == kind and o["metadata"]["name"] == twin_name), None)
        if twin is None:
            continue  # (no InferencePool without routing)
        at = next((i for i, o in enumerate(out) if o["kind"] == kind and o["metadata"]["name"] == entry), None)
        labels = {k: v for k, v in (twin["metadata"].get("labels") or {}).items() if k != L.TRACK}
        alias = {**twin, "metadata": {**twin["metadata"], "name": entry, "labels": labels}, "spec": copy.deepcopy(twin["spec"])}
        if at is None:
            out.insert(out.index(twin) + 1, alias)
        else:
            out[at] = {**out[at], "spec": alias["spec"]}
    return out


def _revision_objects(d: HiSparseDeployment, route: dict[str, Any] | None) -> list[dict[str, Any]]:
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
    out += routing_objects(d, roles["decode"], route)
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
