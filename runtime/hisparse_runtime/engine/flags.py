"""vLLM 0.33 command-line flags: every flag name the toolkit renders or inspects lives here.

vLLM's ``FlexibleArgumentParser`` accepts ``--a_b`` as ``--a-b``, ``--flag=value``, dotted JSON
sub-keys (``--compilation-config.cudagraph_mode=FULL``) and a few short aliases. ``canonical_flag``
folds all of those onto the long dashed name so that ownership and deny rules cannot be sidestepped.
A test checks ``SHORT_ALIASES`` against vLLM's own parser.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

MODEL_POSITIONAL: Final = "model"  # `vllm serve MODEL`

HOST: Final = "--host"
PORT: Final = "--port"
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

SHORT_ALIASES: Final[dict[str, str]] = {
    "-tp": TENSOR_PARALLEL_SIZE,
    "-pp": PIPELINE_PARALLEL_SIZE,
    "-dcp": DECODE_CONTEXT_PARALLEL_SIZE,
    "-dp": DATA_PARALLEL_SIZE,
    "-dpl": DATA_PARALLEL_SIZE_LOCAL,
    "-dpr": DATA_PARALLEL_START_RANK,
    "-dpa": DATA_PARALLEL_ADDRESS,
    "-dpp": DATA_PARALLEL_RPC_PORT,
    "-dph": DATA_PARALLEL_HYBRID_LB,
    "-dpn": DATA_PARALLEL_RANK,
    "-dpe": DATA_PARALLEL_EXTERNAL_LB,
    "-pcp": PREFILL_CONTEXT_PARALLEL_SIZE,
    "-n": NNODES,
    "-r": NODE_RANK,
    "-sc": SPECULATIVE_CONFIG,
    "-ep": ENABLE_EXPERT_PARALLEL,
    "-cc": COMPILATION_CONFIG,
    "-ac": ATTENTION_CONFIG,
}
"""vLLM's short spellings of flags this toolkit owns or forbids (checked against vLLM's parser)."""

OWNED: Final[frozenset[str]] = frozenset(
    {
        HOST, PORT, SERVED_MODEL_NAME, REVISION, MAX_MODEL_LEN, KV_CACHE_DTYPE, BLOCK_SIZE,
        GPU_MEMORY_UTILIZATION, TENSOR_PARALLEL_SIZE, DATA_PARALLEL_SIZE, DATA_PARALLEL_SIZE_LOCAL,
        DATA_PARALLEL_START_RANK, DATA_PARALLEL_ADDRESS, DATA_PARALLEL_RPC_PORT,
        DATA_PARALLEL_HYBRID_LB, ENABLE_EXPERT_PARALLEL, ALL2ALL_BACKEND, ENABLE_DBO,
        SPECULATIVE_CONFIG, COMPILATION_CONFIG, KV_TRANSFER_CONFIG, ATTENTION_CONFIG,
        SCHEDULER_RESERVE_FULL_ISL, NO_SCHEDULER_RESERVE_FULL_ISL, DISABLE_HYBRID_KV_CACHE_MANAGER,
        ENABLE_RETURN_ROUTED_EXPERTS, PIPELINE_PARALLEL_SIZE, DECODE_CONTEXT_PARALLEL_SIZE,
        HEADLESS, TRUST_REMOTE_CODE, DATA_PARALLEL_RANK, DATA_PARALLEL_EXTERNAL_LB,
        PREFILL_CONTEXT_PARALLEL_SIZE, NNODES, NODE_RANK, DISABLE_EXPERT_PARALLEL, LOAD_FORMAT,
    }
)
"""Flags rendered from typed fields (or forbidden outright): ``extraArgs`` may not set them."""


def canonical_flag(token: str) -> str | None:
    """The long dashed flag a command-line token sets, or ``None`` for a value token.

    ``--enable_dbo`` -> ``--enable-dbo``; ``--kv-transfer-config={...}`` -> ``--kv-transfer-config``;
    ``-cc.cudagraph_mode=FULL`` -> ``--compilation-config``; ``-tp=2`` -> ``--tensor-parallel-size``.
    """
    if not token.startswith("-") or token == "-" or _is_number(token):
        return None
    name = token.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
        return name
    name = name.split(".", 1)[0]
    return SHORT_ALIASES.get(name, name)


def flags_in(args: Iterable[str]) -> Iterator[tuple[int, str]]:
    """Yield ``(index, canonical flag)`` for every flag token of an argv fragment."""
    for index, token in enumerate(args):
        flag = canonical_flag(token)
        if flag is not None:
            yield index, flag


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
