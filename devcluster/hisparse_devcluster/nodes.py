"""Fake GPU nodes for KWOK: pure manifest builders, no I/O.

The defaults describe an 8 x H200 server (2 sockets, 224 hardware threads,
2 TiB RAM), the shape our decode and prefill pods are sized for. KWOK manages
only nodes carrying :data:`KWOK_ANNOTATION`; its Stages make them Ready and
keep their leases fresh, and make pods bound to them Running.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "KWOK_ANNOTATION",
    "RACK_LABEL",
    "ZONE_LABEL",
    "GpuNodeSpec",
    "gpu_node_manifest",
    "placement",
]

KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
"""Annotation KWOK is started to select nodes by (``--manage-nodes-with-annotation-selector``)."""
GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource the NVIDIA device plugin advertises."""
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
"""Label set by NVIDIA GPU feature discovery, e.g. ``NVIDIA-H200``."""
ZONE_LABEL = "topology.kubernetes.io/zone"
"""Well-known zone label."""
RACK_LABEL = "topology.hisparse.dev/rack"
"""Rack (top-of-rack switch) label; Kubernetes has no well-known key for it."""


@dataclass(frozen=True)
class GpuNodeSpec:
    """Capacity and identity of one fake GPU node. Quantities use Kubernetes syntax."""

    gpus: int = 8
    """``nvidia.com/gpu`` capacity."""
    gpu_product: str = "NVIDIA-H200"
    """Value of ``nvidia.com/gpu.product``."""
    gpu_memory_mib: int = 143771
    """Per-GPU memory as GPU feature discovery reports it (``nvidia.com/gpu.memory``, MiB)."""
    cpu: str = "224"
    """Logical CPUs."""
    memory: str = "2Ti"
    """Physical memory; allocatable is ``memory`` minus ``reserved_memory`` minus hugepages."""
    reserved_memory: str = "16Gi"
    """kube-reserved + system-reserved memory, not allocatable to pods."""
    reserved_cpu_millis: int = 2000
    """CPU held back for the kubelet and system daemons, in millicores."""
    hugepages_1gi: str = "0"
    """Pre-allocated 1 GiB hugepages (a quantity such as ``64Gi``)."""
    hugepages_2mi: str = "0"
    """Pre-allocated 2 MiB hugepages."""
    ephemeral_storage: str = "28Ti"
    """Local NVMe."""
    pods: int = 110
    """Pod slots (kubelet ``--max-pods``)."""
    instance_type: str = "h200-8gpu"
    """``node.kubernetes.io/instance-type``."""
    region: str = "dev-region"
    """``topology.kubernetes.io/region``."""
    rack_labels: tuple[str, ...] = (RACK_LABEL,)
    """Label keys the node's rack is written under (a manifest may name its own key, e.g. in
    ``placementTopologyKey``)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Extra labels, applied last."""
    taints: tuple[dict[str, str], ...] = ()
    """Taints as Kubernetes dicts, e.g. ``{"key": "nvidia.com/gpu", "effect": "NoSchedule"}``."""


def placement(index: int, zones: tuple[str, ...], nodes_per_rack: int) -> tuple[str, str]:
    """(zone, rack) of the ``index``-th node: racks fill in order, racks alternate zones."""
    if not zones or nodes_per_rack < 1:
        raise ValueError("need at least one zone and nodes_per_rack >= 1")
    rack = index // nodes_per_rack
    return zones[rack % len(zones)], f"rack-{rack:02d}"


_BINARY = {"Ki": 1, "Mi": 1 << 10, "Gi": 1 << 20, "Ti": 1 << 30, "Pi": 1 << 40, "Ei": 1 << 50}


def _minus(total: str, *parts: str) -> str:
    """``total - sum(parts)`` for binary-suffixed quantities, in the largest exact unit."""
    kib = _kib(total) - sum(_kib(p) for p in parts)
    if kib <= 0:
        raise ValueError(f"{total} minus {', '.join(parts)} leaves no allocatable memory")
    unit = max((u for u, m in _BINARY.items() if kib % m == 0), key=_BINARY.__getitem__)
    return f"{kib // _BINARY[unit]}{unit}"


def _kib(q: str) -> int:
    if q == "0":
        return 0
    for suffix, mult in _BINARY.items():
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * mult
    raise ValueError(f"quantity {q!r}: use a binary suffix (Ki, Mi, Gi, Ti) or 0")


def gpu_node_manifest(name: str, spec: GpuNodeSpec, *, zone: str, rack: str) -> dict[str, Any]:
    """A Node object with ``status.capacity``/``allocatable`` set, ready for ``kubectl create``.

    Status is kept on create (as when a kubelet registers), and KWOK fills in
    conditions, addresses and node info without touching capacity.
    """
    capacity = {
        "cpu": spec.cpu,
        "memory": spec.memory,
        "ephemeral-storage": spec.ephemeral_storage,
        "hugepages-1Gi": spec.hugepages_1gi,
        "hugepages-2Mi": spec.hugepages_2mi,
        "pods": str(spec.pods),
        GPU_RESOURCE: str(spec.gpus),
    }
    allocatable = {
        **capacity,
        "cpu": f"{int(spec.cpu) * 1000 - spec.reserved_cpu_millis}m",
        "memory": _minus(spec.memory, spec.reserved_memory, spec.hugepages_1gi, spec.hugepages_2mi),
    }
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": spec.instance_type,
        "topology.kubernetes.io/region": spec.region,
        ZONE_LABEL: zone,
        **dict.fromkeys(spec.rack_labels, rack),
        GPU_PRODUCT_LABEL: spec.gpu_product,
        "nvidia.com/gpu.count": str(spec.gpus),
        "nvidia.com/gpu.memory": str(spec.gpu_memory_mib),
        "nvidia.com/gpu.present": "true",
        "type": "kwok",
        **spec.labels,
    }
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1],
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": allocatable},
    }
    if spec.taints:
        node["spec"]["taints"] = [dict(t) for t in spec.taints]
    return node
