"""Status from observed children (pure): per-role counts, conditions, revisions."""

from __future__ import annotations

from typing import Any

from .. import names
from ..api import HiSparseDeployment
from ..api.roles import role_spec
from ..render.common import revision
from ..render.network import gateway_peers
from . import conditions as C
from .model import ModelGate
from .rollout import Decision


def _workload_counts(obj: dict[str, Any] | None, desired: int) -> tuple[int, int, bool]:
    """(pods-level replicas, ready replicas, current) of a Deployment or LeaderWorkerSet."""
    if obj is None:
        return 0, 0, False
    st = obj.get("status") or {}
    current = (st.get("observedGeneration") or 0) >= (obj["metadata"].get("generation") or 0)
    if obj["kind"] == "Deployment":
        updated = st.get("updatedReplicas") or 0
        ready = min(st.get("readyReplicas") or 0, updated)
        return st.get("replicas") or 0, ready, current and updated >= desired
    # LeaderWorkerSet: counts are groups (replicas), not pods.
    ready = st.get("readyReplicas") or 0
    updated = st.get("updatedReplicas", ready) or 0
    return st.get("replicas") or 0, min(ready, updated), current


def role_status(d: HiSparseDeployment, role: str, workload: dict[str, Any] | None) -> dict[str, Any]:
    spec = role_spec(d, role)  # type: ignore[arg-type]
    desired = spec.replicas if spec else 0
    replicas, ready, _ = _workload_counts(workload, desired)
    return {"replicas": desired, "readyReplicas": ready, "pods": replicas * (spec.parallelism.nodes if spec else 0),
            "ready": f"{ready}/{desired}"}


def gateway_admitted(d: HiSparseDeployment) -> tuple[bool, str, str]:
    """``GatewayAdmitted``: (status, reason, message)."""
    if not d.spec.routing.enabled or not d.spec.network_policy.enabled:
        return True, C.GATEWAY_NOT_APPLICABLE, "routing or spec.networkPolicy is off: no policy stands before a gateway"
    peers = gateway_peers(d)
    if not peers:
        return False, C.GATEWAY_UNNAMED, (
            "the NetworkPolicies admit no gateway to decode's serving port or the endpoint picker: nothing names "
            "it (spec.routing.gatewayRef, spec.networkPolicy.gatewayNamespaces or gatewayCIDRs); where the network "
            "enforces NetworkPolicies no request of a gateway reaches the deployment. Set the one that says where "
            "your gateway's proxies run")
    shown = []
    for p in peers:
        if "ipBlock" in p:
            shown.append(p["ipBlock"]["cidr"])
            continue
        ns = p["namespaceSelector"]["matchLabels"]
        labels = (p.get("podSelector") or {}).get("matchLabels") or {}
        shown.append(f"pods of namespace {next(iter(ns.values()))}"
                     + (" labelled " + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) if labels else ""))
    return True, C.GATEWAY_NAMED, "the NetworkPolicies admit the gateway: " + "; ".join(shown)


