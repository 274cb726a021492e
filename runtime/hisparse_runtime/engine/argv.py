"""Rendering a role's settings into the exact ``vllm serve`` argv and container environment.

Pure functions: the operator renders the env into pod specs, the pod entrypoint renders the argv from
the mounted settings (with its LeaderWorkerSet index and leader address) and ``exec``s vLLM.
"""

from __future__ import annotations

import json
from typing import Any, Final

from . import env as E
from . import flags as F
from . import moe
from .connectors import (
    ENGINE_CONFIG_DIR,
    MOONCAKE_CONFIG_FILE,
    attention_config,
    kv_transfer_config,
)
from .hisparse import DRAIN_SECONDS
from .role import RoleSettings

VLLM_EXECUTABLE: Final = ("vllm", "serve")


def _json(value: dict[str, Any]) -> str:
    # Compact and key-sorted: the argv is part of golden files and must be byte-stable.
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def render_argv(s: RoleSettings, *, worker_index: int = 0, leader_address: str | None = None) -> list[str]:
    """``vllm serve ...`` for the pod at LeaderWorkerSet index ``worker_index`` of a replica.

    ``leader_address`` is the replica leader's address (``LWS_LEADER_ADDRESS``); required when the
    replica spans more than one node, ignored otherwise.
    """
    p = s.parallelism
    model, engine = s.model, s.engine
    argv = [*VLLM_EXECUTABLE, model.vllm_model_arg, F.SERVED_MODEL_NAME, model.served_model_name]
    if model.revision and model.scheme == "hf" and not model.cached:
        # A cached model is a directory of one revision (its marker says which): nothing to resolve.
        argv += [F.REVISION, model.revision]
    if model.scheme == "s3":
        argv += [F.LOAD_FORMAT, "runai_streamer"]
    if model.trust_remote_code:
        argv.append(F.TRUST_REMOTE_CODE)
    argv += [F.HOST, "0.0.0.0", F.PORT, str(s.vllm_port)]
    # vLLM's default (0) aborts every request in flight at SIGTERM; the grace period is sized for this drain.
    argv += [F.SHUTDOWN_TIMEOUT, str(DRAIN_SECONDS)]
    argv += [
        F.MAX_MODEL_LEN, str(engine.max_model_len),
        F.KV_CACHE_DTYPE, engine.kv_cache_dtype,
        F.BLOCK_SIZE, str(engine.block_size),
        F.GPU_MEMORY_UTILIZATION, repr(engine.gpu_memory_utilization),
        F.TENSOR_PARALLEL_SIZE, str(p.tensor_parallel_size),
    ]
    if p.data_parallel_size > 1:
        argv += [F.DATA_PARALLEL_SIZE, str(p.data_parallel_size), F.DATA_PARALLEL_SIZE_LOCAL, str(p.data_parallel_size_local)]
    if p.nodes > 1:
        if not leader_address:
            raise ValueError("a multi-node replica needs the leader address (LWS_LEADER_ADDRESS)")
        argv += [
            F.DATA_PARALLEL_ADDRESS, leader_address,
            F.DATA_PARALLEL_RPC_PORT, str(p.data_parallel_rpc_port),
            F.DATA_PARALLEL_START_RANK, str(p.start_rank(worker_index)),
            # Every pod serves its own DP ranks behind its own API server (llm-d's wide-EP layout),
            # so each pod is a routable endpoint of the InferencePool.
            F.DATA_PARALLEL_HYBRID_LB,
        ]
    if p.enable_expert_parallel:
        argv.append(F.ENABLE_EXPERT_PARALLEL)
    if p.all2all_backend:
        argv += [F.ALL2ALL_BACKEND, p.all2all_backend]
    backend = moe.moe_backend(s)
    if backend is not None:
        argv += [F.MOE_BACKEND, backend]
    kv = kv_transfer_config(s)
    if kv is not None:
        argv += [F.KV_TRANSFER_CONFIG, _json(kv)]
    attention = attention_config(s)
    if attention is not None:
        argv += [F.ATTENTION_CONFIG, _json(attention)]
        # vLLM's default, rendered explicitly: HiSparse refuses to start without it.
        argv.append(F.SCHEDULER_RESERVE_FULL_ISL)
    if s.compilation_config:
        argv += [F.COMPILATION_CONFIG, _json(s.compilation_config)]
    if s.speculative_config:
        argv += [F.SPECULATIVE_CONFIG, _json(s.speculative_config)]
    if s.enable_dbo:
        argv.append(F.ENABLE_DBO)
    if s.routed_experts:
        argv.append(F.ENABLE_RETURN_ROUTED_EXPERTS)
    argv += engine.extra_args
    argv += s.extra_args
    return argv


def pod_argv(s: RoleSettings, environ: dict[str, str]) -> list[str]:
    """The argv the pod entrypoint runs, from its environment (the LeaderWorkerSet index and leader
    address LWS sets; neither on a single-node replica). ``hisparse render --argv`` shows the same."""
    worker = int(environ.get(E.LWS_WORKER_INDEX, "0") or 0)
    return render_argv(s, worker_index=worker, leader_address=environ.get(E.LWS_LEADER_ADDRESS))


def render_env(s: RoleSettings) -> list[dict[str, Any]]:
    """The vLLM container's environment as Kubernetes ``EnvVar`` objects (owned first, then extras)."""
    env: list[dict[str, Any]] = [{"name": E.VLLM_USE_V2_MODEL_RUNNER, "value": "1"}]
    if s.disaggregated:
        nixl = s.kv_transfer.nixl
        env += [
            # vLLM defaults the handshake host to localhost: the peer must reach this pod's IP.
            {"name": E.VLLM_NIXL_SIDE_CHANNEL_HOST, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": E.VLLM_NIXL_SIDE_CHANNEL_PORT, "value": str(nixl.side_channel_port)},
            {"name": E.UCX_TLS, "value": ",".join(nixl.ucx_tls)},
        ]
    if s.mooncake_on:
        env.append({"name": E.MOONCAKE_CONFIG_PATH, "value": f"{ENGINE_CONFIG_DIR}/{MOONCAKE_CONFIG_FILE}"})
    if s.hisparse_on and s.hisparse is not None and s.hisparse.kernels != "vllm":
        # Only when set: the default renders no variable, so no existing pod (or revision) changes.
        env.append({"name": E.HISPARSE_DECODE_KERNELS, "value": s.hisparse.kernels})
    e8m0 = moe.deep_gemm_e8m0(s)
    if e8m0 is not None:
        # The MoE activation-scale rounding follows the rendered MoE backend (engine/moe.py).
        env.append({"name": moe.VLLM_USE_DEEP_GEMM_E8M0, "value": e8m0})
    rendered = {e["name"] for e in env}
    extras = {**s.engine.extra_env, **s.extra_env}
    env += [{"name": k, "value": v} for k, v in sorted(extras.items()) if k not in rendered]
    return env
