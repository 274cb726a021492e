"""Conditions: the contract (types in ``api.status``), reasons users can act on, and the pure setter.

Like LeaderWorkerSet's ``setCondition``: ``lastTransitionTime`` moves only when ``status`` changes, and
every condition carries the ``observedGeneration`` it was computed for.
"""

from __future__ import annotations

from typing import Any, Final

# Reasons (CamelCase, stable: dashboards and alerts match on them).
VALID: Final = "Valid"
INVALID_SPEC: Final = "InvalidSpec"
REPLICAS_READY: Final = "ReplicasReady"
REPLICAS_NOT_READY: Final = "ReplicasNotReady"
WAITING_FOR_DATA_PATH: Final = "WaitingForKVTransfer"
NOT_DEPLOYED: Final = "RoleNotDeployed"
ROUTER_AVAILABLE: Final = "EndpointPickerAvailable"
ROUTER_UNAVAILABLE: Final = "EndpointPickerUnavailable"
ROUTING_DISABLED: Final = "RoutingDisabled"
ALL_READY: Final = "AllReady"
NOT_READY: Final = "ComponentsNotReady"
ROLLING_OUT: Final = "RollingOut"
STABLE: Final = "Stable"
PARTIALLY_AVAILABLE: Final = "PartiallyAvailable"
HEALTHY: Final = "Healthy"
# GatewayAdmitted: whether the NetworkPolicies name the gateway (render/network.py).
GATEWAY_NAMED: Final = "GatewayNamed"
GATEWAY_UNNAMED: Final = "GatewayUnnamed"
"""Routing and the NetworkPolicies are on, and no field names the gateway's pods or networks."""
GATEWAY_NOT_APPLICABLE: Final = "NoGatewayPolicy"
"""Routing or the NetworkPolicies are off: no policy stands between a gateway and the pods."""
# A canary rollout (Progressing while it runs, Degraded after a rollback).
CANARY_STARTING: Final = "CanaryStarting"
CANARY_PARITY: Final = "CanaryParity"
CANARY_SHIFTING: Final = "CanaryShifting"
CANARY_PROMOTING: Final = "CanaryPromoting"
CANARY_ROLLED_BACK: Final = "CanaryRolledBack"
CANARY_PAUSED: Final = "CanaryPaused"
CANARY_ANALYSIS: Final = "CanaryAnalysis"
CANARY_STALLED: Final = "CanaryPromotionStalled"
CANARY_WINDING_DOWN: Final = "CanaryWindingDown"
CANARY_SUPERSEDED: Final = "CanarySuperseded"
CANARY_PROMOTED: Final = "CanaryPromoted"
UPGRADE_QUEUED: Final = "UpgradeQueued"
"""This operator renders the stable spec as another revision and would canary it, but as many deployments
as HISPARSE_UPGRADE_CANARIES allows canary theirs already: the stable fleet stays as it runs meanwhile."""
# ModelReady: the model revision's cache (see controller/model.py).
MODEL_CACHED: Final = "Cached"
MODEL_DOWNLOADING: Final = "Downloading"
"""The download Job runs (or waits to be scheduled, or retries); serving workloads of the revision wait."""
CREDENTIALS_MISSING: Final = "CredentialsMissing"
"""The credential Secret (or one of its keys) does not exist: the download cannot start."""
CREDENTIALS_REFUSED: Final = "CredentialsRefused"
"""The source refused the credentials (or has no access for them): the Job fails without retrying."""
DOWNLOAD_FAILED: Final = "DownloadFailed"
"""The Job gave up; the message carries the fetcher's last line. The fetcher's own reasons
(``hisparse_runtime.engine.FETCH_EXIT_CODES``: also ``ModelNotFound`` for an unknown repository or revision,
``CacheFull``) are the condition's reason when it gave one."""
MODEL_FETCHED_BY_PODS: Final = "FetchedByPods"
MODEL_READ_IN_PLACE: Final = "ReadInPlace"
ROLLOUT_ACTION: Final = "RolloutControl"
ROLLOUT_HELD: Final = "RolloutHeld"
"""Something the rollout cannot act on safely (a missing snapshot, an unreadable status): nothing was
applied; the message says what is wrong and the fix."""


def find(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def set_condition(
    conditions: list[dict[str, Any]], type_: str, status: bool | str, reason: str, message: str, *,
    generation: int | None, now: str,
) -> list[dict[str, Any]]:
    """A new list with ``type_`` set; other conditions are kept in order."""
    status_s = status if isinstance(status, str) else ("True" if status else "False")
    old = find(conditions, type_)
    changed = old is None or old.get("status") != status_s
    new = {
        "type": type_,
        "status": status_s,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now if changed else old.get("lastTransitionTime", now),  # type: ignore[union-attr]
    }
    if generation is not None:
        new["observedGeneration"] = generation
    out = [new if c.get("type") == type_ else c for c in conditions]
    return out if old is not None else [*out, new]


def transitions(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conditions whose status or reason changed: each becomes one Kubernetes Event."""
    out = []
    for c in after:
        old = find(before, c["type"])
        if old is None or old.get("status") != c["status"] or old.get("reason") != c["reason"]:
            out.append(c)
    return out
