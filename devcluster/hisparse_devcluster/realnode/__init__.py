"""A real node in the dev cluster: containerd, runc, a kubelet, kube-proxy and CoreDNS in a network
namespace of their own, beside the KWOK nodes. See :mod:`.node` and :mod:`.plan`."""

from .archive import write_image_archive
from .node import COREDNS_IMAGE, HostProblem, NodeTimeouts, RealNode, RealNodeError, check_host, host_problems
from .plan import NODE_IP, NODE_LABEL, NODE_NAME, NODE_TAINT, POD_SUBNET, cluster_dns_ip, real_node_placement

__all__ = [
    "COREDNS_IMAGE",
    "NODE_IP",
    "NODE_LABEL",
    "NODE_NAME",
    "NODE_TAINT",
    "HostProblem",
    "POD_SUBNET",
    "NodeTimeouts",
    "RealNode",
    "RealNodeError",
    "check_host",
    "cluster_dns_ip",
    "host_problems",
    "real_node_placement",
    "write_image_archive",
]
