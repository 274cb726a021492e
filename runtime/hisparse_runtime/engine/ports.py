"""The ports a role's pods bind, with the offsets vLLM 0.33 adds to the configured bases.

vLLM binds each engine's NIXL side channel at ``VLLM_NIXL_SIDE_CHANNEL_PORT + data_parallel_index``
(``nixl/base_scheduler.py``; the index is the global DP rank), so a replica of ``dataParallelSize``
ranks uses ``[base, base + dataParallelSize)``; the pod at LeaderWorkerSet index ``w`` uses its own
``dataParallelSizeLocal`` of them. The DP coordinator listens on ``--data-parallel-rpc-port`` on the
leader, a single port. vLLM's other DP ports (``data_parallel_master_port``) are drawn from free
ephemeral ports at startup, so they can collide with nothing configured here.
"""

from __future__ import annotations

from typing import Final

from .role import PROBE_PORT, SERVICE_PORT, RoleSettings

MAX_PORT: Final = 65535


def side_channel_ports(s: RoleSettings) -> range:
    """Every NIXL side-channel port of one replica: base + global DP rank."""
    base = s.kv_transfer.nixl.side_channel_port
    return range(base, base + s.parallelism.data_parallel_size)


def pod_side_channel_ports(s: RoleSettings, worker_index: int) -> range:
    """The side-channel ports of the pod at LeaderWorkerSet index ``worker_index``."""
    first = s.kv_transfer.nixl.side_channel_port + s.parallelism.start_rank(worker_index)
    return range(first, first + s.parallelism.data_parallel_size_local)


def fixed_ports(s: RoleSettings) -> dict[str, int]:
    """The single ports a pod of this role binds or is reached on, by the name messages use."""
    p = s.parallelism
    out = {"the vLLM serving port": s.vllm_port}
    if s.vllm_port != SERVICE_PORT:  # decode: the llm-d routing sidecar owns the service port
        out["the routing sidecar's service port"] = SERVICE_PORT
    out["kvTransfer.nixl.linkCheckPort"] = s.kv_transfer.nixl.link_check_port
    out["the entrypoint's probe port"] = PROBE_PORT
    if p.nodes > 1 or p.data_parallel_size > 1:
        out["parallelism.dataParallelRpcPort"] = p.data_parallel_rpc_port
    return out
