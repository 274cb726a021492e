"""A real Kubernetes control plane on loopback for tests and ``hisparse dev``.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK run as
local processes built from Go modules by ``e2e/tools/build.sh``; KWOK fakes
GPU nodes and running pods. See ``e2e/README.md``.

    with Cluster.start(tmpdir) as cluster:
        cluster.add_gpu_nodes(2)
        cluster.kubectl("get", "nodes")
"""

from . import faults, nodes, pools, storage, versions
from ._components import POD_CIDR, SERVICE_CIDR
from ._gomod import GoModuleError
from ._state import default_workdir
from ._tools import Tools, ToolsNotBuiltError, locate_binary
from .cluster import (
    FIELD_MANAGER,
    Cluster,
    ClusterError,
    KubectlError,
    Timeouts,
)
from .nodes import GpuNodeSpec

__all__ = [
    "FIELD_MANAGER",
    "POD_CIDR",
    "SERVICE_CIDR",
    "Cluster",
    "ClusterError",
    "GoModuleError",
    "GpuNodeSpec",
    "KubectlError",
    "Timeouts",
    "Tools",
    "ToolsNotBuiltError",
    "default_workdir",
    "locate_binary",
    "faults",
    "nodes",
    "pools",
    "storage",
    "versions",
]
