"""The few Kubernetes types the API embeds, and resource quantities."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, WithJsonSchema

from hisparse_runtime.engine import kube
from hisparse_runtime.engine.kube import QUANTITY_PATTERN, LabelKey, LabelValue

from ._base import ApiModel

GPU_RESOURCE: Final = "nvidia.com/gpu"
"""The GPU resource NVIDIA's device plugin advertises; a role requests ``parallelism.gpusPerNode`` of it."""

def _valid_quantity(value: int | str) -> int | str:
    problem = kube.quantity_problem(value)
    if problem:
        raise ValueError(problem)
    return value


Quantity = Annotated[
    int | str,
    Field(union_mode="left_to_right"),
    AfterValidator(_valid_quantity),
    # The one anyOf a structural schema allows: bare integer | string branches, constraints beside them.
    WithJsonSchema({"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": QUANTITY_PATTERN}),
]
"""A Kubernetes resource quantity (``64``, ``1500Gi``, ``500m``)."""

Namespace = Annotated[str, Field(json_schema_extra={"maxLength": 63, "pattern": kube.DNS1123_LABEL}),
                      AfterValidator(lambda v: _raise(kube.dns1123_label_problem(v, "a namespace")) or v)]
"""A namespace name (a DNS-1123 label)."""

LabelMap = dict[LabelKey, LabelValue]
"""Labels (or a node selector): qualified-name keys, label values."""


def _cidr(value: str) -> str:
    import ipaddress

    try:
        net = ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"{value!r} is not a CIDR (an address and a prefix length, such as 10.0.0.0/24 or "
                         "fd00::/64)") from None
    if "/" not in value or str(net) != value:
        raise ValueError(f"{value!r} is not a CIDR in canonical form: write {str(net)!r} (no host bits set, a "
                         "prefix length, no leading zeros), as the apiserver expects for an ipBlock")
    return value


Cidr = Annotated[str, Field(max_length=43, json_schema_extra={"format": "cidr"}), AfterValidator(_cidr)]
"""An IPv4 or IPv6 network in canonical CIDR form (``10.0.0.0/24``, ``fd00::/64``)."""


def _raise(problem: str | None) -> None:
    if problem:
        raise ValueError(problem)


FreeForm = Annotated[dict[str, Any], WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})]
"""A Kubernetes object passed through as written (affinity, volumes, ...); the apiserver validates it
where it lands in the pod template."""

parse_quantity = kube.parse_quantity


def quantity_gib(value: int | str) -> float:
    """A quantity in GiB for display and engine settings; comparisons use :func:`parse_quantity` (exact)."""
    return float(parse_quantity(value) / kube.GIB)


class Resources(ApiModel):
    """CPU, memory and hugepages of a serving container (GPUs come from ``parallelism.gpusPerNode``)."""

    requests: dict[str, Quantity] = Field(default_factory=dict, max_length=16)
    """Requests, e.g. ``cpu: 96``, ``memory: 1500Gi``, ``hugepages-1Gi: 64Gi``. HiSparse decode must
    request enough memory for its pinned host pools plus headroom."""

    limits: dict[str, Quantity] = Field(default_factory=dict, max_length=16)
    """Limits. Memory limits below the request are refused by Kubernetes; hugepages need limit == request."""


class Toleration(ApiModel):
    """A pod toleration (core/v1 Toleration)."""

    key: LabelKey | None = Field(default=None, max_length=316)
    """Taint key to tolerate; empty with ``Exists`` tolerates every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """``Equal`` (default) matches ``value``; ``Exists`` matches any value."""
    value: LabelValue | None = None
    """Taint value for ``Equal``."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; empty tolerates all effects."""
    toleration_seconds: int | None = None
    """For ``NoExecute``: how long the pod stays after the taint appears."""


class GatewayRef(ApiModel):
    """The Gateway (Gateway API) whose HTTPRoute sends traffic to this deployment's InferencePool."""

    name: str = Field(min_length=1, max_length=253)
    """Gateway name."""
    namespace: Namespace | None = None
    """Defaults to the HiSparseDeployment's namespace."""
    section_name: str | None = Field(default=None, max_length=253)
    """A listener of the Gateway."""
