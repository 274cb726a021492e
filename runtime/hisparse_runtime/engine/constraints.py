"""Every startup rule of a HiSparse P/D engine, checked before anything runs.

Each rule is a function ``(RoleSettings) -> list[Violation]`` registered under a stable name. The
operator's admission webhook, its reconciler, ``hisparse validate`` and the pod's preflight all call
:func:`check_role` / :func:`check_host_pool_fits_nodes`; nothing else restates these rules.

Paths are relative to :class:`RoleSettings` in its camelCase form (``parallelism.tensorParallelSize``);
the operator maps them onto the HiSparseDeployment (``spec.decode.parallelism.tensorParallelSize``).
Rules that mirror vLLM 0.33's own ``VllmConfig`` checks say so: on a GPU-less machine vLLM cannot run
them, so these mirrors are what catches the mistake before a 20-minute model load.
"""

from __future__ import annotations

import functools
import math
from decimal import Decimal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from . import env as E
from . import flags as F
from . import effective, moe, ports, vllm_options
from ._base import camel
from .argv import render_argv, render_env
from .connectors import HISPARSE, NIXL, connector_names, kv_transfer_config
from .hisparse import DRAIN_SECONDS, HOT_BUFFER_MAX_ROWS, UNPIN_SECONDS_PER_GIB
from .role import RoleSettings

PathPart = str | int


@dataclass(frozen=True)
class Violation:
    """One broken rule: where, what is wrong and what to do."""

    rule: str
    path: tuple[PathPart, ...]
    message: str

    @property
    def dotted(self) -> str:
        return format_path(self.path)

    def __str__(self) -> str:
        return f"{self.dotted}: {self.message} [{self.rule}]"


