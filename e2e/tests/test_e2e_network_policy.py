"""The rendered NetworkPolicies, enforced for real on the real node.

kube-router's network policy controller (its firewall mode, the one k3s embeds; iptables and ipsets in
the node's namespace, built from its Go module) enforces the NetworkPolicies the render makes for the CPU
example with a canary in flight. Every rendered pod template becomes a pod on the real node with the
template's labels, listening on each of its named ports and on a port of UCX's choosing (busybox's httpd:
these tests are about the network, not the engine); pods in a gateway, a monitoring, a client and an
unrelated namespace, and an unlabelled neighbour, are the outside. The gateway is named by ``gatewayRef``
alone, so its namespace holds its proxy (with Gateway API's label for the Gateway's proxies) and a pod that
is not one; a proxy that is not a pod of the cluster (a load balancer's) stands as a pod of its own
namespace that the policies admit by its address only (``gatewayCIDRs``). Each pod then connects to every port
of every labelled pod, and what got through must be exactly what the evaluator of the unit tests
(operator/tests/netpol.py, itself checked there against the table of render/network.py) predicts.
Before the policies exist, every connection gets through: a refusal afterwards comes from the policies,
not from a listener that was never up. Then the serving pods' egress is restricted too
(``networkPolicy.egress``), with two more outside listeners as destinations (a cluster DNS stand-in and a
model hub mirror), and what got through must be what both ends' policies allow.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_realnode import BUSYBOX_IMAGE, busybox_archive, busybox_pod, pod, sh, wait_pods_ready
from hisparse_devcluster import Cluster
from hisparse_devcluster.realnode import RealNode

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "operator" / "tests"))

from netpol import Pod, allowed, connects, pods_of  # noqa: E402
from test_network_policies import UCX_DATA_PORT, kind_of, with_canary  # noqa: E402

pytestmark = pytest.mark.host

NS = "netpol-e2e"
OUTSIDE = {"gateway": "netpol-gateway", "monitoring": "netpol-monitoring", "client": "netpol-clients",
           "elsewhere": "netpol-elsewhere", "lb": "netpol-lb"}
"""The outside's namespaces, by the role the policies give them (``elsewhere``: none; ``lb``: none but the
address of its pod)."""
LISTENERS = [("dns/coredns", "netpol-dns", {"k8s-app": "kube-dns"}, {"dns": 5353, "other": 8053}),
             ("hub/mirror", "netpol-hub", {"app": "hub"}, {"http": 8080})]
"""Outside pods that listen: a cluster DNS stand-in (its pod port is not 53, as the dev cluster's CoreDNS's is
not) and a model hub mirror, the destinations egress names or must refuse."""
DNS_PORT = 5353
GATEWAY = "inference-gateway"
LB = "lb/any"
"""The pod standing for a proxy that is not a pod of the cluster: admitted by its address alone."""


def _outside() -> list[Pod]:
    from hisparse_operator.api import labels as L

    pods = [Pod(f"{role}/any", ns, {"app": role}) for role, ns in OUTSIDE.items()]
    pods.append(Pod("gateway/proxy", OUTSIDE["gateway"], {"app": "gateway-proxy", L.GATEWAY_NAME: GATEWAY}))
    pods.append(Pod("neighbour/any", NS, {"app": "unrelated"}))
    return pods


def _rendered(lb_ip: str = "192.0.2.1", *, egress: bool = False) -> tuple[list[dict[str, Any]], list[Pod], str]:
    """Policies and pods of the CPU example with a canary; ``lb_ip``: the address ``gatewayCIDRs`` admits;
    ``egress``: the serving pods' egress restricted too (DNS: the stand-in's namespace, labels and port).
    Egress does not change the pods' revision, so the pods (and the candidate fleet's name) are the same."""
    doc = yaml.safe_load((REPO / "examples" / "cpu-tiny.yaml").read_text())
    doc["metadata"]["namespace"] = NS
    doc["spec"]["routing"]["gatewayRef"] = {"name": GATEWAY, "namespace": OUTSIDE["gateway"]}
    doc["spec"]["networkPolicy"] = {"gatewayCIDRs": [f"{lb_ip}/32"],
                                    "monitoringNamespaces": [OUTSIDE["monitoring"]],
                                    "clientNamespaces": [OUTSIDE["client"]]}
    if egress:
        dns_ns, dns_labels = LISTENERS[0][1], LISTENERS[0][2]
        doc["spec"]["networkPolicy"]["egress"] = {"enabled": True, "dnsNamespaces": [dns_ns],
                                                  "dnsPodLabels": dns_labels, "dnsPorts": [DNS_PORT]}
    objs = with_canary(doc)
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    return policies, pods_of(objs), doc["metadata"]["name"]


def _pod_name(p: Pod) -> str:
    return p.name.replace("/", "-")[:63]


def _listener(name: str, namespace: str, labels: dict[str, str], ports: list[int]) -> dict[str, Any]:
    serve = "; ".join(f"/bin/busybox httpd -p {p} -h /tmp/www" for p in ports)
    script = f"/bin/busybox mkdir -p /tmp/www && echo reached > /tmp/www/index.html; {serve}; exec /bin/busybox sleep 3600"
    obj = busybox_pod(name, namespace, script, labels=labels, port=ports[0])
    obj["spec"]["containers"][0]["ports"] = [{"containerPort": p} for p in ports]
    return obj


@pytest.fixture(scope="module")
def enforced(cluster: Cluster, node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    archive = busybox_archive(tmp_path_factory.mktemp("images") / "busybox.tar")
    assert node.import_image(archive) == [BUSYBOX_IMAGE]
    node.enforce_network_policies()
    yield node


@pytest.fixture(scope="module")
def fleet(cluster: Cluster, enforced: RealNode) -> Iterator[dict[str, Any]]:
    """The pods (rendered templates and the outside), Ready, with their IPs; no policy applied yet (the
    policies admit the load balancer's pod by the address it got)."""
    _, inside, base = _rendered()
    listeners = [Pod(name, ns, labels, ports) for name, ns, labels, ports in LISTENERS]
    namespaces = [NS, *OUTSIDE.values(), *(p.namespace for p in listeners)]
    for ns in namespaces:
        cluster.kubectl("create", "namespace", ns)
    try:
        objs, names = [], {}
        for p in inside:
            ports = sorted(set(p.ports.values()) | {UCX_DATA_PORT})
            names[p.name] = (NS, _pod_name(p))
            objs.append(_listener(_pod_name(p), NS, p.labels, ports))
        for p in listeners:
            names[p.name] = (p.namespace, _pod_name(p))
            objs.append(_listener(_pod_name(p), p.namespace, p.labels, sorted(p.ports.values())))
        outside = _outside()
        for p in outside:
            names[p.name] = (p.namespace, _pod_name(p))
            objs.append(busybox_pod(_pod_name(p), p.namespace, "exec /bin/busybox sleep 3600", labels=p.labels))
        cluster.apply(objs)
        for ns in namespaces:
            wait_pods_ready(cluster, ns, [n for (pns, n) in names.values() if pns == ns], timeout=240)
        ips = {k: pod(cluster, ns, n)["status"]["podIP"] for k, (ns, n) in names.items()}
        policies = _rendered(ips[LB])[0]
        inside = [dataclasses.replace(p, ip=ips[p.name]) for p in inside]
        outside = [dataclasses.replace(p, ip=ips[p.name]) for p in outside]
        listeners = [dataclasses.replace(p, ip=ips[p.name]) for p in listeners]
        yield {"policies": policies, "inside": inside, "outside": outside, "listeners": listeners, "base": base,
               "names": names,
               "ips": ips, "namespaces": {n: {"kubernetes.io/metadata.name": n} for n in namespaces}}
    finally:
        for ns in namespaces:
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _targets(fleet: dict[str, Any]) -> list[tuple[Pod, int]]:
    return [*((dst, port) for dst in fleet["inside"] for port in sorted(set(dst.ports.values()) | {UCX_DATA_PORT})),
            *((dst, port) for dst in fleet["listeners"] for port in sorted(dst.ports.values()))]


def _reached(cluster: Cluster, fleet: dict[str, Any], src: Pod) -> dict[tuple[str, int], bool]:
    """Which targets ``src`` reaches: one exec runs busybox's nc against each (an HTTP GET that must come
    back with the listener's page; a refused or dropped connection gives nothing within 3 s)."""
    targets = _targets(fleet)
    # All at once (a dropped connection costs the whole timeout; a rejected one returns at once).
    lines = [f"(r=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 3 {fleet['ips'][dst.name]} {port} "
             f"2>/dev/null); case \"$r\" in *reached*) echo '{dst.name} {port} 1';; *) echo '{dst.name} {port} 0';; "
             "esac) &" for dst, port in targets]
    ns, name = fleet["names"][src.name]
    out = sh(cluster, ns, name, "\n".join([*lines, "wait"]), timeout=60)
    got = {}
    for line in out.splitlines():
        dst, port, ok = line.split()
        got[(dst, int(port))] = ok == "1"
    assert len(got) == len(targets), out
    return got


def _matrix(cluster: Cluster, fleet: dict[str, Any]) -> dict[tuple[str, str, int], bool]:
    return {(src.name, dst, port): ok for src in fleet["inside"] + fleet["outside"]
            for (dst, port), ok in _reached(cluster, fleet, src).items()}


def test_without_policies_every_connection_gets_through(cluster: Cluster, fleet: dict[str, Any]) -> None:
    matrix = _matrix(cluster, fleet)
    blocked = sorted(k for k, ok in matrix.items() if not ok)
    assert not blocked, f"{len(blocked)}/{len(matrix)} connections failed with no policy: {blocked[:20]}"
    assert len(matrix) > 100


def test_enforced_connections_are_exactly_what_the_policies_allow(cluster: Cluster, fleet: dict[str, Any]) -> None:
    policies, base = fleet["policies"], fleet["base"]
    cluster.apply(policies)
    every = {p.name: p for p in fleet["inside"] + fleet["outside"] + fleet["listeners"]}
    sources = [p.name for p in fleet["inside"] + fleet["outside"]]
    want = {(s, d, port): allowed(policies, every[s], every[d], port, namespaces=fleet["namespaces"])
            for s in sources for (dst, port) in _targets(fleet) for d in [dst.name]}
    # kube-router applies a change within its sync: wait until a connection the policies refuse is refused.
    refused = next(k for k, ok in want.items() if not ok and k[0] == "elsewhere/any")
    deadline = time.monotonic() + 90
    while _reached(cluster, fleet, every[refused[0]])[(refused[1], refused[2])]:
        assert time.monotonic() < deadline, f"kube-router did not enforce the policies within 90 s: {refused}"
        time.sleep(2)
    got = _matrix(cluster, fleet)
    kinds = {p.name: kind_of(p, base) for p in fleet["inside"]}
    wrong = [f"{kinds.get(s, s)} -> {kinds.get(d, d)}:{port} reached={got[(s, d, port)]}, policies allow={w}"
             for (s, d, port), w in sorted(want.items()) if got[(s, d, port)] != w]
    assert not wrong, f"{len(wrong)}/{len(want)} connections differ from the policies:\n" + "\n".join(wrong[:40])
    # Not vacuous: both outcomes occur, on the data path that matters most.
    assert sum(want.values()) > 10 and sum(not w for w in want.values()) > 10
    prefill = next(p.name for p in fleet["inside"] if kinds[p.name] == "prefill")
    decode = next(p.name for p in fleet["inside"] if kinds[p.name] == "decode")
    nixl = every[prefill].ports["nixl"]
    assert got[(decode, prefill, nixl)] and not got[("neighbour/any", prefill, nixl)]
    # The gateway: its proxy and the load balancer's address reach decode's serving port and the EPP; the
    # other pod of the gateway's namespace reaches neither.
    epp = next(p.name for p in fleet["inside"] if kinds[p.name] == "epp")
    serving = every[decode].ports.get("http", every[decode].ports["vllm"])
    grpc = every[epp].ports["grpc"]
    for src in ("gateway/proxy", LB):
        assert got[(src, decode, serving)] and got[(src, epp, grpc)], src
    assert not got[("gateway/any", decode, serving)] and not got[("gateway/any", epp, grpc)]


def test_with_egress_restricted_serving_pods_reach_their_fleet_and_the_dns_and_nothing_else(
        cluster: Cluster, fleet: dict[str, Any]) -> None:
    """``networkPolicy.egress`` on: what got through is exactly what the policies allow at both ends (the
    source's egress and the destination's ingress); the serving pods reach their own fleet and the DNS
    stand-in on its DNS port only, not the hub mirror (this fleet's pods read the model from the shared
    cache), the EPP or the other fleet; the EPP's egress stays open."""

    policies, base = _rendered(fleet["ips"][LB], egress=True)[0], fleet["base"]
    egress = [p for p in policies if "Egress" in p["spec"]["policyTypes"]]
    assert {p["metadata"]["name"] for p in egress} >= {f"{base}-decode-egress", f"{base}-prefill-egress"}, egress
    cluster.apply(policies)
    every = {p.name: p for p in fleet["inside"] + fleet["outside"] + fleet["listeners"]}
    sources = [p.name for p in fleet["inside"] + fleet["outside"]]
    want = {(s, dst.name, port): connects(policies, every[s], dst, port, namespaces=fleet["namespaces"])
            for s in sources for (dst, port) in _targets(fleet)}
    kinds = {p.name: kind_of(p, base) for p in fleet["inside"]}
    decode = next(p.name for p in fleet["inside"] if kinds[p.name] == "decode")
    prefill = next(p.name for p in fleet["inside"] if kinds[p.name] == "prefill")
    epp = next(p.name for p in fleet["inside"] if kinds[p.name] == "epp")
    hub = ("hub/mirror", every["hub/mirror"].ports["http"])
    assert not want[(decode, *hub)] and want[(epp, *hub)], "the evaluator would not tell egress from none"
    deadline = time.monotonic() + 90
    while _reached(cluster, fleet, every[decode])[hub]:
        assert time.monotonic() < deadline, "kube-router did not enforce the egress policies within 90 s"
        time.sleep(2)
    got = _matrix(cluster, fleet)
    wrong = [f"{kinds.get(s, s)} -> {kinds.get(d, d)}:{port} reached={got[(s, d, port)]}, policies allow={w}"
             for (s, d, port), w in sorted(want.items()) if got[(s, d, port)] != w]
    assert not wrong, f"{len(wrong)}/{len(want)} connections differ from the policies:\n" + "\n".join(wrong[:40])
    dns = every["dns/coredns"].ports
    assert got[(decode, "dns/coredns", dns["dns"])] and not got[(decode, "dns/coredns", dns["other"])]
    assert got[(decode, prefill, every[prefill].ports["nixl"])] and got[(decode, prefill, UCX_DATA_PORT)]
    assert not got[(decode, *hub)] and got[(epp, *hub)] and not got[(decode, epp, every[epp].ports["grpc"])]


def test_removing_the_policies_opens_the_pods_again(cluster: Cluster, fleet: dict[str, Any]) -> None:
    cluster.kubectl("delete", "networkpolicy", "--all", "-n", NS)
    prefill = next(p for p in fleet["inside"] if kind_of(p, fleet["base"]) == "prefill")
    src = next(p for p in fleet["outside"] if p.name == "elsewhere/any")
    deadline = time.monotonic() + 90
    while not _reached(cluster, fleet, src)[(prefill.name, prefill.ports["nixl"])]:
        assert time.monotonic() < deadline, "the policies' rules outlived the policies by 90 s"
        time.sleep(2)


def test_kube_router_is_one_of_the_node_processes(node: RealNode) -> None:
    """So the node's stop ends it with the rest (the ``node`` fixture then checks nothing is left)."""
    assert node.status().get("kube-router") is True
    assert "kube-router" in {p.name for p in node.processes}
