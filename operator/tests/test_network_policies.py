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


def test_gateway_namespace_is_the_setting_then_the_gateway_ref_and_never_assumed() -> None:
    from hisparse_operator.controller.status import gateway_admitted
    from hisparse_operator.render.network import gateway_namespaces

    doc = yaml.safe_load(VALID_EXAMPLES[0].read_text())
    doc["spec"].setdefault("routing", {})["gatewayRef"] = {"name": "gw"}
    assert gateway_namespaces(HiSparseDeployment.model_validate(doc)) == [doc["metadata"]["namespace"]]
    doc["spec"]["routing"]["gatewayRef"] = {"name": "gw", "namespace": "edge"}
    d = HiSparseDeployment.model_validate(doc)
    assert gateway_namespaces(d) == ["edge"]
    ok, reason, message = gateway_admitted(d)
    assert ok and reason == "GatewayNamed" and "pods of namespace edge labelled " + L.GATEWAY_NAME + "=gw" in message
    doc["spec"]["networkPolicy"] = {"gatewayNamespaces": ["proxies"]}
    assert gateway_namespaces(HiSparseDeployment.model_validate(doc)) == ["proxies"]


def test_a_gateway_nothing_names_is_admitted_nowhere_and_the_condition_says_how_to_name_it() -> None:
    """No gatewayRef, no gatewayNamespaces, no gatewayCIDRs: the deployment's own namespace is not assumed to
    be the gateway (its pods reach nothing), and GatewayAdmitted is False with the fields that fix it."""
    from hisparse_operator.controller.status import gateway_admitted

    doc = yaml.safe_load(VALID_EXAMPLES[0].read_text())
    doc["spec"].setdefault("routing", {}).pop("gatewayRef", None)
    d = HiSparseDeployment.model_validate(doc)
    ok, reason, message = gateway_admitted(d)
    assert not ok and reason == "GatewayUnnamed"
    assert all(f in message for f in ("gatewayRef", "gatewayNamespaces", "gatewayCIDRs")), message
    objs = render(doc)
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    pods = {kind_of(p, d.name): p for p in pods_of(objs)}
    neighbour = Pod("neighbour/any", d.namespace or "default", {"app": "envoy"})
    decode, epp = pods["decode"], pods["epp"]
    namespaces = {neighbour.namespace: {"kubernetes.io/metadata.name": neighbour.namespace}}
    assert not allowed(policies, neighbour, decode, decode.ports.get("http", decode.ports["vllm"]), namespaces=namespaces)
    assert not allowed(policies, neighbour, epp, epp.ports["grpc"], namespaces=namespaces)
    # Named by its networks alone: admitted.
    doc["spec"]["networkPolicy"] = {"gatewayCIDRs": ["10.129.0.0/23"]}
    assert gateway_admitted(HiSparseDeployment.model_validate(doc))[:2] == (True, "GatewayNamed")
    # Routing off, or the policies off: nothing to admit through.
    doc["spec"]["networkPolicy"] = {"enabled": False}
    assert gateway_admitted(HiSparseDeployment.model_validate(doc))[:2] == (True, "NoGatewayPolicy")

def _policies_and_pods(spec: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Pod], str]:
    """The first example with ``spec`` merged in: its policies, and its decode and EPP pods by kind."""
    doc = yaml.safe_load(VALID_EXAMPLES[0].read_text())
    for key, value in spec.items():
        doc["spec"].setdefault(key, {}).update(value)
    objs = render(doc)
    inside = {kind_of(p, doc["metadata"]["name"]): p for p in pods_of(objs)}
    return [o for o in objs if o["kind"] == "NetworkPolicy"], inside, doc["metadata"]["namespace"]


def _reach(policies: list[dict[str, Any]], src: Pod, dst: Pod, port: int) -> bool:
    namespaces = {n: {"kubernetes.io/metadata.name": n} for n in (src.namespace, dst.namespace)}
    return allowed(policies, src, dst, port, namespaces=namespaces)


