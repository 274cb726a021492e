"""Kubernetes NetworkPolicy semantics, as the API reference defines them, for evaluating rendered policies
in tests (who may reach which pod on which port): ingress at the destination (``allowed``), egress at the
source (``egress_allowed``); a connection opens when both allow it (``connects``).

- A pod always reaches itself ("a pod cannot block access to itself", the API reference says; the real
  node's enforcer, kube-router, shows it too: a pod's packets to its own IP never leave it).
- A pod selected by no policy of type Ingress accepts everything.
- A pod selected by no policy of type Egress may connect anywhere; a selected one only where an egress
  rule's ``to`` matches the destination (absent or empty: every destination) and its ``ports`` the port.
- A selected pod accepts a connection when at least one selecting policy has an ingress rule whose
  ``from`` matches the source (absent or empty: every source) and whose ``ports`` match the destination
  port (absent or empty: every port). Rules and policies are additive.
- A peer with only ``podSelector`` selects pods in the policy's namespace; only ``namespaceSelector``, every
  pod of the selected namespaces; both, the pods matching the first in the namespaces matching the second.
- An ``ipBlock`` peer matches a source whose address is in ``cidr`` and in none of ``except`` (a source
  without an address cannot be judged against one: that raises).
- A port matches by number (with ``endPort``, a range) or by name against the destination's containerPorts;
  protocol defaults to TCP.
Only ``matchLabels`` selectors are evaluated (the render uses nothing else); anything else raises, so a
rendered expression this evaluator does not understand fails the test instead of passing it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)
    """containerPort by name (for named ports)."""
    ip: str = ""
    """The pod's address, where a policy has ``ipBlock`` peers."""


def _match(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    selector = selector or {}
    unknown = set(selector) - {"matchLabels"}
    if unknown:
        raise ValueError(f"selector fields this evaluator does not handle: {unknown}")
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer(peer: dict[str, Any], policy_ns: str, src: Pod, namespaces: dict[str, dict[str, str]]) -> bool:
    """Whether ``src`` (the peer pod: the source of an ingress rule, the destination of an egress rule)
    matches ``peer`` of a policy in ``policy_ns``."""
    if "ipBlock" in peer:
        if not src.ip:
            raise ValueError(f"an ipBlock peer cannot be judged for {src.name}, which has no address")
        block, addr = peer["ipBlock"], ipaddress.ip_address(src.ip)
        return addr in ipaddress.ip_network(block["cidr"]) and not any(
            addr in ipaddress.ip_network(e) for e in block.get("except") or [])
    pod_sel, ns_sel = peer.get("podSelector"), peer.get("namespaceSelector")
    if ns_sel is None:
        return src.namespace == policy_ns and _match(pod_sel, src.labels)
    return _match(ns_sel, namespaces.get(src.namespace, {})) and (pod_sel is None or _match(pod_sel, src.labels))


def _port(rule_ports: list[dict[str, Any]] | None, dst: Pod, port: int, protocol: str) -> bool:
    if not rule_ports:
        return True
    for p in rule_ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        want = p.get("port")
        if want is None:
            return True
        if isinstance(want, str):
            if dst.ports.get(want) == port:
                return True
            continue
        if want <= port <= p.get("endPort", want):
            return True
    return False


_DIRECTIONS = {"Ingress": ("ingress", "from"), "Egress": ("egress", "to")}


def _allows(direction: str, policies: list[dict[str, Any]], selected: Pod, peer: Pod, dst: Pod, port: int,
            namespaces: dict[str, dict[str, str]], protocol: str) -> bool:
    """Whether the ``direction`` policies that select ``selected`` (the destination for Ingress, the source
    for Egress) let the connection to ``dst:port`` through, ``peer`` being the other end."""
    rules_key, peers_key = _DIRECTIONS[direction]
    # policyTypes unset: Ingress, and Egress too when the policy has egress rules (as the API defaults it).
    selecting = [p for p in policies if p["metadata"].get("namespace") == selected.namespace
                 and direction in (p["spec"].get("policyTypes") or ["Ingress", *(["Egress"] if "egress" in p["spec"] else [])])
                 and _match(p["spec"].get("podSelector"), selected.labels)]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get(rules_key) or []:
            peers = rule.get(peers_key)
            if peers and not any(_peer(x, selected.namespace, peer, namespaces) for x in peers):
                continue
            if _port(rule.get("ports"), dst, port, protocol):
                return True
    return False


def allowed(policies: list[dict[str, Any]], src: Pod, dst: Pod, port: int, *,
            namespaces: dict[str, dict[str, str]], protocol: str = "TCP") -> bool:
    """Whether ``src`` may open a connection to ``dst:port`` under ``policies`` (ingress only)."""
    return src == dst or _allows("Ingress", policies, dst, src, dst, port, namespaces, protocol)


def egress_allowed(policies: list[dict[str, Any]], src: Pod, dst: Pod, port: int, *,
                   namespaces: dict[str, dict[str, str]], protocol: str = "TCP") -> bool:
    """Whether the policies of ``src``'s namespace let ``src`` open a connection to ``dst:port`` (egress only)."""
    return src == dst or _allows("Egress", policies, src, dst, dst, port, namespaces, protocol)


def connects(policies: list[dict[str, Any]], src: Pod, dst: Pod, port: int, *,
             namespaces: dict[str, dict[str, str]], protocol: str = "TCP") -> bool:
    """Whether a connection opens: ``src``'s egress and ``dst``'s ingress both allow it."""
    return (egress_allowed(policies, src, dst, port, namespaces=namespaces, protocol=protocol)
            and allowed(policies, src, dst, port, namespaces=namespaces, protocol=protocol))


def _templates(o: dict[str, Any]) -> list[dict[str, Any]]:
    spec = o.get("spec") or {}
    if o["kind"] in ("Deployment", "Job"):
        return [spec["template"]]
    if o["kind"] == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        return [t for t in (lwt.get("leaderTemplate"), lwt["workerTemplate"]) if t]
    return []


def pods_of(objs: list[dict[str, Any]]) -> list[Pod]:
    """One pod per pod template of the rendered objects (named ``<object>/<index>``), with its labels and
    named container ports."""
    out = []
    for o in objs:
        for i, t in enumerate(_templates(o)):
            ports = {p["name"]: p["containerPort"] for c in t["spec"]["containers"] + t["spec"].get("initContainers", [])
                     for p in c.get("ports", []) if "name" in p}
            out.append(Pod(f"{o['metadata']['name']}/{i}", o["metadata"]["namespace"], t["metadata"]["labels"], ports))
    return out
