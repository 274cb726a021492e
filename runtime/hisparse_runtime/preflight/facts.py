"""Reading facts about the node the pod landed on. Every reader takes its source path, so tests
can point it at files in the same formats (``/proc/meminfo``, cgroup v2 ``memory.max``)."""

from __future__ import annotations

import ipaddress
import os
import resource
import socket
from typing import Final
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "GpuFact",
    "cgroup_memory_limit_bytes",
    "detect_gpus",
    "is_local_address",
    "mem_available_bytes",
    "memlock_limit_bytes",
    "rdma_verbs_devices",
    "shm_size_bytes",
]

UNLIMITED = -1


@dataclass(frozen=True)
class GpuFact:
    index: int
    name: str
    capability: tuple[int, int]


def mem_available_bytes(meminfo: Path) -> int:
    """``MemAvailable`` from a meminfo-format file (values in kB)."""
    for line in meminfo.read_text(encoding="ascii").splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "MemAvailable":
            value, *unit = rest.split()
            return int(value) * (1024 if unit and unit[0].lower() == "kb" else 1)
    raise ValueError(f"{meminfo} has no MemAvailable line")


def cgroup_memory_limit_bytes(memory_max: Path) -> int | None:
    """The container's cgroup v2 memory limit, or None when unlimited or not readable."""
    try:
        text = memory_max.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def memlock_limit_bytes() -> int:
    """Soft RLIMIT_MEMLOCK of this process (``UNLIMITED`` for infinity): what pinning may lock."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return UNLIMITED if soft == resource.RLIM_INFINITY else int(soft)


CAP_IPC_LOCK: Final = 14
"""capabilities(7): with it, mlock and RDMA/CUDA host registration are not bounded by RLIMIT_MEMLOCK."""


def holds_capability(cap: int, status: Path = Path("/proc/self/status")) -> bool:
    """Whether ``cap`` is in this process's effective set (``CapEff`` of /proc/self/status)."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> cap & 1)
    return False


def shm_size_bytes(shm: Path) -> int:
    stat = os.statvfs(shm)
    return stat.f_blocks * stat.f_frsize


def is_local_address(host: str) -> bool:
    """Whether ``host`` is an address of this machine (we can bind a socket to it)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return False
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


def rdma_verbs_devices(dev: Path = Path("/dev/infiniband"), sysfs: Path = Path("/sys")) -> dict[str, str | None]:
    """The RDMA verbs devices this container can open: ``uverbsN`` character devices in ``dev`` (what an RDMA
    device plugin mounts into the pod), each with the RDMA device it belongs to (``mlx5_0``) read from
    ``<sysfs>/class/infiniband_verbs/uverbsN/ibdev`` (None where that is not readable)."""
    try:
        entries = sorted(p.name for p in dev.iterdir() if p.name.startswith("uverbs") and p.name[6:].isdigit())
    except OSError:
        return {}
    out: dict[str, str | None] = {}
    for name in entries:
        try:
            out[name] = (sysfs / "class" / "infiniband_verbs" / name / "ibdev").read_text(encoding="ascii").strip() or None
        except OSError:
            out[name] = None
    return out


def detect_gpus() -> list[GpuFact]:
    """GPUs visible to this process, through torch (present in the serving image)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        GpuFact(i, torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i)))  # type: ignore[arg-type]
        for i in range(torch.cuda.device_count())
    ]