def test_a_gateway_ref_lets_in_its_proxies_and_no_other_pod_of_their_namespace() -> None:
    """GEP-1762's label on the Gateway's proxies selects them; a pod of the same namespace without it (in the
    deployment's own namespace, where a gatewayRef with no namespace puts the gateway) reaches neither the
    serving port nor the EPP."""
    policies, pods, ns = _policies_and_pods({"routing": {"gatewayRef": {"name": "edge-gw"}}})
    decode, epp = pods["decode"], pods["epp"]
    proxy = Pod("gateway/proxy", ns, {L.GATEWAY_NAME: "edge-gw"})
    other_gateway = Pod("gateway/other", ns, {L.GATEWAY_NAME: "another-gw"})
    neighbour = Pod("neighbour/any", ns, {"app": "unrelated"})
    serving, grpc = decode.ports.get("http", decode.ports["vllm"]), epp.ports["grpc"]
    assert _reach(policies, proxy, decode, serving) and _reach(policies, proxy, epp, grpc)
    for outsider in (other_gateway, neighbour):
        assert not _reach(policies, outsider, decode, serving), outsider
        assert not _reach(policies, outsider, epp, grpc), outsider
    assert not _reach(policies, proxy, pods["prefill"], pods["prefill"].ports["nixl"])  # the data path stays shut


def test_gateway_pod_labels_and_namespaces_override_the_default() -> None:
    ns_only, pods, ns = _policies_and_pods({"routing": {"gatewayRef": {"name": "edge-gw"}},
                                            "networkPolicy": {"gatewayPodLabels": {}}})
    decode = pods["decode"]
    serving = decode.ports.get("http", decode.ports["vllm"])
    assert _reach(ns_only, Pod("any", ns, {"app": "x"}), decode, serving)  # {}: every pod of the namespace
    labelled, pods, _ = _policies_and_pods({"routing": {"gatewayRef": {"name": "edge-gw"}},
                                            "networkPolicy": {"gatewayPodLabels": {"app": "envoy"}}})
    assert _reach(labelled, Pod("envoy", ns, {"app": "envoy"}), decode, serving)
    assert not _reach(labelled, Pod("gw", ns, {L.GATEWAY_NAME: "edge-gw"}), decode, serving)
    # Namespaces named explicitly (a controller's namespace, such as Envoy Gateway's): every pod of them.
    explicit, pods, _ = _policies_and_pods({"routing": {"gatewayRef": {"name": "edge-gw"}},
                                            "networkPolicy": {"gatewayNamespaces": ["envoy-gateway-system"]}})
    assert _reach(explicit, Pod("proxy", "envoy-gateway-system", {"app": "envoy"}), decode, serving)
    assert not _reach(explicit, Pod("gw", ns, {L.GATEWAY_NAME: "edge-gw"}), decode, serving)


def test_gateway_cidrs_admit_proxies_that_are_not_pods_to_the_serving_port_and_the_epp_only() -> None:
    policies, pods, _ = _policies_and_pods({"networkPolicy": {"gatewayCIDRs": ["10.129.0.0/23", "fd00:1::/64"]}})
    decode, epp, prefill = pods["decode"], pods["epp"], pods["prefill"]
    serving, grpc = decode.ports.get("http", decode.ports["vllm"]), epp.ports["grpc"]
    for ip in ("10.129.1.7", "fd00:1::9"):
        lb = Pod(f"lb/{ip}", "", {}, ip=ip)
        assert _reach(policies, lb, decode, serving) and _reach(policies, lb, epp, grpc), ip
        assert not _reach(policies, lb, decode, decode.ports["vllm"]) or serving == decode.ports["vllm"]
        assert not _reach(policies, lb, prefill, prefill.ports["vllm"]), ip
    assert not _reach(policies, Pod("lb/outside", "", {}, ip="10.129.2.1"), decode, serving)


