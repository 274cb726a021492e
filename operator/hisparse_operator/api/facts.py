"""Cluster facts render and validation may use: the nodes a role could be scheduled on.

Built by the operator from Node objects; ``hisparse validate --nodes nodes.yaml`` reads the same from a
``kubectl get nodes -o yaml`` dump. Pure data: nothing here talks to a cluster.
"""

from __future__ import annotations

from typing import Any

from hisparse_runtime.engine import GPU_PRODUCT_LABEL, GpuArchitecture, architecture_of_labels
from hisparse_runtime.engine.gpu import architecture_of_product
from hisparse_runtime.engine.kube import extended_resource_name_problem
from pydantic import BaseModel, ConfigDict, Field

from .kube import GPU_RESOURCE, parse_quantity, quantity_gib
from .spec import RoleSpec

CONDITION_TAINTS = frozenset({
    "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure", "node.kubernetes.io/pid-pressure", "node.kubernetes.io/network-unavailable",
})
"""Taints the node lifecycle controller puts on while a node condition lasts (a kubelet starting or
restarting, a pressure): they say what the node is now, not what it is for. The fit checks look past them,
so a deployment is not refused because the one node that fits was NotReady for a moment (its pods wait
for it as the scheduler makes them). A cordon (``spec.unschedulable``) and every other taint still count."""


class NodeFacts(BaseModel):
    """What scheduling and host-pool checks need to know about one Node."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    name: str
    """Node name."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Node labels (nodeSelector and required node affinity match against them)."""
    taints: list[dict[str, Any]] = Field(default_factory=list)
    """core/v1 Taints; NoSchedule and NoExecute ones must be tolerated."""
    allocatable_memory_gib: float = 0.0
    """``status.allocatable.memory`` in GiB."""
    allocatable_gpus: int = 0
    """``status.allocatable["nvidia.com/gpu"]``."""
    unschedulable: bool = False
    """``spec.unschedulable`` (cordoned)."""
    device_resources: dict[str, int] = Field(default_factory=dict)
    """``status.allocatable`` of the device plugins' (extended) resources other than GPUs, e.g.
    ``rdma/hca_shared_devices_a: 1000``: whether a role's ``rdma.resourceName`` is offered anywhere."""

    @classmethod
    def from_node(cls, node: dict[str, Any]) -> NodeFacts:
        alloc = (node.get("status") or {}).get("allocatable") or {}
        spec = node.get("spec") or {}
        return cls(
            name=node["metadata"]["name"],
            labels=node["metadata"].get("labels") or {},
            taints=spec.get("taints") or [],
            allocatable_memory_gib=quantity_gib(alloc.get("memory", 0)),
            allocatable_gpus=int(parse_quantity(alloc.get(GPU_RESOURCE, 0))),
            unschedulable=bool(spec.get("unschedulable")),
            device_resources={k: int(parse_quantity(v)) for k, v in alloc.items()
                              if k != GPU_RESOURCE and extended_resource_name_problem(k) is None},
        )


class ClusterFacts(BaseModel):
    """Facts about the cluster a deployment lands in."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    nodes: list[NodeFacts] = Field(default_factory=list)
    """Every Node the operator can see."""

    @classmethod
    def from_nodes(cls, nodes: list[dict[str, Any]]) -> ClusterFacts:
        return cls(nodes=[NodeFacts.from_node(n) for n in nodes])

    def allocatable_gib_for(self, role: RoleSpec, gpus: int) -> dict[str, float] | None:
        """``node -> allocatable GiB`` for the nodes ``role`` can land on, or ``None`` when no node of
        the cluster has GPUs at all (the fleet is not known yet, e.g. it scales from zero)."""
        if not any(n.allocatable_gpus for n in self.nodes):
            return None
        tolerations = [t.model_dump() for t in role.tolerations]
        return {n.name: n.allocatable_memory_gib for n in self.nodes if _schedulable(n, role, gpus, tolerations)}


    def nodes_offering(self, role: RoleSpec, gpus: int, resource: str, count: int) -> list[str] | None:
        """Names of the nodes ``role`` can land on that offer at least ``count`` of ``resource``, or ``None``
        when no node of the cluster has GPUs at all (the fleet is not known yet)."""
        if not any(n.allocatable_gpus for n in self.nodes):
            return None
        tolerations = [t.model_dump() for t in role.tolerations]
        return [n.name for n in self.nodes
                if n.device_resources.get(resource, 0) >= count and _schedulable(n, role, gpus, tolerations)]

    def gpu_architectures_for(self, role: RoleSpec, gpus: int) -> dict[GpuArchitecture, list[str]]:
        """GPU family -> names of the nodes ``role`` can land on that have it (from their GFD labels;
        nodes without them are left out)."""
        tolerations = [t.model_dump() for t in role.tolerations]
        out: dict[GpuArchitecture, list[str]] = {}
        for n in self.nodes:
            arch = architecture_of_labels(n.labels)
            if arch is not None and _schedulable(n, role, gpus, tolerations):
                out.setdefault(arch, []).append(n.name)
        return out


def pinned_architecture(role: RoleSpec) -> GpuArchitecture | None:
    """The GPU family the role's own placement pins it to: a ``nodeSelector`` on GPU feature
    discovery's labels (``nvidia.com/gpu.product``, or the compute-capability labels), or a required
    node affinity whose every term selects ``nvidia.com/gpu.product`` values of one family. The
    render depends on this alone, so ``hisparse render`` and the operator agree without node facts."""
    arch = architecture_of_labels(role.node_selector)
    if arch is not None:
        return arch
    required = (((role.affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    families: set[GpuArchitecture | None] = set()
    for term in required.get("nodeSelectorTerms") or []:
        values = [v for e in term.get("matchExpressions") or []
                  if e.get("key") == GPU_PRODUCT_LABEL and e.get("operator") == "In" for v in e.get("values") or []]
        if not values:
            return None  # a term that does not pin the product lets the pod land anywhere
        families |= {architecture_of_product(v) for v in values}
    return families.pop() if len(families) == 1 else None


def _schedulable(node: NodeFacts, role: RoleSpec, gpus: int, tolerations: list[dict[str, Any]]) -> bool:
    if node.unschedulable or node.allocatable_gpus < gpus:
        return False
    if any(node.labels.get(k) != v for k, v in role.node_selector.items()):
        return False
    if not _tolerated(node.taints, tolerations):
        return False
    return _required_affinity(node.labels, role.affinity or {})


def _tolerated(taints: list[dict[str, Any]], tolerations: list[dict[str, Any]]) -> bool:
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute") or taint.get("key") in CONDITION_TAINTS:
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _tolerates(t: dict[str, Any], taint: dict[str, Any]) -> bool:
    if t.get("effect") and t["effect"] != taint.get("effect"):
        return False
    if t.get("operator") == "Exists":
        return not t.get("key") or t["key"] == taint.get("key")
    return t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or "")


def _required_affinity(labels: dict[str, str], affinity: dict[str, Any]) -> bool:
    required = ((affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(all(_match(labels, e) for e in term.get("matchExpressions") or []) for term in terms)


def _match(labels: dict[str, str], expr: dict[str, Any]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return True  # Gt/Lt: not used for GPU placement; do not reject on what we do not evaluate
