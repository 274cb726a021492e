"""Engine settings of one role: what the operator mounts into each pod and the entrypoint renders."""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import Field

from ._base import Settings
from .kube import EnvVarName
from .cache import EngineOptions
from .cpu_offload import CpuOffloadSettings
from .gpu import GpuArchitecture
from .hisparse import HOST_POOL_HEADROOM_GIB, HiSparseSettings
from .kv_transfer import KVTransferSettings
from .model import ModelSettings
from .moe import MoEBackend
from .parallel import ParallelSettings

Role = Literal["prefill", "decode"]

PREFILL_VLLM_PORT: Final = 8000
"""Prefill pods serve vLLM directly on the service port (llm-d convention)."""
DECODE_VLLM_PORT: Final = 8200
"""Decode pods run vLLM behind the llm-d routing sidecar, which owns port 8000."""
SERVICE_PORT: Final = 8000
"""The port the InferencePool targets on every serving pod."""
PROBE_PORT: Final = 8190
"""The serving entrypoint's own probe server (``hisparse_runtime.probe_server``): the kubelet's HTTP GETs of
:data:`LIVENESS_PATH` and :data:`READINESS_PATH`."""
LIVENESS_PATH: Final = "/livez"
READINESS_PATH: Final = "/readyz"
PROBE_CHECK_SECONDS: Final = 25
"""What one probe answer may take (a decode pod's data-path proof included); the kubelet's
``timeoutSeconds`` is this plus a margin, so the pod answers why before the kubelet gives up."""


class RoleOptions(Settings):
    """Per-role engine options. The HiSparseDeployment's ``prefill`` and ``decode`` specs extend this
    class, so every field here has the same name and path in the CRD."""

    parallelism: ParallelSettings = Field(default_factory=ParallelSettings)
    """Tensor/data/expert parallel layout of one replica."""

    hisparse: HiSparseSettings | None = None
    """HiSparse host-resident KV. Decode role only."""

    cpu_offload: CpuOffloadSettings | None = None
    """vLLM's native CPU KV offload (``OffloadingConnector``), beside NIXL on prefill; on decode only
    without HiSparse (whose host pool already is the host tier)."""

    moe_backend: MoEBackend | None = None
    """MoE expert kernels (``--moe-backend``). Unset: derived from the GPU family the role's placement
    pins (``nodeSelector`` ``nvidia.com/gpu.product``) and the model (on Blackwell, GLM DSA models and online quantization get a named
    backend whose activation-scale rounding it follows); otherwise vLLM chooses. An explicit choice
    wins, unless it is unsafe for that architecture and model."""

    compilation_config: dict[str, Any] | None = Field(default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    """vLLM compilation config (``--compilation-config`` JSON), e.g. ``cudagraph_capture_sizes``.
    ``cudagraph_mode: FULL`` is refused with HiSparse (vLLM's rule; the default FULL_AND_PIECEWISE is fine)."""

    speculative_config: dict[str, Any] | None = Field(default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    """vLLM speculative decoding config (``--speculative-config`` JSON). Refused on HiSparse decode."""

    enable_dbo: bool = False
    """Dual batch overlap (``--enable-dbo``). Refused on HiSparse decode."""

    extra_args: list[str] = Field(default_factory=list, max_length=128)
    """Additional ``vllm serve`` arguments for this role only (after ``spec.engine.extraArgs``)."""

    extra_env: dict[EnvVarName, str] = Field(default_factory=dict, max_length=128)
    """Additional environment variables for this role's vLLM container."""

    # Left out of the serialized settings at its default, so the engine ConfigMap (and with it the revision)
    # of deployments that do not set it stays what it was before the field existed.
    host_memory_headroom_gib: float = Field(default=HOST_POOL_HEADROOM_GIB, ge=0, le=1024,
                                            exclude_if=lambda v: v == HOST_POOL_HEADROOM_GIB)
    """Memory a pod needs beyond its pinned host pools (``hisparse.hostPoolGiB``, ``cpuOffload.sizeGiB``),
    in GiB: the vLLM processes, CUDA context, NIXL and UCX buffers, tokenizer workers. Pinned pages cannot
    be swapped or reclaimed, so the pools plus this must fit the pod's memory request and the node. The
    default (64) is sized for 8-GPU nodes; a CPU-sized deployment needs a few GiB."""


class RoleSettings(RoleOptions):
    """Everything one role's engine needs, resolved from a HiSparseDeployment. Serialized into the
    engine ConfigMap; the pod entrypoint renders ``vllm serve`` from it (never from parsed argv)."""

    role: Role
    """Which side of the P/D pair this engine is."""

    model: ModelSettings
    """The served model (``spec.model``)."""

    engine: EngineOptions = Field(default_factory=EngineOptions)
    """Options shared by both roles (``spec.engine``)."""

    image: str = Field(min_length=1, max_length=512)
    """Runtime image of this role's serving container (``spec.engine.image``); part of the KV hash."""

    kv_transfer: KVTransferSettings = Field(default_factory=KVTransferSettings)
    """NIXL and Mooncake settings (``spec.kvTransfer``)."""

    disaggregated: bool = True
    """A prefill role exists, so KV moves over NIXL. ``False``: decode prefills locally."""

    routed_experts: bool = False
    """Return routed experts with responses (``--enable-return-routed-experts``, ``spec.routedExperts``)."""

    gpu_architecture: GpuArchitecture | None = None
    """GPU family of the nodes the role can land on (from ``nvidia.com/gpu.product``), or None when
    unknown. The MoE backend default follows it; preflight checks the live GPU is of this family."""

    memory_request_gib: float | None = Field(default=None, gt=0)
    """The pod's memory request in GiB (from the role's ``resources.requests.memory``)."""

    mooncake_master_address: str | None = None
    """Resolved ``HOST:PORT`` of the Mooncake master (prefill with the store on)."""

    mooncake_metadata_server: str | None = None
    """Resolved Mooncake transfer-engine metadata server URL."""

    peer_host: str | None = Field(default=None, max_length=253)
    """Decode in a P/D pair: DNS name of the prefill pods' headless NIXL Service. The data-path
    readiness probe proves a transfer from one of them before the pod reports ready."""

    # Left out of the serialized settings at 0, so the engine ConfigMap (and the revision) of roles that request
    # no RDMA device stays what it was before the field existed.
    rdma_devices: int = Field(default=0, ge=0, le=64, exclude_if=lambda v: v == 0)
    """RDMA device-plugin units each pod requests (the role's ``rdma.count``; 0: none). Preflight checks
    the pod sees at least this many RDMA verbs devices before vLLM starts."""

    @property
    def hisparse_on(self) -> bool:
        return self.role == "decode" and self.hisparse is not None

    @property
    def vllm_port(self) -> int:
        return DECODE_VLLM_PORT if self.role == "decode" else PREFILL_VLLM_PORT

    @property
    def mooncake_on(self) -> bool:
        return self.role == "prefill" and self.kv_transfer.mooncake.enabled