@pytest.mark.parametrize(("value", "message"), [
    ("10.129.0.1/23", "canonical form: write '10.129.0.0/23'"),
    ("10.129.0.0", "canonical form: write '10.129.0.0/32'"),
    ("10.300.0.0/16", "is not a CIDR"),
    ("edge", "is not a CIDR"),
])
def test_a_gateway_cidr_that_is_not_canonical_is_refused_with_its_path_and_fix(value: str, message: str) -> None:
    from pydantic import ValidationError

    doc = yaml.safe_load(VALID_EXAMPLES[0].read_text())
    doc["spec"].setdefault("networkPolicy", {})["gatewayCIDRs"] = ["10.0.0.0/8", value]
    with pytest.raises(ValidationError) as err:
        HiSparseDeployment.model_validate(doc)
    text = str(err.value)
    assert message in text and "gatewayCIDRs" in text.replace("gateway_cidrs", "gatewayCIDRs"), text


@pytest.mark.parametrize("variant", ["as-written", "no-gateway", "no-monitoring", "routing-off"])
@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_no_rendered_rule_admits_every_source(path, variant: str) -> None:
    """A rule whose ``from`` is absent or empty admits every source; none is rendered, whatever is unset."""
    doc = yaml.safe_load(path.read_text())
    if variant == "no-gateway":
        doc["spec"].setdefault("routing", {}).pop("gatewayRef", None)
    elif variant == "no-monitoring":
        doc["spec"].setdefault("networkPolicy", {})["monitoringNamespaces"] = []
    elif variant == "routing-off":
        # Routing off is decode-only: with a prefill role it is refused (nothing would send prompts to prefill).
        doc["spec"].setdefault("routing", {})["enabled"] = False
        doc["spec"]["routing"].pop("gatewayRef", None)
        doc["spec"].pop("prefill", None)
        doc["spec"].get("kvTransfer", {}).pop("mooncake", None)
    policies = [o for o in with_canary(doc) if o["kind"] == "NetworkPolicy"]
    assert policies
    for p in policies:
        for rule in p["spec"].get("ingress", []):
            assert rule.get("from"), (p["metadata"]["name"], rule)


# Egress (networkPolicy.egress): the second table of render/network.py.
DNS_PORT = 53
HUB_CIDR, HUB_IP, HUB_PORT = "203.0.113.0/24", "203.0.113.7", 443


def expected_egress(src: str, dst: str, port: int, protocol: str, ports: dict[str, int], *, pods_read: bool) -> bool:
    """Where a pod may connect under the egress policies, written out independently of the render."""
    s_role, _, s_canary = src.partition("@")
    if s_role not in ("prefill", "decode"):
        return True  # the EPP, the parity Job and the download Job keep unrestricted egress
    d_role, _, d_canary = dst.partition("@")
    if dst == "dns":
        return port == DNS_PORT
    if dst == "hub":
        return pods_read and protocol == "TCP" and port == HUB_PORT
    if "/" in dst or d_canary != s_canary:
        return False
    if d_role in ("prefill", "decode"):
        return True  # every port and protocol, as the ingress rule between P/D pods
    return (s_role == "prefill" and d_role == "mooncake-master" and protocol == "TCP"
            and port in (ports["rpc"], ports["metadata"]))