def format_path(path: Iterable[PathPart]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _p(*parts: PathPart) -> tuple[PathPart, ...]:
    """A path written with Python field names, in the camelCase the CRD uses."""
    return tuple(camel(x) if isinstance(x, str) else x for x in parts)


Rule = Callable[[RoleSettings], list[Violation]]
RULES: Final[dict[str, Rule]] = {}


def rule(name: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return register


# --- layout -----------------------------------------------------------------------------------------


@rule("parallel-layout")
def parallel_layout(s: RoleSettings) -> list[Violation]:
    p, out = s.parallelism, []
    if p.data_parallel_size_local * p.tensor_parallel_size != p.gpus_per_node:
        out.append(Violation("parallel-layout", _p("parallelism", "data_parallel_size_local"),
            f"dataParallelSizeLocal ({p.data_parallel_size_local}) x tensorParallelSize ({p.tensor_parallel_size}) "
            f"= {p.data_parallel_size_local * p.tensor_parallel_size} GPUs, but gpusPerNode is {p.gpus_per_node}; "
            "each pod must use exactly its GPUs: change one of the three"))
    if p.data_parallel_size != p.data_parallel_size_local * p.nodes:
        out.append(Violation("parallel-layout", _p("parallelism", "data_parallel_size"),
            f"dataParallelSize ({p.data_parallel_size}) must equal dataParallelSizeLocal ({p.data_parallel_size_local}) "
            f"x nodes ({p.nodes}) = {p.data_parallel_size_local * p.nodes}"))
    if p.all2all_backend and not p.enable_expert_parallel:
        out.append(Violation("parallel-layout", _p("parallelism", "all2all_backend"),
            f"all2allBackend {p.all2all_backend!r} only applies with enableExpertParallel: true; set it or remove the backend"))
    return out


# --- HiSparse (mirrors of vLLM 0.33 VllmConfig.__post_init__, plus the P/D seed rules) ---------------


@rule("hisparse-decode-only")
def hisparse_decode_only(s: RoleSettings) -> list[Violation]:
    if s.role == "prefill" and s.hisparse is not None:
        return [Violation("hisparse-decode-only", _p("hisparse"),
            "HiSparse serves decode steps from a host pool; a prefill engine gains nothing from it. "
            "Remove spec.prefill.hisparse and configure it under spec.decode.hisparse")]
    return []


@rule("dsa-index-topk")
def dsa_index_topk(s: RoleSettings) -> list[Violation]:
    if s.hisparse_on and s.model.index_topk is None:
        return [Violation("dsa-index-topk", ("model", "indexTopk"),
            "HiSparse is only supported for DSA models with index_topk (vLLM refuses to start otherwise); "
            "set indexTopk to the model's config.json value (2048 for DeepSeek-V3.2 and GLM-5.x), or "
            "remove spec.decode.hisparse for a non-DSA model")]
    return []


@rule("hot-buffer-size")
def hot_buffer_size(s: RoleSettings) -> list[Violation]:
    if not s.hisparse_on or s.hisparse is None or s.model.index_topk is None:
        return []
    k, h = s.model.index_topk, s.hisparse.device_buffer_size
    if h is not None and h < k:
        return [Violation("hot-buffer-size", _p("hisparse", "device_buffer_size"),
            f"deviceBufferSize {h} is smaller than indexTopk {k}: one decode step needs all top-k rows "
            f"resident at once; use at least {k} (default {2 * k})")]
    if h is None and 2 * k >= HOT_BUFFER_MAX_ROWS:
        return [Violation("hot-buffer-size", _p("hisparse", "device_buffer_size"),
            f"the default hot buffer (2 x indexTopk = {2 * k} rows) reaches the int16 slot limit "
            f"{HOT_BUFFER_MAX_ROWS}; set deviceBufferSize between {k} and {HOT_BUFFER_MAX_ROWS - 1}")]
    return []


@rule("no-speculative-decoding")
def no_speculative_decoding(s: RoleSettings) -> list[Violation]:
    if s.hisparse_on and s.speculative_config:
        return [Violation("no-speculative-decoding", _p("speculative_config"),
            "speculative decoding is not supported with HiSparse decode (draft tokens would need hot-buffer "
            "rows the resolver never planned); remove speculativeConfig")]
    return []


@rule("no-dbo")
def no_dbo(s: RoleSettings) -> list[Violation]:
    if s.hisparse_on and s.enable_dbo:
        return [Violation("no-dbo", _p("enable_dbo"),
            "dual batch overlap (--enable-dbo) is not supported with HiSparse decode; set enableDbo: false")]
    return []


@rule("cudagraph-mode")
def cudagraph_mode(s: RoleSettings) -> list[Violation]:
    """The typed compilation config, checked as vLLM's CompilationConfig reads it, then the HiSparse rule."""
    config = s.compilation_config or {}
    out = [Violation("cudagraph-mode" if f == "cudagraph_mode" else "compilation-config", (*_p("compilation_config"), f),
           f"{why}: vLLM would exit at startup and the pod crash-loop; use a valid value (cudagraph_mode e.g. "
           "FULL_AND_PIECEWISE, the default) or remove it") for f, why in effective.compilation_config_problems(config)]
    if not out and s.hisparse_on and effective.cudagraph_mode_name(config.get("cudagraph_mode")) == "FULL":
        out.append(Violation("cudagraph-mode", (*_p("compilation_config"), "cudagraph_mode"),
            "HiSparse does not support cudagraph_mode=FULL (vLLM's rule); use FULL_AND_PIECEWISE (the "
            "default), which still captures full graphs for decode batches"))
    return out


def nixl_consumer_problem(config: dict[str, Any]) -> str | None:
    """Why a HiSparse P/D decode connector config is not [NIXL kv_consumer + HiSparseConnector], or None."""
    children = config.get("kv_connector_extra_config", {}).get("connectors", [config])
    roles = [c.get("kv_role") for c in children if c.get("kv_connector") == NIXL]
    if roles != ["kv_consumer"]:
        return f"NIXL roles {roles}, expected exactly one kv_consumer"
    if not any(c.get("kv_connector") == HISPARSE for c in children):
        return "no HiSparseConnector beside NIXL"
    return None


@rule("nixl-kv-consumer")
def nixl_kv_consumer(s: RoleSettings) -> list[Violation]:
    """HiSparse decode in a P/D pair must only *pull* KV over NIXL: a producer or kv_both decode
    would offer its host pool to other decoders. Guards the renderer itself."""
    if not (s.hisparse_on and s.disaggregated):
        return []
    config = kv_transfer_config(s) or {}
    problem = nixl_consumer_problem(config)
    if problem:
        return [Violation("nixl-kv-consumer", _p("kv_transfer"),
            f"HiSparse decode must pair one NixlConnector kv_consumer with HiSparseConnector: {problem} in {config}")]
    return []


ROUTED_EXPERTS_REFUSED_CONNECTORS: Final[tuple[str, ...]] = (
    "NixlConnector", "NixlPullConnector", "NixlPushConnector", "MoRIIOConnector", "MooncakeConnector",
)
"""vLLM 0.33 refuses ``--enable-return-routed-experts`` when any of these is configured, directly or as a
MultiConnector child (``VllmConfig._verify_aux_output_compatibility``; a test reads vLLM's list)."""

ROUTED_EXPERTS_TOPOLOGY: Final = (
    "vLLM returns routed experts only from an engine without a NIXL connector: a decode-only deployment "
    "(no spec.prefill), with or without decode.cpuOffload (OffloadingConnector) "
    "or HiSparse on that engine"
)


@rule("routed-experts-pd")
def routed_experts_pd(s: RoleSettings) -> list[Violation]:
    if not s.routed_experts:
        return []
    refused = [c for c in connector_names(kv_transfer_config(s)) if c in ROUTED_EXPERTS_REFUSED_CONNECTORS]
    if refused:
        return [Violation("routed-experts-pd", ("routedExperts", "enabled"),
            f"vLLM does not return routed experts from an engine with {', '.join(refused)} ('PD auxiliary "
            f"output is not supported'), and this deployment's P/D engines have it; {ROUTED_EXPERTS_TOPOLOGY}. "
            "Disable routedExperts or serve that topology")]
    return []


@rule("routed-experts-prefix-caching")
def routed_experts_prefix_caching(s: RoleSettings) -> list[Violation]:
    """vLLM's AuxOutput connector requires prefix caching (on by default; only extraArgs can turn it off)."""
    extras = _extra_tokens(s)
    if not s.routed_experts or not extras:
        return []
    try:
        parsed = vllm_options.parse(_rendered_tokens(s) + extras)
    except vllm_options.Refused:
        return []  # owned-flags reports an argv vLLM would exit on
    if parsed.values.get("enable_prefix_caching") is not False:
        return []
    tok = [t for t, dest in parsed.options if dest == "enable_prefix_caching"][-1]
    return [Violation("routed-experts-prefix-caching", tok.origin or _args_base(s),
        f"{tok.text!r}: vLLM returns routed experts only with prefix caching on "
        "('AuxOutput Connector requires prefix caching'); remove it or disable routedExperts")]


# --- CPU KV offload and the MoE backend ------------------------------------------------------------------


@rule("cpu-offload-hisparse")
def cpu_offload_hisparse(s: RoleSettings) -> list[Violation]:
    if s.hisparse_on and s.cpu_offload is not None:
        return [Violation("cpu-offload-hisparse", _p("cpu_offload"),
            "HiSparse decode already keeps the full KV in its pinned host pool, and vLLM 0.33 validates "
            "HiSparseConnector beside NixlConnector / MooncakeStoreConnector only (others are its "
            "'debug/fallback paths'); remove decode.cpuOffload (offload on prefill instead) or decode.hisparse")]
    return []


@rule("moe-backend")
def moe_backend_safe(s: RoleSettings) -> list[Violation]:
    path = _p("moe_backend")
    return [Violation("moe-backend", path, message) for message in moe.problems(s)]


# --- host memory ---------------------------------------------------------------------------------------


def _pool_per_rank(s: RoleSettings) -> dict[str, float]:
    """Host memory each DP rank pools, by the field that sizes it: the HiSparse host pool and the CPU
    KV offload buffer. Both are per rank, so one sizing rule covers them."""
    pools = {}
    if s.hisparse_on and s.hisparse is not None:
        pools["hisparse.hostPoolGiB"] = s.hisparse.host_pool_gib
    if s.cpu_offload is not None:
        pools["cpuOffload.sizeGiB"] = s.cpu_offload.size_gib
    return pools


def host_pool_per_pod_gib(s: RoleSettings) -> float:
    """Pinned host memory one pod needs for its DP ranks' pools, headroom excluded."""
    return sum(_pool_per_rank(s).values()) * s.parallelism.data_parallel_size_local


def host_memory_needed_gib(s: RoleSettings) -> float:
    pool = host_pool_per_pod_gib(s)
    return pool + s.host_memory_headroom_gib if pool else 0.0


def pinned_host_gib(s: RoleSettings) -> float:
    """All pinned host memory of one pod: HiSparse pools on decode, the Mooncake segment on prefill."""
    mooncake = s.kv_transfer.mooncake
    return host_pool_per_pod_gib(s) + (mooncake.global_segment_gib + mooncake.local_buffer_gib if s.mooncake_on else 0.0)


def termination_grace_seconds(s: RoleSettings) -> int:
    """How long Kubernetes must wait after SIGTERM: drain requests, then unpin every pinned GiB."""
    return DRAIN_SECONDS + math.ceil(pinned_host_gib(s) * UNPIN_SECONDS_PER_GIB)


def _exact(gib: float) -> Decimal:
    """A GiB figure as the decimal the manifest wrote (``4.56`` is 4.56, not the binary float near it): the
    shortest repr of a float read from a decimal of up to 15 digits is that decimal."""
    return Decimal(repr(gib))


def exact_host_memory_needed_gib(s: RoleSettings) -> Decimal:
    """:func:`host_memory_needed_gib` in exact decimal arithmetic, for comparisons (an exact fit fits)."""
    pools = _pool_per_rank(s)
    if not pools:
        return Decimal(0)
    return sum((_exact(g) for g in pools.values()), Decimal(0)) * s.parallelism.data_parallel_size_local + _exact(s.host_memory_headroom_gib)


@rule("host-pool-fits-request")
def host_pool_fits_request(s: RoleSettings) -> list[Violation]:
    need = host_memory_needed_gib(s)
    if not need:
        return []
    pool, pools = host_pool_per_pod_gib(s), _pool_per_rank(s)
    per_rank = " + ".join(f"{field} {gib:g}" for field, gib in pools.items())
    per_rank = f"({per_rank})" if len(pools) > 1 else per_rank
    detail = (f"{s.parallelism.data_parallel_size_local} DP ranks x {per_rank} "
              f"= {pool:g} GiB pinned + {s.host_memory_headroom_gib:g} GiB headroom (hostMemoryHeadroomGiB) = {need:g} GiB")
    what = "HiSparse decode" if s.hisparse_on else f"the {s.role} engine's CPU KV offload"
    if s.memory_request_gib is None:
        return [Violation("host-pool-fits-request", ("resources", "requests", "memory"),
            f"{what} pins {detail}; set a memory request of at least {need:g}Gi so the scheduler "
            "places the pod on a node that has it")]
    if _exact(s.memory_request_gib) < exact_host_memory_needed_gib(s):
        return [Violation("host-pool-fits-request", ("resources", "requests", "memory"),
            f"memory request {s.memory_request_gib:g}Gi cannot hold the host pool: {detail}; raise the "
            f"request to at least {need:g}Gi or lower {' / '.join(pools)}")]
    return []


def check_host_pool_fits_nodes(s: RoleSettings, allocatable_gib: dict[str, float]) -> list[Violation]:
    """With cluster facts: enough schedulable nodes (``name -> allocatable GiB``, already filtered to
    those the role can land on) must hold the pod's host pool for one replica."""
    need = host_memory_needed_gib(s)
    if not need:
        return []
    fitting = sorted(n for n, gib in allocatable_gib.items() if _exact(gib) >= exact_host_memory_needed_gib(s))
    wanted = s.parallelism.nodes
    if len(fitting) >= wanted:
        return []
    largest = max(allocatable_gib.values(), default=0.0)
    pools = _pool_per_rank(s)
    path = _p("hisparse", "host_pool_gib") if s.hisparse_on else _p("cpu_offload", "size_gib")
    return [Violation("host-pool-fits-node", path,
        f"each {s.role} pod needs {need:g} GiB of host memory, but only {len(fitting)} of the "
        f"{len(allocatable_gib)} nodes the {s.role} role can be scheduled on have that much allocatable "
        f"(largest: {largest:g} GiB) and one replica needs {wanted}; lower {' / '.join(pools)} or target larger nodes")]


def check_gpu_architectures(s: RoleSettings, nodes: dict[str, list[str]]) -> list[Violation]:
    """With cluster facts: the MoE backend must be safe on every GPU family among the nodes the role
    can land on (``family -> node names``, from their GPU feature discovery labels). A role pinned to
    its family was checked for it already; one that is not gets each family's check here."""
    if s.gpu_architecture is not None:
        return []
    out = []
    env = {**s.engine.extra_env, **s.extra_env}
    for arch, names in sorted(nodes.items()):
        where = f"{arch} nodes ({', '.join(sorted(names)[:3])}{', ...' if len(names) > 3 else ''})"
        unsafe = moe.rendered_scale_problem(s, arch, env)  # type: ignore[arg-type]
        if unsafe:
            out.append(Violation("moe-backend", _p("node_selector"), f"the {s.role} role can land on {where}: {unsafe}"))
        out += [Violation("moe-backend", _p("moe_backend"), f"on {where}: {m}") for m in moe.problems(s, arch)]  # type: ignore[arg-type]
    return out


# --- ports ---------------------------------------------------------------------------------------------


@rule("distinct-ports")
def distinct_ports(s: RoleSettings) -> list[Violation]:
    """The single ports of a pod (vLLM, sidecar, link check, DP coordinator) are all different."""
    fixed = ports.fixed_ports(s)
    if not s.disaggregated:
        fixed.pop("kvTransfer.nixl.linkCheckPort", None)
    by_port: dict[int, list[str]] = {}
    for name, port in fixed.items():
        by_port.setdefault(port, []).append(name)
    out = []
    for port, names in by_port.items():
        if len(names) < 2:
            continue
        # One listener may keep the port (a fixed one if any); every configurable other must move, each
        # reported at its own field so that one pass fixes them all.
        keeper = next((n for n in names if n not in _MOVABLE_PORTS), names[0])
        for name in names:
            if name == keeper:
                continue
            others = " and ".join(n for n in names if n != name)
            out.append(Violation("distinct-ports", _MOVABLE_PORTS.get(name, _MOVABLE_PORTS["kvTransfer.nixl.linkCheckPort"]),
                f"{name} is {port}, as {others} {'is' if len(names) == 2 else 'are'}: two listeners on one port and the "
                f"one that binds second fails to start; choose a different {name if name in _MOVABLE_PORTS else keeper}"))
    return out


_MOVABLE_PORTS: Final[dict[str, tuple[str, ...]]] = {
    "kvTransfer.nixl.linkCheckPort": ("kvTransfer", "nixl", "linkCheckPort"),
    "parallelism.dataParallelRpcPort": ("parallelism", "dataParallelRpcPort"),
}
"""The single ports a manifest sets, by the name :func:`ports.fixed_ports` gives them, and their field."""


@rule("side-channel-ports")
def side_channel_ports(s: RoleSettings) -> list[Violation]:
    if not s.disaggregated:
        return []
    nixl, p = s.kv_transfer.nixl, s.parallelism
    used = ports.side_channel_ports(s)
    low, high = used.start, used.stop - 1
    path = ("kvTransfer", "nixl", "sideChannelPort")
    out = []
    if high > ports.MAX_PORT:
        out.append(Violation("side-channel-ports", path,
            f"sideChannelPort {nixl.side_channel_port} + DP rank reaches {high} for the last of {p.data_parallel_size} "
            f"DP ranks (vLLM binds base + global DP rank), above the largest port {ports.MAX_PORT}: the engines of ranks "
            f"{ports.MAX_PORT - low + 1}-{p.data_parallel_size - 1} could not open their NIXL handshake and would fail "
            f"to start; set sideChannelPort to at most {ports.MAX_PORT - p.data_parallel_size + 1}"))
    clashes = [f"{name} {port}" for name, port in ports.fixed_ports(s).items() if low <= port <= high]
    if clashes:
        out.append(Violation("side-channel-ports", path,
            f"NIXL side channels use ports {low}-{high} (base {nixl.side_channel_port} + DP rank for "
            f"{p.data_parallel_size} ranks), which overlaps {', '.join(clashes)}: two listeners on one port and the "
            "engine that binds second fails to start; move sideChannelPort or the other port(s) out of that range"))
    return out


# --- extra args and env --------------------------------------------------------------------------------

_FORBIDDEN_REASONS: Final[dict[str, str]] = {
    F.PIPELINE_PARALLEL_SIZE: "HiSparse does not support pipeline parallelism; scale with parallelism.dataParallelSize",
    F.DECODE_CONTEXT_PARALLEL_SIZE: "HiSparse does not support decode context parallelism",
    F.SCHEDULER_RESERVE_FULL_ISL: "HiSparse requires --scheduler-reserve-full-isl, which the toolkit always sets (without it waiting requests can deadlock on host pages)",
    F.DISABLE_HYBRID_KV_CACHE_MANAGER: "HiSparse requires the hybrid KV cache manager",
    F.HEADLESS: "pods of a multi-node replica are rendered per LeaderWorkerSet index; headless mode is not used",
    F.PREFILL_CONTEXT_PARALLEL_SIZE: "context parallelism is not part of the HiSparse P/D layout",
    F.NNODES: "multi-node replicas are rendered as LeaderWorkerSets; set parallelism.nodes",
    F.NODE_RANK: "node ranks come from the LeaderWorkerSet index",
    F.DATA_PARALLEL_RANK: "DP ranks come from the LeaderWorkerSet index",
    F.DATA_PARALLEL_EXTERNAL_LB: "multi-node replicas use hybrid load balancing, one endpoint per pod",
    F.CONFIG: "--config reads more arguments from a YAML file in the container, which no check here can see "
              "(and which could set any flag the toolkit owns); pass the arguments themselves",
}

_TYPED_FIELD: Final[dict[str, str]] = {
    F.HOST: "(fixed: 0.0.0.0)", F.PORT: "(fixed by role)",
    F.SHUTDOWN_TIMEOUT: f"(fixed: {DRAIN_SECONDS} s, counted in the pod's terminationGracePeriodSeconds)", F.SERVED_MODEL_NAME: "spec.model.servedModelName",
    F.REVISION: "spec.model.revision", F.TRUST_REMOTE_CODE: "spec.model.trustRemoteCode",
    F.MAX_MODEL_LEN: "spec.engine.maxModelLen", F.KV_CACHE_DTYPE: "spec.engine.kvCacheDtype",
    F.BLOCK_SIZE: "spec.engine.blockSize", F.GPU_MEMORY_UTILIZATION: "spec.engine.gpuMemoryUtilization",
    F.TENSOR_PARALLEL_SIZE: "parallelism.tensorParallelSize", F.DATA_PARALLEL_SIZE: "parallelism.dataParallelSize",
    F.DATA_PARALLEL_SIZE_LOCAL: "parallelism.dataParallelSizeLocal", F.DATA_PARALLEL_START_RANK: "(per LeaderWorkerSet index)",
    F.DATA_PARALLEL_ADDRESS: "(the LeaderWorkerSet leader)", F.DATA_PARALLEL_RPC_PORT: "parallelism.dataParallelRpcPort",
    F.DATA_PARALLEL_HYBRID_LB: "(always on for multi-node replicas)", F.ENABLE_EXPERT_PARALLEL: "parallelism.enableExpertParallel",
    F.DISABLE_EXPERT_PARALLEL: "parallelism.enableExpertParallel", F.LOAD_FORMAT: "(set from spec.model.source)",
    F.ALL2ALL_BACKEND: "parallelism.all2allBackend", F.ENABLE_DBO: "enableDbo", F.SPECULATIVE_CONFIG: "speculativeConfig",
    F.COMPILATION_CONFIG: "compilationConfig", F.KV_TRANSFER_CONFIG: "spec.kvTransfer and spec.decode.hisparse",
    F.ATTENTION_CONFIG: "spec.decode.hisparse", F.SCHEDULER_RESERVE_FULL_ISL: "(always on)",
    F.ENABLE_RETURN_ROUTED_EXPERTS: "spec.routedExperts.enabled", F.MOE_BACKEND: "moeBackend",
    F.KV_OFFLOADING_SIZE: "cpuOffload.sizeGiB",
    F.KV_OFFLOADING_BACKEND: "cpuOffload", F.MODEL: "spec.model.source",
}

_OWNED_ENV_FIELD: Final[dict[str, str]] = {
    E.VLLM_USE_V2_MODEL_RUNNER: "always 1: HiSparse requires Model Runner V2",
    E.VLLM_NIXL_SIDE_CHANNEL_HOST: "set from the pod IP",
    E.VLLM_NIXL_SIDE_CHANNEL_PORT: "use spec.kvTransfer.nixl.sideChannelPort",
    E.UCX_TLS: "use spec.kvTransfer.nixl.ucxTls",
    E.MOONCAKE_CONFIG_PATH: "rendered from spec.kvTransfer.mooncake",
    E.LWS_WORKER_INDEX: "set by LeaderWorkerSet",
    E.LWS_LEADER_ADDRESS: "set by LeaderWorkerSet",
    E.HISPARSE_DECODE_KERNELS: "use spec.decode.hisparse.kernels",
}


_ENV_REASONS: Final[dict[str, str]] = {
    "VLLM_PORT": "vLLM derives its internal ports from it; the toolkit lays out every port of the pod",
    "VLLM_HOST_IP": "vLLM advertises this address to its peers; the pod IP is what they reach",
    "VLLM_DP_MASTER_IP": "the DP coordinator is the LeaderWorkerSet leader (parallelism.dataParallelRpcPort)",
    "VLLM_DP_MASTER_PORT": "use parallelism.dataParallelRpcPort",
    "VLLM_DP_RANK": "DP ranks come from the LeaderWorkerSet index",
    "VLLM_DP_RANK_LOCAL": "DP ranks come from the LeaderWorkerSet index",
    "VLLM_DP_SIZE": "use parallelism.dataParallelSize",
    "VLLM_PP_LAYER_PARTITION": "HiSparse does not support pipeline parallelism",
    "VLLM_MLA_DISABLE": "it changes the attention and KV layout that prefill and decode must share (KV-compatibility hash)",
    "VLLM_KV_CACHE_LAYOUT": "it changes the KV layout that prefill and decode must share (KV-compatibility hash)",
    "VLLM_TEST_FORCE_LOAD_FORMAT": "the load format is set from spec.model.source",
    "VLLM_USE_MODELSCOPE": "the model source is spec.model.source",
    "VLLM_MODEL_REDIRECT_PATH": "it swaps the model; use spec.model.source",
    "VLLM_TARGET_DEVICE": "the runtime image is built for CUDA",
    "CUDA_VISIBLE_DEVICES": "each pod uses exactly its parallelism.gpusPerNode GPUs",
    "NVIDIA_VISIBLE_DEVICES": "the NVIDIA container runtime would expose the GPUs it names (all: every GPU of the node) "
                              "instead of the ones Kubernetes allotted the pod; each pod uses exactly its "
                              "parallelism.gpusPerNode GPUs",
    "LOCAL_RANK": "ranks are assigned by vLLM from the rendered layout",
}
"""Variables vLLM reads that would change a setting the toolkit renders, and why."""


@functools.cache
def _dest_rules() -> tuple[dict[str, str], dict[str, str]]:
    """(forbidden dest -> reason, owned dest -> where to set it instead), keyed by argparse dest so
    aliases, negations and abbreviations of a flag all hit the same rule."""
    forbidden = {vllm_options.dest_of(f): reason for f, reason in _FORBIDDEN_REASONS.items()}
    owned = {vllm_options.dest_of(f): _TYPED_FIELD.get(f, "its typed field") for f in F.OWNED}
    return forbidden, owned


_LEADER_PLACEHOLDER: Final = "leader.invalid"  # any name: the check only needs the argv's shape


def _extra_tokens(s: RoleSettings) -> list[vllm_options.Token]:
    return ([vllm_options.Token(a, ("engine", "extraArgs", i)) for i, a in enumerate(s.engine.extra_args)]
            + [vllm_options.Token(a, ("extraArgs", i)) for i, a in enumerate(s.extra_args)])


def _rendered_tokens(s: RoleSettings) -> list[vllm_options.Token]:
    """``serve MODEL ...``: the toolkit's own argv of this role, without the extra arguments."""
    argv = render_argv(s.model_copy(update={"extra_args": [], "engine": s.engine.model_copy(update={"extra_args": []})}),
                       worker_index=0, leader_address=_LEADER_PLACEHOLDER)
    return [vllm_options.Token(a) for a in argv[1:]]


_VALUE_FIELDS: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    F.SERVED_MODEL_NAME: (("model", "servedModelName"), "served_model_name"),
    F.REVISION: (("model", "revision"), "revision"),
}
"""Rendered flags whose value is a string the user wrote: (field path, vLLM dest)."""


@rule("rendered-values")
def rendered_values(s: RoleSettings) -> list[Violation]:
    """A user's string rendered as a flag's value must reach vLLM as that value: a revision such as
    ``--trust-remote-code`` or ``-x.y`` would be read as an option (or a dotted JSON key) instead."""
    tokens = _rendered_tokens(s)
    for i, tok in enumerate(tokens[:-1]):
        if tok.text in _VALUE_FIELDS:
            tokens[i + 1] = vllm_options.Token(tokens[i + 1].text, _VALUE_FIELDS[tok.text][0])
    try:
        parsed = vllm_options.parse(tokens)
    except vllm_options.Refused as exc:
        return [Violation("rendered-values", exc.origin or ("model",),
            f"vllm serve would exit at startup on the rendered argv: {exc}; the pod would crash-loop: use a value "
            "that does not start with '-'")]
    out = []
    for flag, (path, dest) in _VALUE_FIELDS.items():
        value = next((tokens[i + 1].text for i, t in enumerate(tokens[:-1]) if t.text == flag), None)
        if value is None:
            continue
        got = parsed.values.get(dest)
        if got != value and got != [value]:
            out.append(Violation("rendered-values", path,
                f"{value!r} would not reach vLLM as the value of {flag} (vLLM reads {got!r}): a value starting with '-' "
                "is taken for an option; use the real value"))
    return out


def _args_base(s: RoleSettings) -> tuple[PathPart, ...]:
    return ("extraArgs",) if s.extra_args else ("engine", "extraArgs")


@rule("owned-flags")
def owned_flags(s: RoleSettings) -> list[Violation]:
    """Parse the whole argv as vLLM 0.33 would (``vllm_options``); refuse what vLLM would exit on, and
    every token that vLLM reads as a flag the toolkit renders or HiSparse forbids, however spelled."""
    extras = _extra_tokens(s)
    if not extras:
        return []
    forbidden, owned = _dest_rules()
    rendered = _rendered_tokens(s)
    try:
        parsed = vllm_options.parse(rendered + extras)
    except vllm_options.Unverifiable as exc:
        return [Violation("owned-flags", exc.origin or _args_base(s), f"{str(exc)!r}: {forbidden[vllm_options.dest_of(F.CONFIG)]}")]
    except vllm_options.Refused as exc:
        return [Violation("extra-args-parse", exc.origin or _args_base(s),
            f"vllm serve would exit at startup on these arguments: {exc}; the pod would crash-loop: correct or "
            "remove the argument (`vllm serve --help=<name>` in the runtime image lists vLLM 0.33's options)")]
    out, reported = [], set()
    for tok, dest in parsed.options:
        if tok.origin is None or tok.origin in reported:
            continue
        spelled = f"{tok.text!r}" + ("" if tok.text.split("=", 1)[0] in (vllm_options.long_of(dest),) else
                                    f" (vLLM reads it as {vllm_options.long_of(dest)})")
        if dest in forbidden:
            reported.add(tok.origin)
            out.append(Violation("owned-flags", tok.origin, f"{spelled}: {forbidden[dest]}; remove it"))
        elif dest in owned:
            reported.add(tok.origin)
            where = owned[dest]
            instead = f"it is {where.strip('()')}" if where.startswith("(") else f"set {where} instead of passing it"
            out.append(Violation("owned-flags", tok.origin,
                f"{spelled} is rendered by the toolkit and may not be overridden (a second value would silently win "
                f"over the rendered one); {instead}"))
    if out:
        return out
    # Whatever the spelling: every owned setting must be what the toolkit rendered.
    alone = vllm_options.parse(rendered).values
    changed = sorted(d for d in {*forbidden, *owned} if parsed.values.get(d) != alone.get(d))
    return [Violation("owned-flags", _args_base(s),
        f"these arguments change {', '.join(vllm_options.long_of(d) for d in changed)}, which the toolkit renders; "
        "remove them and set the typed fields instead")] if changed else []


@rule("owned-env")
def owned_env(s: RoleSettings) -> list[Violation]:
    out = []
    known = vllm_options.known_environment_variables()
    for base, extra in ((("engine", "extraEnv"), s.engine.extra_env), (("extraEnv",), s.extra_env)):
        for name in sorted(extra):
            if name in _OWNED_ENV_FIELD:
                out.append(Violation("owned-env", (*base, name),
                    f"{name} is owned by the toolkit ({_OWNED_ENV_FIELD[name]}); a second value would override the "
                    "rendered one: remove it"))
            elif name in _ENV_REASONS:
                out.append(Violation("owned-env", (*base, name),
                    f"{name} changes what the toolkit renders: {_ENV_REASONS[name]}; remove it"))
            elif name.startswith("VLLM_") and name not in known:
                out.append(Violation("owned-env", (*base, name),
                    f"vLLM {vllm_options.table()['vllm']} reads no variable {name} (it would warn and ignore it): check "
                    "the spelling against vllm/envs.py, or remove it"))
    return out


def _found(findings: list[effective.Finding], s: RoleSettings) -> list[Violation]:
    return [Violation(f.rule, f.origin or _args_base(s), f.message) for f in findings]


@rule("effective-settings")
def effective_settings(s: RoleSettings) -> list[Violation]:
    """The settings vLLM would build from the whole argv and environment (``engine/effective.py``): every
    route to a forbidden or owned setting meets the rule the typed field does."""
    out = []
    for base, extra in ((("engine", "extraEnv"), s.engine.extra_env), (("extraEnv",), s.extra_env)):
        out += _found(effective.env_findings(s, base, extra), s)
    extras = _extra_tokens(s)
    if not extras:
        return out
    try:
        parsed = vllm_options.parse(_rendered_tokens(s) + extras)
    except vllm_options.Refused:
        return out  # owned-flags reports an argv vLLM would exit on
    return out + _found(effective.argv_findings(s, parsed), s)


_RENDERED_FROM: Final[dict[str, tuple[PathPart, ...]]] = {
    F.COMPILATION_CONFIG: _p("compilation_config"), F.SPECULATIVE_CONFIG: _p("speculative_config"),
    F.SERVED_MODEL_NAME: ("model", "servedModelName"), F.REVISION: ("model", "revision"),
}


@rule("exec-limits")
def exec_limits(s: RoleSettings) -> list[Violation]:
    """The container's ``execve`` of vLLM must fit Linux's argument limits."""
    leader = _LEADER_PLACEHOLDER if s.parallelism.nodes > 1 else None
    argv = render_argv(s, worker_index=0, leader_address=leader)
    n = len(argv) - len(s.engine.extra_args) - len(s.extra_args)
    origins: dict[int, tuple[PathPart, ...]] = {i + 1: _RENDERED_FROM[a] for i, a in enumerate(argv[:n - 1]) if a in _RENDERED_FROM}
    origins.update({n + i: ("engine", "extraArgs", i) for i in range(len(s.engine.extra_args))})
    origins.update({n + len(s.engine.extra_args) + i: ("extraArgs", i) for i in range(len(s.extra_args))})
    env_base = {**{k: ("engine", "extraEnv", k) for k in s.engine.extra_env}, **{k: ("extraEnv", k) for k in s.extra_env}}
    return _found(effective.exec_findings(s, argv, render_env(s), origins, env_base), s)


def check_role(s: RoleSettings) -> list[Violation]:
    """All rules for one role, in registration order. Empty means the engine may start."""
    return [v for fn in RULES.values() for v in fn(s)]
