"""Parallel layout of one engine replica (one or more nodes)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Settings

All2AllBackend = Literal[
    "allgather_reducescatter",
    "deepep_high_throughput",
    "deepep_low_latency",
    "flashinfer_nvlink_one_sided",
    "naive",
    "pplx",
]


class ParallelSettings(Settings):
    """Tensor/data/expert parallel sizes of one replica. A replica spans ``nodes`` pods; each pod runs
    ``dataParallelSizeLocal`` DP ranks of ``tensorParallelSize`` GPUs. The arithmetic between the sizes
    is checked by the engine constraints (``parallel-layout``), which name the field to change."""

    nodes: int = Field(default=1, ge=1, le=64)
    """Pods (nodes) per replica. More than one renders a LeaderWorkerSet of that size."""

    gpus_per_node: int = Field(default=8, ge=1, le=16)
    """GPUs each pod requests (``nvidia.com/gpu``)."""

    tensor_parallel_size: int = Field(default=1, ge=1, le=16)
    """GPUs per DP rank (``--tensor-parallel-size``)."""

    data_parallel_size: int = Field(default=1, ge=1, le=1024)
    """DP ranks across the whole replica (``--data-parallel-size``): nodes x dataParallelSizeLocal."""

    data_parallel_size_local: int = Field(default=1, ge=1, le=16)
    """DP ranks per pod (``--data-parallel-size-local``)."""

    enable_expert_parallel: bool = False
    """Shard MoE experts across all DP x TP ranks (``--enable-expert-parallel``, wide-EP)."""

    all2all_backend: All2AllBackend | None = None
    """Expert-parallel all-to-all implementation (``--all2all-backend``); unset keeps vLLM's default."""

    data_parallel_rpc_port: int = Field(default=5555, ge=1024, le=65535)
    """DP coordinator port on the replica's leader pod (``--data-parallel-rpc-port``)."""

    def start_rank(self, worker_index: int) -> int:
        """First DP rank served by the pod at LeaderWorkerSet index ``worker_index``."""
        if not 0 <= worker_index < self.nodes:
            raise ValueError(f"worker index {worker_index} is outside [0, {self.nodes})")
        return worker_index * self.data_parallel_size_local