@pytest.mark.parametrize("mode", ["as-written", "PodEphemeral"])
@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_egress_of_the_serving_pods_is_exactly_what_the_table_says(path, mode: str) -> None:
    """With ``egress.enabled``: serving pods reach their own fleet, the Mooncake master (prefill), the DNS and,
    only where they download the model themselves, the model source; nothing else, on either protocol."""
    from dataclasses import replace

    from netpol import connects, egress_allowed

    doc = yaml.safe_load(path.read_text())
    if mode == "PodEphemeral" and doc["spec"]["model"]["source"].startswith("hf://"):
        doc["spec"]["model"]["cache"] = {"mode": "PodEphemeral"}
    doc["spec"].setdefault("networkPolicy", {})["egress"] = {"enabled": True, "modelSourceCIDRs": [HUB_CIDR],
                                                       "modelSourcePorts": [HUB_PORT]}
    pods_read = HiSparseDeployment.model_validate(doc).spec.model.read_by_serving_pods
    objs = with_canary(doc)
    ns, base = doc["metadata"]["namespace"], doc["metadata"]["name"]
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["name"] for p in policies if "Egress" in p["spec"]["policyTypes"]} >= {f"{base}-decode-egress"}
    inside = [replace(p, ip=f"10.1.0.{i + 1}") for i, p in enumerate(pods_of(objs))]
    outside = [Pod("dns", "kube-system", {"k8s-app": "kube-dns"}, ip="10.1.1.1"),
               Pod("hub", "", {}, ip=HUB_IP),
               Pod("neighbour/any", ns, {"app": "unrelated"}, ip="10.1.1.2"),
               Pod("elsewhere/any", ELSEWHERE_NS, {"app": "x"}, ip="10.1.1.3"),
               Pod("internet/any", "", {}, ip="198.51.100.9")]
    namespaces = {n: {"kubernetes.io/metadata.name": n} for n in (ns, ELSEWHERE_NS, "kube-system")}
    failures, checked = [], 0
    for src in inside:
        s_kind = kind_of(src, base)
        for dst in inside + outside:
            if dst == src:
                continue
            d_kind = kind_of(dst, base) if dst in inside else dst.name
            for port in sorted(set(dst.ports.values()) | {UCX_DATA_PORT, DNS_PORT, HUB_PORT}):
                for protocol in ("TCP", "UDP"):
                    got = egress_allowed(policies, src, dst, port, namespaces=namespaces, protocol=protocol)
                    want = expected_egress(s_kind, d_kind, port, protocol, dst.ports, pods_read=pods_read)
                    checked += 1
                    if got != want:
                        failures.append(f"{s_kind} -> {d_kind}:{port}/{protocol} egress={got}, want {want}")
    assert not failures, f"{len(failures)}/{checked} differ:\n" + "\n".join(failures[:40])
    # Egress does not undo ingress: decode still opens connections to its own prefill, on a UCX port.
    decode = next(p for p in inside if kind_of(p, base) == "decode")
    prefill = next((p for p in inside if kind_of(p, base) == "prefill"), None)
    if prefill is not None:
        assert connects(policies, decode, prefill, UCX_DATA_PORT, namespaces=namespaces)


def test_egress_is_off_by_default_and_refused_without_policies_or_a_source_the_pods_need() -> None:
    from pydantic import ValidationError

    doc = yaml.safe_load(VALID_EXAMPLES[0].read_text())
    assert not [o for o in render(doc) if o["kind"] == "NetworkPolicy" and "Egress" in o["spec"]["policyTypes"]]
    doc["spec"].setdefault("networkPolicy", {}).update({"enabled": False, "egress": {"enabled": True}})
    with pytest.raises(ValidationError) as err:
        HiSparseDeployment.model_validate(doc)
    assert "networkPolicy.egress.enabled with networkPolicy.enabled false" in str(err.value)
    doc["spec"]["networkPolicy"]["enabled"] = True
    assert doc["spec"]["model"]["source"].startswith("hf://"), "this test needs an hf:// example"
    doc["spec"]["model"] = {**doc["spec"]["model"], "cache": {"mode": "PodEphemeral"}}
    with pytest.raises(ValidationError) as err:
        HiSparseDeployment.model_validate(doc)
    assert "names no model source" in str(err.value) and "modelSourceCIDRs" in str(err.value)
    doc["spec"]["networkPolicy"]["egress"]["modelSourceNamespaces"] = ["hub"]
    HiSparseDeployment.model_validate(doc)


@pytest.mark.parametrize(("endpoint", "setting", "ports"), [
    (None, [], [443]),
    ("http://model-hub:8080", [], [8080]),
    ("http://mirror.internal", [], [80]),
    ("https://mirror.internal/hf", [], [443]),
    ("http://model-hub:8080", [9000, 9000, 8443], [8443, 9000]),
])
def test_the_model_source_port_is_the_setting_else_the_endpoint_s(endpoint, setting, ports) -> None:
    from hisparse_operator.render.network import model_source_ports

    doc = yaml.safe_load(VALID_EXAMPLES[0].read_text())
    doc["spec"]["model"].pop("endpoint", None)
    if endpoint:
        doc["spec"]["model"]["endpoint"] = endpoint
    doc["spec"].setdefault("networkPolicy", {})["egress"] = {"modelSourcePorts": setting}
    assert model_source_ports(HiSparseDeployment.model_validate(doc)) == ports
