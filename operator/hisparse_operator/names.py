"""Names of the objects rendered for a HiSparseDeployment (one place, used by render and the API)."""

from __future__ import annotations

from typing import Final


FLEET_SUFFIX_LENGTH: Final = 6
"""Hex digits of a revision in a candidate fleet's name: ``-`` and these fit the suffix budget the
40-character resource name leaves (the same seven characters ``-canary`` took)."""
LEGACY_CANDIDATE_SUFFIX: Final = "canary"
"""The candidate fleet's suffix before fleets were named by revision (a rollout an earlier operator
started, whose ``status.canary.fleet`` is unset, keeps this name)."""


def fleet(name: str, revision: str, *, besides: str | None = None) -> str:
    """Base name of the fleet a candidate revision starts in: ``<name>-<revision[:6]>``, or the legacy
    ``<name>-canary`` in the one case that would meet the stable fleet's own name (``besides``)."""
    out = f"{name}-{revision[:FLEET_SUFFIX_LENGTH]}"
    return legacy_candidate_fleet(name) if out == besides else out


def legacy_candidate_fleet(name: str) -> str:
    """The candidate fleet of a rollout whose status names none (an earlier operator's)."""
    return f"{name}-{LEGACY_CANDIDATE_SUFFIX}"


def engine_config(name: str) -> str:
    return f"{name}-engine"


def role(name: str, role: str) -> str:
    """Deployment or LeaderWorkerSet of a role."""
    return f"{name}-{role}"


def nixl_service(name: str, role: str) -> str:
    return f"{name}-{role}-nixl"


def pdb(name: str, role: str) -> str:
    return f"{name}-{role}"


def pod_monitor(name: str, component: str) -> str:
    return f"{name}-{component}"


def inference_pool(name: str) -> str:
    return name


def epp(name: str) -> str:
    return f"{name}-epp"


def http_route(name: str) -> str:
    return name


def serving(name: str) -> str:
    """ClusterIP Service of the pods that take requests (decode: its sidecar does P/D)."""
    return f"{name}-serving"


def parity_job(name: str, digest: str) -> str:
    """The Job comparing a candidate revision's tokens with the stable one's (``digest``: of its pod)."""
    return f"{name}-parity-{digest}"


def snapshot(name: str, revision: str) -> str:
    """ControllerRevision holding the spec of one revision (the stable one is rendered from it)."""
    return f"{name}-{revision}"


def mooncake_master(name: str) -> str:
    return f"{name}-mooncake-master"


def service_host(service: str, namespace: str) -> str:
    return f"{service}.{namespace}.svc"


def model_cache(name: str) -> str:
    """PersistentVolumeClaim of the shared model cache (one per resource; revisions sit side by side)."""
    return f"{name}-model-cache"


def model_fetch(name: str, digest: str) -> str:
    """The Job filling one model revision into the cache (``digest``: of its pod)."""
    return f"{name}-model-{digest}"


def parity_report(name: str) -> str:
    """ConfigMap keeping the last parity Job's full report (written by the operator, not rendered)."""
    return f"{name}-parity-report"
