"""The status through the real apiserver: every field the operator writes (``status.canary`` of the
rollout planner, the parity verdict, conditions, roles, revisions) survives a status write and read. The apiserver prunes what the CRD's structural schema lacks (an in-memory cluster does
not), so a rollout control kept in a pruned key is lost between reconciles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from e2e_helpers import apply_crds, get_json

from pydantic import BaseModel

from hisparse_operator.api.status import CanaryStatus, HiSparseDeploymentStatus, ParityStatus

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"

# A value other than the default for every field of the API model (the test below fails when a field is
# added without one here, so new fields are round-tripped too).
CANARY: dict[str, Any] = {
    "revision": "0123456789", "attempt": 2, "step": 1, "weight": 25, "phase": "Shifting", "fleet": "roundtrip-012345", "upgrade": True,
    "stepStartedAt": "2026-12-04T10:00:00Z", "readyAt": "2026-12-04T09:00:00Z",
    "waitingSince": "2026-12-04T10:00:01Z", "shrinkSince": "2026-12-04T10:00:02Z", "shrinkTo": {"prefill": 3, "decode": 1},
    "replicas": {"prefill": {"stable": 7, "candidate": 1}, "decode": {"stable": 1, "candidate": 1}},
    "paused": True, "holdReason": "step 2 waits for a promote (hisparse rollout promote)", "promote": True,
    "handledAction": "promote@1", "message": "held",
    "failingSince": "2026-12-04T10:00:03Z", "failure": {
        "role": "decode", "pod": "roundtrip-012345-decode-7d9f-x2k4q", "container": "vllm", "reason": "ImagePullBackOff",
        "message": 'Back-off pulling image "registry.invalid/hisparse-runtime:typo"'},
    "servingFleet": "candidate",
    "analysis": {"step": 1, "queries": {"error-rate": {
        "measured": 3, "passed": 1, "failed": 1, "inconclusive": 1, "errors": 2, "consecutiveErrors": 1,
        "lastAt": "2026-12-04T10:00:04Z", "last": "error: Prometheus unreachable", "phase": "Inconclusive"}}},
}


PARITY: dict[str, Any] = {
    "revision": "0123456789", "passed": False, "prompts": 8, "diverged": 1, "nearTies": 2, "tokens": 512,
    "reason": "Diverged", "firstDivergence": "prompt 3, token 17: stable 412 (margin 1.3), candidate 88 (margin 0.9)",
    "message": "1 of 8 prompts diverged", "report": "roundtrip-parity-report", "finishedAt": "2026-12-04T10:05:00Z",
}

STATUS: dict[str, Any] = {
    "observedGeneration": 3,
    "conditions": [{"type": "Ready", "status": "False", "reason": "CanaryRolledBack", "message": "parity failed",
                    "lastTransitionTime": "2026-12-04T10:05:01Z", "observedGeneration": 3},
                   {"type": "GatewayAdmitted", "status": "False", "reason": "GatewayUnnamed",
                    "message": "the NetworkPolicies admit no gateway", "lastTransitionTime": "2026-12-04T10:05:01Z",
                    "observedGeneration": 3}],
    "prefill": {"replicas": 8, "readyReplicas": 7, "pods": 8, "ready": "7/8"},
    "decode": {"replicas": 1, "readyReplicas": 1, "pods": 8, "ready": "1/1"},
    "stableRevision": "abcdef0123", "stableFleet": "roundtrip-abcdef", "canaryRevision": "0123456789", "canary": CANARY,
    "parity": PARITY,
    "kvCompatHash": "5f2c1a9e0b",
}


def _aliases(model: type[BaseModel]) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def _round_trip(cluster: Any, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """Store an example under ``name``, write ``status`` through the status subresource, read it back. No
    operator (nor its webhook) runs in this module: the object is only stored."""
    apply_crds(cluster, CRD)
    doc = yaml.safe_load((REPO / "examples" / "deepseek-v32-single-node.yaml").read_text())
    doc["metadata"].update(namespace=namespace, name=name)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    try:
        cluster.kubectl("patch", "hsd", name, "-n", namespace, "--subresource=status", "--type=merge",
                        "-p", json.dumps({"status": status}))
        return get_json(cluster, "hsd", name, "-n", namespace)["status"]
    finally:
        cluster.kubectl("delete", "hsd", name, "-n", namespace)


def test_every_status_field_survives_the_apiserver(cluster: Any, namespace: str) -> None:
    """The whole status, the parity verdict's fields (the report's ConfigMap, near-ties, the first
    divergence) included: a field the CRD lacked would be pruned here."""
    assert set(STATUS) == _aliases(HiSparseDeploymentStatus), sorted(_aliases(HiSparseDeploymentStatus) - set(STATUS))
    assert set(PARITY) == _aliases(ParityStatus), sorted(_aliases(ParityStatus) - set(PARITY))
    HiSparseDeploymentStatus.model_validate(STATUS)
    assert _round_trip(cluster, namespace, "roundtrip-all", STATUS) == STATUS


def test_every_canary_field_the_planner_writes_survives_the_apiserver(cluster: Any, namespace: str) -> None:
    fields = _aliases(CanaryStatus)
    assert set(CANARY) == fields, f"fields without a round-trip value: {sorted(fields - set(CANARY))}"
    CanaryStatus.model_validate(CANARY)
    assert _round_trip(cluster, namespace, "roundtrip", {"canary": CANARY})["canary"] == CANARY
