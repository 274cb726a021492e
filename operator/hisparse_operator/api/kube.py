"""The few Kubernetes types the API embeds, and resource quantities."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, WithJsonSchema

from ._base import ApiModel

QUANTITY_PATTERN: Final = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"

def _valid_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not re.match(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (for example 1500Gi, 64, 500m)")
    return value


Quantity = Annotated[
    int | str,
    Field(union_mode="left_to_right"),
    AfterValidator(_valid_quantity),
    # The one anyOf a structural schema allows: bare integer | string branches, constraints beside them.
    WithJsonSchema({"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": QUANTITY_PATTERN}),
]
"""A Kubernetes resource quantity (``64``, ``1500Gi``, ``500m``)."""

FreeForm = Annotated[dict[str, Any], WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})]
"""A Kubernetes object passed through as written (affinity, volumes, ...); the apiserver validates it
where it lands in the pod template."""

_SUFFIX: Final[dict[str, Decimal]] = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}


def parse_quantity(value: int | str) -> Decimal:
    """A quantity as a number of base units (bytes for memory, cores for CPU)."""
    if isinstance(value, int):
        return Decimal(value)
    if not re.match(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (for example 1500Gi, 64, 500m)")
    m = re.match(r"^([+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)([a-zA-Z]*)$", value)
    assert m is not None
    number, suffix = m.groups()
    if suffix and suffix[0] in "eE" and suffix not in _SUFFIX:
        return Decimal(value)
    return Decimal(number) * _SUFFIX[suffix]


def quantity_gib(value: int | str) -> float:
    return float(parse_quantity(value) / _SUFFIX["Gi"])


class Resources(ApiModel):
    """CPU, memory and hugepages of a serving container (GPUs come from ``parallelism.gpusPerNode``)."""

    requests: dict[str, Quantity] = Field(default_factory=dict, max_length=16)
    """Requests, e.g. ``cpu: 96``, ``memory: 1500Gi``, ``hugepages-1Gi: 64Gi``. HiSparse decode must
    request enough memory for its pinned host pools plus headroom."""

    limits: dict[str, Quantity] = Field(default_factory=dict, max_length=16)
    """Limits. Memory limits below the request are refused by Kubernetes; hugepages need limit == request."""


class Toleration(ApiModel):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = Field(default=None, max_length=316)
    """Taint key to tolerate; empty with ``Exists`` tolerates every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """``Equal`` (default) matches ``value``; ``Exists`` matches any value."""
    value: str | None = Field(default=None, max_length=63)
    """Taint value for ``Equal``."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; empty tolerates all effects."""
    toleration_seconds: int | None = None
    """For ``NoExecute``: how long the pod stays after the taint appears."""


class GatewayRef(ApiModel):
    """The Gateway (Gateway API) whose HTTPRoute sends traffic to this deployment's InferencePool."""

    name: str = Field(min_length=1, max_length=253)
    """Gateway name."""
    namespace: str | None = Field(default=None, max_length=63)
    """Defaults to the HiSparseDeployment's namespace."""
    section_name: str | None = Field(default=None, max_length=253)
    """A listener of the Gateway."""
