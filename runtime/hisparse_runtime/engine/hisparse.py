"""HiSparse decode: the pinned host pool and the per-request GPU hot buffer."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from ._base import Settings

HOT_BUFFER_MAX_ROWS: Final = 32767
"""Hot-buffer slot ids are int16 on the GPU: the buffer must stay strictly below this many rows."""

HOST_POOL_HEADROOM_GIB: Final = 64.0
"""Memory a decode pod needs beyond its pinned host pools: the vLLM processes, CUDA context, NIXL and
UCX buffers, tokenizer workers. Pinned pages cannot be swapped or reclaimed, so this must be real slack."""


DRAIN_SECONDS: Final = 120
"""Time a serving pod gets to finish in-flight requests after SIGTERM, before memory is released."""

UNPIN_SECONDS_PER_GIB: Final = 0.25
"""Budget for unregistering and freeing pinned host memory (4 GiB/s, a conservative rate for
cudaHostUnregister + munmap of huge regions). A SIGKILL mid-unpin can wedge the node's driver."""


DecodeKernels = Literal["vllm", "hisparse"]
"""Which kernels serve decode's HiSparse ops: vLLM's compiled ``_C_cache_ops.hisparse_*``, or the
project's (``hisparse_kernels``), registered under vLLM's op names."""


class HiSparseSettings(Settings):
    """Host-resident MLA KV for the decode role (vLLM's ``HiSparseConnector`` + ``hisparse_config``)."""

    host_pool_gib: float = Field(gt=0, le=4096)
    """Pinned host memory per data-parallel rank, in GiB (``host_pool_gib``). All DP ranks of a pod
    together, plus headroom, must fit the pod's memory request and the node's allocatable memory."""

    device_buffer_size: int | None = Field(default=None, gt=0, lt=HOT_BUFFER_MAX_ROWS)
    """Hot-buffer rows per request, the newest-token slot included (``device_buffer_size``). Must be at
    least the model's ``index_topk``; unset lets vLLM choose one top-k per query plus one of LRU slack."""

    eager_host_mirror: bool = True
    """Mirror decode-written KV rows to the host pool during the forward (``eager_host_mirror``), so
    evictions move no data. Turning it off trades PCIe writes per step for copies at eviction time."""

    # Left out of the serialized settings at its default, so the engine ConfigMap (and with it the revision)
    # of deployments that do not set it stays what it was before the field existed.
    kernels: DecodeKernels = Field(default="vllm", exclude_if=lambda v: v == "vllm")
    """Which kernels serve decode's HiSparse ops. ``vllm``: vLLM's own compiled ops. ``hisparse``: the
    project's kernels, which the runtime's vLLM plugin registers under vLLM's op names in every vLLM
    process (``HISPARSE_DECODE_KERNELS``; preflight proves the registration, ``hisparse_decode_kernels_info``
    shows it). The setting shapes the decode pod, so switching it is a new revision: it goes through the
    canary's parity gate like any build change."""
