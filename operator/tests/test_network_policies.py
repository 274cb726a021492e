"""The rendered NetworkPolicies, evaluated (``netpol.py``) for every pair of rendered pods, the candidate's
fleet and pods outside the deployment, on every port the pods serve plus a port of UCX's choosing: each
connection is allowed exactly when the table in ``render/network.py`` says so."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from netpol import Pod, allowed, pods_of
from opsupport import VALID_EXAMPLES

from hisparse_operator.api import HiSparseDeployment, labels as L
from hisparse_operator.render import Canary, render, render_validated

GATEWAY_NS, MONITORING_NS, ELSEWHERE_NS = "gateway-system", "monitoring", "elsewhere"
UCX_DATA_PORT = 43123
"""A port NIXL's UCX TCP transport might pick for data."""


def kind_of(p: Pod, base: str) -> str:
    """``prefill``, ``decode``, ``epp``, ``mooncake-master``, ``parity``, ``model-fetch``, each with ``@canary``
    for the candidate."""
    fleet = p.labels.get(L.DEPLOYMENT)
    if fleet is None:
        return p.name
    return p.labels[L.APP_COMPONENT] + ("@canary" if fleet != base else "")


def expected(src: str, dst: str, port: int, ports: dict[str, int], *, itself: bool = False) -> bool:
    """The table of render/network.py, written out independently of the render (``itself``: a pod connecting
    to its own address, which no policy can refuse)."""
    if itself:
        return True
    s_role, _, s_canary = src.partition("@")
    d_role, _, d_canary = dst.partition("@")
    same_fleet = s_canary == d_canary and "/" not in src
    serving = ports.get("http", ports.get("vllm"))
    if d_role == "prefill":
        if same_fleet and s_role in ("decode", "prefill"):
            return True
        if same_fleet and s_role == "epp":
            return port == ports["vllm"]
        return src.startswith("monitoring/") and port == ports["vllm"]
    if d_role == "decode":
        if same_fleet and s_role == "decode":
            return True
        if (same_fleet and s_role == "epp") or s_role == "parity" and s_canary or src.startswith(("gateway/", "client/")):
            return port == serving
        return src.startswith("monitoring/") and port in (serving, ports["vllm"])
    if d_role == "epp":
        return (src.startswith("gateway/") and port == ports["grpc"]) or (src.startswith("monitoring/") and port == ports["metrics"])
    if d_role == "mooncake-master":
        if same_fleet and s_role == "prefill":
            return port in (ports["rpc"], ports["metadata"])
        return src.startswith("monitoring/") and port == ports["metrics"]
    if d_role in ("parity", "model-fetch"):
        return False  # clients only: the parity Job and the model download Job take no connections
    raise AssertionError(f"unexpected pod kind {dst}")


def with_canary(doc: dict[str, Any]) -> list[dict[str, Any]]:
    d = HiSparseDeployment.model_validate(doc)
    new = yaml.safe_load(yaml.safe_dump(doc))
    new["spec"].setdefault("engine", {})["image"] = d.spec.engine.image + "-candidate"
    return render_validated(d, Canary(candidate=HiSparseDeployment.model_validate(new), weight=0, parity=True))


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_every_connection_is_what_the_table_says(path) -> None:
    doc = yaml.safe_load(path.read_text())
    doc["spec"].setdefault("networkPolicy", {})["gatewayNamespaces"] = [GATEWAY_NS]
    doc["spec"]["networkPolicy"]["clientNamespaces"] = ["clients"]
    objs = with_canary(doc)
    ns, base = doc["metadata"]["namespace"], doc["metadata"]["name"]
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert policies, f"{path.name} renders no NetworkPolicy: this test would check nothing"
    inside = pods_of(objs)
    kinds = {kind_of(p, base) for p in inside}
    assert {"decode", "decode@canary", "epp", "parity@canary"} <= kinds, kinds
    outside = [Pod("gateway/envoy", GATEWAY_NS, {"app": "envoy"}), Pod("monitoring/prometheus", MONITORING_NS, {"app": "prometheus"}),
               Pod("client/app", "clients", {"app": "client"}), Pod("elsewhere/any", ELSEWHERE_NS, {"app": "x"}),
               Pod("neighbour/any", ns, {"app": "unrelated"})]
    namespaces = {n: {"kubernetes.io/metadata.name": n} for n in (ns, GATEWAY_NS, MONITORING_NS, ELSEWHERE_NS, "clients")}
    checked = wrong = 0
    failures = []
    for dst in inside:
        d_kind = kind_of(dst, base)
        ports = sorted(set(dst.ports.values()) | {UCX_DATA_PORT})
        for src in inside + outside:
            s_kind = kind_of(src, base)
            for port in ports:
                got = allowed(policies, src, dst, port, namespaces=namespaces)
                want = expected(s_kind, d_kind, port, dst.ports, itself=src == dst)
                checked += 1
                if got != want:
                    wrong += 1
                    failures.append(f"{s_kind} -> {d_kind}:{port} allowed={got}, want {want}")
    assert not failures, f"{wrong}/{checked} connections differ:\n" + "\n".join(failures[:40])
    assert checked > 100


def test_the_evaluator_is_not_vacuous() -> None:
    """Without the render's policies everything is reachable; with a deny-all nothing is."""
    objs = render(yaml.safe_load(VALID_EXAMPLES[0].read_text()))
    pods = pods_of(objs)
    deny = [o for o in objs if o["kind"] == "NetworkPolicy" and "ingress" not in o["spec"]]
    assert len(deny) == 1
    a, b = pods[0], pods[1]
    assert allowed([], a, b, 1, namespaces={})
    assert not allowed(deny, Pod("x", "elsewhere", {}), b, 8000, namespaces={})


def test_switch_off_renders_none() -> None:
    doc = yaml.safe_load(VALID_EXAMPLES[0].read_text())
    doc["spec"]["networkPolicy"] = {"enabled": False}
    assert not [o for o in render(doc) if o["kind"] == "NetworkPolicy"]


def test_gateway_namespace_defaults_to_the_gateway_ref_then_the_deployment() -> None:
    from hisparse_operator.render.network import gateway_namespaces

    doc = yaml.safe_load(VALID_EXAMPLES[0].read_text())
    d = HiSparseDeployment.model_validate(doc)
    assert gateway_namespaces(d) == [(d.spec.routing.gateway_ref.namespace if d.spec.routing.gateway_ref and
                                      d.spec.routing.gateway_ref.namespace else d.namespace)]
    doc["spec"].setdefault("routing", {})["gatewayRef"] = {"name": "gw", "namespace": "edge"}
    assert gateway_namespaces(HiSparseDeployment.model_validate(doc)) == ["edge"]
