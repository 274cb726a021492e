"""vLLM 0.33 command-line flags: every flag name the toolkit renders or owns lives here.

How a user's extra argument maps onto these (aliases, ``--a_b``, ``--flag=value``, dotted JSON keys,
abbreviations, ``--model`` moved to the positional, ``--config`` files) is decided by
:mod:`.vllm_options`, which rebuilds vLLM's own parser from its table.
"""

from __future__ import annotations

from typing import Final

MODEL_POSITIONAL: Final = "model"  # `vllm serve MODEL`

HOST: Final = "--host"
PORT: Final = "--port"
SHUTDOWN_TIMEOUT: Final = "--shutdown-timeout"
SERVED_MODEL_NAME: Final = "--served-model-name"
REVISION: Final = "--revision"
TRUST_REMOTE_CODE: Final = "--trust-remote-code"
MAX_MODEL_LEN: Final = "--max-model-len"
KV_CACHE_DTYPE: Final = "--kv-cache-dtype"
BLOCK_SIZE: Final = "--block-size"
GPU_MEMORY_UTILIZATION: Final = "--gpu-memory-utilization"
TENSOR_PARALLEL_SIZE: Final = "--tensor-parallel-size"
PIPELINE_PARALLEL_SIZE: Final = "--pipeline-parallel-size"
DECODE_CONTEXT_PARALLEL_SIZE: Final = "--decode-context-parallel-size"
DATA_PARALLEL_SIZE: Final = "--data-parallel-size"
DATA_PARALLEL_SIZE_LOCAL: Final = "--data-parallel-size-local"
DATA_PARALLEL_START_RANK: Final = "--data-parallel-start-rank"
DATA_PARALLEL_ADDRESS: Final = "--data-parallel-address"
DATA_PARALLEL_RPC_PORT: Final = "--data-parallel-rpc-port"
DATA_PARALLEL_HYBRID_LB: Final = "--data-parallel-hybrid-lb"
ENABLE_EXPERT_PARALLEL: Final = "--enable-expert-parallel"
ALL2ALL_BACKEND: Final = "--all2all-backend"
ENABLE_DBO: Final = "--enable-dbo"
SPECULATIVE_CONFIG: Final = "--speculative-config"
COMPILATION_CONFIG: Final = "--compilation-config"
KV_TRANSFER_CONFIG: Final = "--kv-transfer-config"
ATTENTION_CONFIG: Final = "--attention-config"
SCHEDULER_RESERVE_FULL_ISL: Final = "--scheduler-reserve-full-isl"
NO_SCHEDULER_RESERVE_FULL_ISL: Final = "--no-scheduler-reserve-full-isl"
DISABLE_HYBRID_KV_CACHE_MANAGER: Final = "--disable-hybrid-kv-cache-manager"
ENABLE_RETURN_ROUTED_EXPERTS: Final = "--enable-return-routed-experts"
HEADLESS: Final = "--headless"
DATA_PARALLEL_RANK: Final = "--data-parallel-rank"
DATA_PARALLEL_EXTERNAL_LB: Final = "--data-parallel-external-lb"
PREFILL_CONTEXT_PARALLEL_SIZE: Final = "--prefill-context-parallel-size"
NNODES: Final = "--nnodes"
NODE_RANK: Final = "--node-rank"
DISABLE_EXPERT_PARALLEL: Final = "--disable-expert-parallel"
LOAD_FORMAT: Final = "--load-format"
MOE_BACKEND: Final = "--moe-backend"
KV_OFFLOADING_SIZE: Final = "--kv-offloading-size"
KV_OFFLOADING_BACKEND: Final = "--kv-offloading-backend"
MODEL: Final = "--model"
CONFIG: Final = "--config"

OWNED: Final[frozenset[str]] = frozenset(
    {
        HOST, PORT, SHUTDOWN_TIMEOUT, SERVED_MODEL_NAME, REVISION, MAX_MODEL_LEN, KV_CACHE_DTYPE, BLOCK_SIZE,
        GPU_MEMORY_UTILIZATION, TENSOR_PARALLEL_SIZE, DATA_PARALLEL_SIZE, DATA_PARALLEL_SIZE_LOCAL,
        DATA_PARALLEL_START_RANK, DATA_PARALLEL_ADDRESS, DATA_PARALLEL_RPC_PORT,
        DATA_PARALLEL_HYBRID_LB, ENABLE_EXPERT_PARALLEL, ALL2ALL_BACKEND, ENABLE_DBO,
        SPECULATIVE_CONFIG, COMPILATION_CONFIG, KV_TRANSFER_CONFIG, ATTENTION_CONFIG,
        SCHEDULER_RESERVE_FULL_ISL, NO_SCHEDULER_RESERVE_FULL_ISL, DISABLE_HYBRID_KV_CACHE_MANAGER,
        ENABLE_RETURN_ROUTED_EXPERTS, PIPELINE_PARALLEL_SIZE, DECODE_CONTEXT_PARALLEL_SIZE,
        HEADLESS, TRUST_REMOTE_CODE, DATA_PARALLEL_RANK, DATA_PARALLEL_EXTERNAL_LB,
        PREFILL_CONTEXT_PARALLEL_SIZE, NNODES, NODE_RANK, DISABLE_EXPERT_PARALLEL, LOAD_FORMAT,
        MOE_BACKEND, KV_OFFLOADING_SIZE, KV_OFFLOADING_BACKEND, MODEL, CONFIG,
    }
)
"""Flags rendered from typed fields (or forbidden outright): ``extraArgs`` may not set them."""
