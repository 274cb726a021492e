"""GPU architectures: from the node labels GPU feature discovery publishes, and from a live device.

The operator reads a role's architecture from the nodes it can land on (``nvidia.com/gpu.product``,
or the compute-capability labels when present); the pod's preflight reads the live GPU's compute
capability and checks that the render assumed the same family. vLLM gates kernels by capability
*family* (``current_platform.is_device_capability_family(100)``), so the families here are vLLM's.
"""

from __future__ import annotations

import re
from typing import Final, Literal

GpuArchitecture = Literal["ampere", "ada", "hopper", "blackwell", "blackwell-sm120"]
"""GPU families vLLM tells apart: sm80/86 (``ampere``), sm89 (``ada``), sm90 (``hopper``), the datacenter
Blackwell family sm100/103 (``blackwell``: B200, GB200, B300, GB300) and sm120/121 (``blackwell-sm120``:
RTX PRO 6000 Blackwell, DGX Spark)."""

BLACKWELL_FAMILIES: Final[frozenset[str]] = frozenset({"blackwell", "blackwell-sm120"})

GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
"""GPU feature discovery's product label, e.g. ``NVIDIA-H200`` or ``NVIDIA-B200``."""
GPU_COMPUTE_MAJOR_LABEL: Final = "nvidia.com/gpu.compute.major"
GPU_COMPUTE_MINOR_LABEL: Final = "nvidia.com/gpu.compute.minor"

# Product names as GFD writes them (spaces become dashes; "-SHARED" and MIG suffixes may follow).
_PRODUCTS: Final[tuple[tuple[re.Pattern[str], GpuArchitecture], ...]] = (
    (re.compile(r"^NVIDIA-G?B[0-9]{3}(\b|-)"), "blackwell"),  # B100, B200, GB200, B300, GB300
    (re.compile(r"Blackwell|^NVIDIA-GB10(\b|-)|^NVIDIA-GeForce-RTX-50[0-9]{2}"), "blackwell-sm120"),
    (re.compile(r"^NVIDIA-G?H[0-9]{2,3}(\b|-)"), "hopper"),  # H100, H200, H800, H20, GH200
    (re.compile(r"^NVIDIA-(L4|L40S?|RTX-[0-9]+-Ada|GeForce-RTX-40[0-9]{2})(\b|-)"), "ada"),
    (re.compile(r"^NVIDIA-A[0-9]{1,3}(\b|-)"), "ampere"),  # A100, A800, A30, A40, A10
)


def architecture_of_capability(major: int, minor: int) -> GpuArchitecture | None:
    """The family of a CUDA compute capability, ``None`` for one vLLM's CUDA build does not target."""
    if major == 8:
        return "ada" if minor == 9 else "ampere"
    if major == 9:
        return "hopper"
    if major in (10, 11):
        return "blackwell"
    if major == 12:
        return "blackwell-sm120"
    return None


def architecture_of_product(product: str) -> GpuArchitecture | None:
    """The family of a ``nvidia.com/gpu.product`` value, ``None`` when the name is not one we know."""
    return next((arch for pattern, arch in _PRODUCTS if pattern.search(product)), None)


def architecture_of_labels(labels: dict[str, str]) -> GpuArchitecture | None:
    """A node's GPU family from its GFD labels: the compute capability when published, else the product."""
    major, minor = labels.get(GPU_COMPUTE_MAJOR_LABEL), labels.get(GPU_COMPUTE_MINOR_LABEL)
    if major is not None and major.isdigit():
        return architecture_of_capability(int(major), int(minor) if minor and minor.isdigit() else 0)
    product = labels.get(GPU_PRODUCT_LABEL)
    return architecture_of_product(product) if product else None
