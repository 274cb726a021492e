"""Engine core: typed vLLM 0.33 engine settings per role, every startup rule, and the rendering of
``vllm serve`` argv and environment. Pure Python: no kopf, no torch, no I/O."""

from __future__ import annotations

from . import env, flags, gpu, moe, vllm_options
from .argv import pod_argv, render_argv, render_env
from .cache import KV_ROW_BYTES, EngineOptions
from .compat import kv_compat_hash
from .cpu_offload import CpuOffloadSettings
from .gpu import GPU_PRODUCT_LABEL, GpuArchitecture, architecture_of_capability, architecture_of_labels
from .connectors import (
    ENGINE_CONFIG_DIR,
    MOONCAKE_CONFIG_FILE,
    attention_config,
    kv_transfer_config,
    mooncake_config,
    offload_connector,
)
from .constraints import (
    RULES,
    Violation,
    check_host_pool_fits_nodes,
    check_role,
    format_path,
    host_memory_needed_gib,
    host_pool_per_pod_gib,
    pinned_host_gib,
    termination_grace_seconds,
)
from .exit_codes import BAD_SETTINGS_EXIT_CODE, PREFLIGHT_CHECK_OF_EXIT_CODE, PREFLIGHT_EXIT_CODES
from .hisparse import HOST_POOL_HEADROOM_GIB, HOT_BUFFER_MAX_ROWS, HiSparseSettings
from .kv_transfer import MOONCAKE_MASTER_PORT, MOONCAKE_METADATA_PORT, KVTransferSettings, MooncakeStoreSettings, NixlSettings
from .model import (
    DEPRECATED_CACHE_MODES,
    FETCH_EXIT_CODES,
    FETCH_NO_RETRY,
    FETCH_SUBCOMMAND,
    MODEL_CACHE_PATH,
    MODEL_MARKER_FILE,
    MODEL_MOUNT_PATH,
    NODE_CACHE_PATH,
    POD_FETCH_MODES,
    SECRET_KEYS,
    ModelCacheMode,
    ModelCacheSettings,
    ModelCredentials,
    ModelSettings,
)
from .parallel import ParallelSettings
from .role import (
    DECODE_VLLM_PORT,
    LIVENESS_PATH,
    PREFILL_VLLM_PORT,
    PROBE_CHECK_SECONDS,
    PROBE_PORT,
    READINESS_PATH,
    SERVICE_PORT,
    Role,
    RoleOptions,
    RoleSettings,
)
from .versions import VLLM_IMAGE_REPOSITORY, VLLM_VERSION

__all__ = [
    "BAD_SETTINGS_EXIT_CODE", "PREFLIGHT_CHECK_OF_EXIT_CODE", "PREFLIGHT_EXIT_CODES",
    "DECODE_VLLM_PORT", "ENGINE_CONFIG_DIR", "HOST_POOL_HEADROOM_GIB", "HOT_BUFFER_MAX_ROWS", "KV_ROW_BYTES",
    "FETCH_EXIT_CODES", "FETCH_NO_RETRY", "FETCH_SUBCOMMAND", "MODEL_CACHE_PATH", "MODEL_MARKER_FILE", "MODEL_MOUNT_PATH", "NODE_CACHE_PATH", "SECRET_KEYS", "ModelCacheMode",
    "DEPRECATED_CACHE_MODES", "POD_FETCH_MODES",
    "ModelCacheSettings", "ModelCredentials", "MOONCAKE_CONFIG_FILE", "MOONCAKE_MASTER_PORT", "MOONCAKE_METADATA_PORT",
    "PREFILL_VLLM_PORT", "PROBE_CHECK_SECONDS", "PROBE_PORT", "READINESS_PATH", "LIVENESS_PATH", "RULES", "SERVICE_PORT", "VLLM_IMAGE_REPOSITORY", "VLLM_VERSION",
    "GPU_PRODUCT_LABEL", "CpuOffloadSettings", "GpuArchitecture", "architecture_of_capability",
    "architecture_of_labels", "gpu", "moe", "offload_connector",
    "EngineOptions", "HiSparseSettings", "KVTransferSettings", "ModelSettings", "MooncakeStoreSettings",
    "NixlSettings", "ParallelSettings", "Role", "RoleOptions", "RoleSettings", "Violation",
    "attention_config", "check_host_pool_fits_nodes", "check_role", "env", "flags", "format_path",
    "host_memory_needed_gib", "host_pool_per_pod_gib", "pinned_host_gib", "termination_grace_seconds", "kv_compat_hash", "kv_transfer_config",
    "mooncake_config", "pod_argv", "render_argv", "render_env", "vllm_options",
]