def compute(
    d: HiSparseDeployment, observed: dict[tuple[str, str], dict[str, Any]], previous: dict[str, Any], *,
    config_errors: list[str], kv_hash: str | None, now: str, settle: bool = True, model: ModelGate | None = None,
    model_revision: str | None = None, base_revision: str | None = None,
) -> dict[str, Any]:
    """The full ``status`` given the children (``(kind, name) -> object``) and the previous status.
    ``settle``: a fleet that is ready makes its revision the stable one (never while a canary runs:
    only the rollout promotes). ``model``: the spec's model cache verdict (``ModelReady``), about the
    revision ``model_revision`` (default: ``d``'s; during a canary ``d`` is the stable fleet's resource).
    ``base_revision``: the revision ``d``'s pods run when that is not ``d``'s own (an earlier operator's
    rendering of its spec, kept as it runs)."""
    gen = d.metadata.generation
    conds: list[dict[str, Any]] = list(previous.get("conditions") or [])

    def put(type_: str, ok: bool, reason: str, message: str) -> None:
        nonlocal conds
        conds = C.set_condition(conds, type_, ok, reason, message, generation=gen, now=now)

    status: dict[str, Any] = {k: v for k, v in previous.items() if k not in ("conditions", "observedGeneration")}
    if config_errors:
        put("ConfigValid", False, C.INVALID_SPEC, "; ".join(config_errors)[:32000])
        put("Ready", False, C.INVALID_SPEC, "the spec is invalid: nothing new was applied (see ConfigValid)")
        status.update(observedGeneration=gen, conditions=conds)
        return status
    put("ConfigValid", True, C.VALID, "the spec passed the API schema and every engine constraint")
    model_ok = model is None or model.ready
    if model is not None:
        put("ModelReady", model.ready, model.reason, model.message)
    # A new revision whose model is not in the cache yet (or failed to download) does not stop the stable
    # revision's pods from serving: as a Deployment whose new ReplicaSet cannot start stays Available, the
    # deployment stays Ready, ModelReady says why the new revision waits, and Progressing says that it does.
    stable = previous.get("stableRevision")
    model_waits = not model_ok and bool(stable) and stable != (model_revision or revision(d))

    ready_roles = []
    for role, type_ in (("prefill", "PrefillReady"), ("decode", "DecodeReady")):
        spec = role_spec(d, role)  # type: ignore[arg-type]
        if spec is None:
            put(type_, True, C.NOT_DEPLOYED, f"no {role} role: decode prefills locally")
            status.pop(role, None)
            ready_roles.append(True)
            continue
        kind = "Deployment" if spec.parallelism.nodes == 1 else "LeaderWorkerSet"
        rs = role_status(d, role, observed.get((kind, names.role(d.name, role))))
        status[role] = rs
        ok = rs["readyReplicas"] >= rs["replicas"]
        note = " (decode readiness includes a verified prefill->decode KV transfer)" if role == "decode" and d.spec.prefill else ""
        reason = C.REPLICAS_READY if ok else (C.WAITING_FOR_DATA_PATH if role == "decode" and d.spec.prefill and rs["pods"] else C.REPLICAS_NOT_READY)
        put(type_, ok, reason, f"{rs['ready']} {kind} replicas ready{note}")
        ready_roles.append(ok)

    if not d.spec.routing.enabled:
        put("RouterReady", True, C.ROUTING_DISABLED, "spec.routing.enabled is false")
        router_ok = True
    else:
        epp = observed.get(("Deployment", names.epp(d.name)))
        pool = observed.get(("InferencePool", names.inference_pool(d.name)))
        available = bool(epp and ((epp.get("status") or {}).get("availableReplicas") or 0) >= 1)
        router_ok = available and pool is not None
        put("RouterReady", router_ok, C.ROUTER_AVAILABLE if router_ok else C.ROUTER_UNAVAILABLE,
            "InferencePool and endpoint picker available" if router_ok else "waiting for the endpoint picker and InferencePool")

    put("GatewayAdmitted", *gateway_admitted(d))

    all_ok = all(ready_roles) and router_ok and (model_ok or model_waits)
    rev = base_revision or revision(d)
    waiting = [t for t, ok in zip(("ModelReady", "PrefillReady", "DecodeReady", "RouterReady"),
                                  (model_ok or model_waits, *ready_roles, router_ok)) if not ok]
    put("Ready", all_ok, C.ALL_READY if all_ok else C.NOT_READY,
        "serving through llm-d" if all_ok else "waiting for: " + ", ".join(waiting))
    if model_waits:
        put("Progressing", True, C.ROLLING_OUT,
            f"revision {rev} waits for its model ({model.reason if model else ''}: see ModelReady); {stable} keeps serving")
    else:
        put("Progressing", not all_ok, C.ROLLING_OUT if not all_ok else C.STABLE,
            f"rolling out revision {rev}" if not all_ok else f"revision {rev} is serving")
    any_ready = any((status.get(r) or {}).get("readyReplicas") for r in ("prefill", "decode"))
    put("Degraded", bool(any_ready and not all_ok), C.PARTIALLY_AVAILABLE if any_ready and not all_ok else C.HEALTHY,
        "some replicas are serving, others are not ready" if any_ready and not all_ok else "no degradation")
    if all_ok and model_ok and settle:
        status["stableRevision"] = rev
        status["kvCompatHash"] = kv_hash
    status.update(observedGeneration=gen, conditions=conds)
    return status


def with_rollout(status: dict[str, Any], decision: Decision, *, candidate: str, generation: int | None,
                 now: str) -> dict[str, Any]:
    """``status`` with the rollout's fields and its ``Progressing`` / ``Degraded`` verdicts."""
    out = dict(status)
    for key, value in (("canary", decision.canary_status), ("canaryRevision", candidate if decision.canary else None)):
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    if decision.parity_status is not None:
        out["parity"] = decision.parity_status
    if decision.promoted:
        out["stableRevision"] = candidate
        fleet = (decision.canary_status or {}).get("fleet")
        if fleet:
            # The candidate's fleet serves on as the stable one, under its own name (see rollout.promote).
            out["stableFleet"] = fleet
    conds = out.get("conditions") or []
    if decision.progressing:
        conds = C.set_condition(conds, "Progressing", True, *decision.progressing, generation=generation, now=now)
    if decision.degraded:
        conds = C.set_condition(conds, "Degraded", True, *decision.degraded, generation=generation, now=now)
    out["conditions"] = conds
    return out


def strip_volatile(status: dict[str, Any]) -> dict[str, Any]:
    """Status without timestamps: what decides whether a status write is needed."""
    out = dict(status)
    out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []]
    return out

