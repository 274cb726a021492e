"""Environment variables the toolkit sets in serving containers (one place for their names)."""

from __future__ import annotations

from typing import Final

VLLM_USE_V2_MODEL_RUNNER: Final = "VLLM_USE_V2_MODEL_RUNNER"
VLLM_NIXL_SIDE_CHANNEL_HOST: Final = "VLLM_NIXL_SIDE_CHANNEL_HOST"
VLLM_NIXL_SIDE_CHANNEL_PORT: Final = "VLLM_NIXL_SIDE_CHANNEL_PORT"
UCX_TLS: Final = "UCX_TLS"
MOONCAKE_CONFIG_PATH: Final = "MOONCAKE_CONFIG_PATH"
HISPARSE_SERVING_ENGINE: Final = "HISPARSE_SERVING_ENGINE"
"""Set by the image, never rendered: ``cpu`` makes the entrypoint run the CPU engine (a stand-in for
vLLM on nodes without a GPU, ``hisparse_runtime.cpu_engine``) with the same argv; unset or ``vllm``
runs ``vllm serve``."""

HISPARSE_CPU_ENGINE_PERTURB: Final = "HISPARSE_CPU_ENGINE_PERTURB"
"""Read by the CPU engine only: ``1`` shifts its output head by one token, so the same checkpoint computes
different tokens. A fault switch that stands in for a broken build in canary tests (``extraEnv`` of a
candidate); vLLM ignores it."""

HISPARSE_CPU_ENGINE_FAULT_FILE: Final = "HISPARSE_CPU_ENGINE_FAULT_FILE"
"""Read by the CPU engine only: a file whose content, read at every KV pull, injects a transfer fault:
``pull-nothing`` (the READ is skipped but reported as done) or ``corrupt`` (the READ's bytes are overwritten
on arrival); empty or absent, none. Negative controls of the tests that claim a real transfer; never
rendered, and vLLM ignores it."""

HISPARSE_DECODE_KERNELS: Final = "HISPARSE_DECODE_KERNELS"
"""Rendered on HiSparse decode only when ``hisparse.kernels`` is ``hisparse`` (its value then); unset means
vLLM's own ops. The vLLM plugin reads it in every vLLM process and registers the project's kernels under
vLLM's op names (``hisparse_runtime.plugin.kernel_swap``); preflight checks it."""

# Set by LeaderWorkerSet in every pod of a group.
LWS_WORKER_INDEX: Final = "LWS_WORKER_INDEX"
LWS_LEADER_ADDRESS: Final = "LWS_LEADER_ADDRESS"

OWNED: Final[frozenset[str]] = frozenset(
    {VLLM_USE_V2_MODEL_RUNNER, VLLM_NIXL_SIDE_CHANNEL_HOST, VLLM_NIXL_SIDE_CHANNEL_PORT, UCX_TLS, MOONCAKE_CONFIG_PATH,
     HISPARSE_DECODE_KERNELS, LWS_WORKER_INDEX, LWS_LEADER_ADDRESS}
)
"""Variables ``extraEnv`` may not set: each is rendered from a typed field or set by LeaderWorkerSet."""
