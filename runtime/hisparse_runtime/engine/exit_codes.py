"""The serving container's exit codes: what ``hisparse-runtime serve`` exits with before vLLM starts.

Here, in the engine core, because both sides read them: the runtime exits with them, and the operator
reads them back from a pod's last termination to say which preflight check refused the node (its
``hisparse_operator_preflight_failures`` gauge and the ``HiSparsePreflightFailed`` alert): a failed
preflight never starts vLLM or the plugin, so nothing inside the pod could report it.
"""

from __future__ import annotations

from typing import Final

BAD_SETTINGS_EXIT_CODE: Final = 2
"""The mounted settings cannot be read or break an engine rule."""

PREFLIGHT_EXIT_CODES: Final[dict[str, int]] = {
    "engine_rules": 30,
    "model_config": 31,
    "gpu": 32,
    "compiled_ops": 33,
    "memlock": 34,
    "host_memory": 35,
    "shm": 36,
    "nixl_side_channel": 37,
    "ucx_transports": 38,
    "host_placement": 39,
    "moe_backend": 40,
    "model_cache": 41,
    "decode_kernels": 42,
    "rdma_devices": 43,
}
"""Exit code of the entrypoint when that preflight check fails (the first failing check in this order wins)."""

PREFLIGHT_CHECK_OF_EXIT_CODE: Final[dict[int, str]] = {code: check for check, code in PREFLIGHT_EXIT_CODES.items()}
