"""The preflight checks. Each takes the context and returns one ``CheckOutcome`` (or None when it
does not apply to this role); a failed outcome says what is wrong and what to do."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from hisparse_runtime.engine import (
    MODEL_MOUNT_PATH,
    RoleSettings,
    check_role,
    host_memory_needed_gib,
    pinned_host_gib,
)
from hisparse_runtime.engine import architecture_of_capability, moe
from hisparse_runtime.engine.exit_codes import PREFLIGHT_EXIT_CODES
from hisparse_runtime.engine.gpu import BLACKWELL_FAMILIES
from hisparse_runtime.engine import env as E
from hisparse_runtime.preflight import facts
from hisparse_runtime.preflight_report import CheckOutcome

__all__ = ["CHECKS", "EXIT_CODES", "MIN_SHM_GIB", "SUPPORTED_CAPABILITIES", "PreflightContext"]

GIB = 1 << 30

SUPPORTED_CAPABILITIES: frozenset[tuple[int, int]] = frozenset({(9, 0), (10, 0)})
"""GPU compute capabilities the image's kernels are built for (TORCH_CUDA_ARCH_LIST "9.0;10.0")."""

MIN_SHM_GIB = 4.0
"""Smallest /dev/shm a serving pod gets: vLLM and NCCL exchange tensors through it between ranks;
a container runtime's 64 MiB default fails at the first multi-GPU collective."""

VLLM_HISPARSE_OPS = ("hisparse_resolve_residency", "hisparse_invalidate_written_slots", "hisparse_gather_plan",
                     "hisparse_gather_compact")  # fmt: skip
"""vLLM 0.33's compiled HiSparse ops (``torch.ops._C_cache_ops``); vLLM refuses to start without them."""

EXIT_CODES: dict[str, int] = dict(PREFLIGHT_EXIT_CODES)
"""Exit code of the entrypoint when that check fails (defined in the engine core, which the operator reads too)."""


@dataclass
class PreflightContext:
    """The settings under test and where node facts come from (real paths in a pod)."""

    settings: RoleSettings
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    meminfo: Path = Path("/proc/meminfo")
    cgroup_memory_max: Path = Path("/sys/fs/cgroup/memory.max")
    shm: Path = Path("/dev/shm")
    model_dir: Path | None = None
    """Directory holding the model's config.json; None resolves it from the settings."""
    gpus: Callable[[], list[facts.GpuFact]] = facts.detect_gpus
    ipc_lock: Callable[[], bool] = lambda: facts.holds_capability(facts.CAP_IPC_LOCK)
    """Whether this process holds CAP_IPC_LOCK (then RLIMIT_MEMLOCK does not bound pinning)."""
    min_shm_gib: float = MIN_SHM_GIB
    ucx_timeout_s: float = 60.0
    rdma_dev: Path = Path("/dev/infiniband")
    """Where an RDMA device plugin mounts the verbs devices (``uverbsN``) it grants the pod."""
    sysfs: Path = Path("/sys")
    """sysfs root: ``class/infiniband_verbs/uverbsN/ibdev`` names each verbs device's RDMA device."""
    kernel_swap: dict[str, str] = field(default_factory=dict)
    """Keyword arguments of ``kernel_swap.install`` (``vllm_ns``, ``ours_ns``, ``dispatch_key``); empty:
    vLLM's real ops and the project's, on CUDA. Tests stand in for vLLM's ops on CPU through it."""


def _ok(name: str, message: str) -> CheckOutcome:
    return CheckOutcome(name=name, ok=True, message=message)


def _fail(name: str, message: str) -> CheckOutcome:
    return CheckOutcome(name=name, ok=False, message=message, exit_code=EXIT_CODES[name])


# --- settings ----------------------------------------------------------------------------------------


def engine_rules(ctx: PreflightContext) -> CheckOutcome:
    violations = check_role(ctx.settings)
    if violations:
        return _fail("engine_rules", "; ".join(str(v) for v in violations))
    return _ok("engine_rules", "every engine rule holds")


# --- model -------------------------------------------------------------------------------------------


def _model_config_path(ctx: PreflightContext) -> Path | None:
    if ctx.model_dir is not None:
        return ctx.model_dir / "config.json"
    model = ctx.settings.model
    if model.scheme == "pvc" or model.cached:
        return Path(model.vllm_model_arg) / "config.json"
    if model.scheme == "hf":
        try:  # the serving image has huggingface_hub (vLLM needs it); a small file, fetched once
            from huggingface_hub import hf_hub_download

            return Path(hf_hub_download(model.location, "config.json", revision=model.revision))
        except Exception:
            return None
    return None


def model_config(ctx: PreflightContext) -> CheckOutcome | None:
    model = ctx.settings.model
    path = _model_config_path(ctx)
    if path is None:
        return _ok("model_config", f"not checked: config.json of {model.source} is not reachable before vLLM loads it")
    try:
        config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return _fail("model_config", f"{path} does not exist: check the model source {model.source}"
                     f" (pvc:// models are mounted at {MODEL_MOUNT_PATH}/<subpath>)")  # fmt: skip
    except (OSError, ValueError) as exc:
        return _fail("model_config", f"{path} is not readable JSON: {exc}")
    # Some multimodal checkpoints nest the language model's settings under text_config.
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else {}
    get = lambda key: config.get(key, text.get(key))  # noqa: E731

    problems = []
    topk = get("index_topk")
    if topk is None:
        if ctx.settings.hisparse_on:
            problems.append("config.json has no index_topk: this is not a DSA model and HiSparse cannot serve it;"
                            " remove spec.decode.hisparse or serve a DSA checkpoint")  # fmt: skip
    elif model.index_topk is not None and int(topk) != model.index_topk:
        problems.append(f"config.json index_topk is {topk} but model.indexTopk declares {model.index_topk};"
                        f" set indexTopk to {topk}")  # fmt: skip
    freq = int(get("index_topk_freq") or 1)
    if freq != model.index_topk_freq:
        problems.append(f"config.json index_topk_freq is {freq} but model.indexTopkFreq declares"
                        f" {model.index_topk_freq}; set indexTopkFreq to {freq}")  # fmt: skip
    types = get("indexer_types")
    if types is not None and model.indexer_types is not None and list(types) != list(model.indexer_types):
        first = next((i for i, (a, b) in enumerate(zip(types, model.indexer_types, strict=False)) if a != b),
                     min(len(types), len(model.indexer_types)))  # fmt: skip
        problems.append(f"config.json indexer_types differ from model.indexerTypes at layer {first}"
                        f" ({len(types)} vs {len(model.indexer_types)} layers); copy them from config.json")  # fmt: skip
    elif (types is None) != (model.indexer_types is None):
        where = "model.indexerTypes declares them but config.json has none" if types is None else \
            "config.json declares indexer_types but model.indexerTypes is unset"  # fmt: skip
        problems.append(f"{where}; they must agree")
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    if model.architecture is not None and architectures and model.architecture not in architectures:
        problems.append(f"config.json architectures are {architectures} but model.architecture declares"
                        f" {model.architecture}; set it to {architectures[0]}")  # fmt: skip
    elif model.architecture is None and set(architectures) & moe.GLM_DSA_ARCHITECTURES and _on_blackwell(ctx):
        problems.append(f"config.json declares {architectures[0]} but model.architecture is unset, and this pod has"
                        " Blackwell GPUs: declare it, the MoE backend the toolkit renders there depends on it")  # fmt: skip
    if problems:
        return _fail("model_config", f"{path}: " + "; ".join(problems))
    return _ok("model_config", f"{path}: index_topk={topk}, index_topk_freq={freq}")


def model_cache(ctx: PreflightContext) -> CheckOutcome | None:
    """The cached weights are the declared source at the declared revision, every file as it was written
    (the marker the fetcher writes last), so no pod serves bytes of another revision or a half download."""
    model = ctx.settings.model
    if not model.cached or model.cache_dir is None:
        return None
    from hisparse_runtime.fetch_model import marker_problem, read_marker

    where = ctx.model_dir or Path(model.cache_dir)
    problem = marker_problem(where, model.source, model.revision)
    if problem is not None:
        return _fail("model_cache", f"{problem}. The serving pod must not start on it: check ModelReady on the "
                     "HiSparseDeployment, and the fetch-model Job (or init container) log")  # fmt: skip
    marker = read_marker(where)
    assert marker is not None
    return _ok("model_cache", f"{where}: {model.source} at {marker.revision} (commit {marker.commit}), "
               f"{len(marker.files)} files, {marker.bytes} bytes")


def _on_blackwell(ctx: PreflightContext) -> bool:
    try:
        found = ctx.gpus()
    except Exception:
        return False
    return bool(found) and architecture_of_capability(*found[0].capability) in BLACKWELL_FAMILIES


# --- GPU and compiled code -----------------------------------------------------------------------------


def cpu_engine(ctx: PreflightContext) -> bool:
    """The image runs the runtime's CPU engine in place of vLLM (``HISPARSE_SERVING_ENGINE=cpu``): GPU checks
    report that instead of failing; every other check runs as on a GPU node."""
    return (ctx.env.get(E.HISPARSE_SERVING_ENGINE) or "vllm") == "cpu"


_CPU_ENGINE_NOTE: Final = (f"{E.HISPARSE_SERVING_ENGINE}=cpu: the runtime's CPU engine serves this pod in place of"
                           " vLLM, with no GPU")


def gpu(ctx: PreflightContext) -> CheckOutcome:
    if cpu_engine(ctx):
        return _ok("gpu", f"not queried: {_CPU_ENGINE_NOTE}")
    p = ctx.settings.parallelism
    need = p.tensor_parallel_size * p.data_parallel_size_local
    try:
        found = ctx.gpus()
    except Exception as exc:
        return _fail("gpu", f"cannot query GPUs ({type(exc).__name__}: {exc}); the image's torch must see CUDA")
    if len(found) < need:
        return _fail("gpu", f"{len(found)} GPU(s) visible but this pod runs {p.data_parallel_size_local} DP rank(s)"
                     f" x tensorParallelSize {p.tensor_parallel_size} = {need}; request {need} nvidia.com/gpu and"
                     " check the NVIDIA device plugin and runtime class on this node")  # fmt: skip
    bad = [g for g in found[:need] if g.capability not in SUPPORTED_CAPABILITIES]
    if bad:
        archs = ", ".join(f"{a}.{b}" for a, b in sorted(SUPPORTED_CAPABILITIES))
        g = bad[0]
        return _fail("gpu", f"GPU {g.index} ({g.name}) has compute capability {g.capability[0]}.{g.capability[1]};"
                     f" this image supports {archs} (Hopper, Blackwell)."
                     " Schedule the role on H100/H200/B200 nodes")  # fmt: skip
    return _ok("gpu", f"{len(found)} GPU(s): {found[0].name} (sm_{found[0].capability[0]}{found[0].capability[1]})")


def compiled_ops(ctx: PreflightContext) -> CheckOutcome | None:
    if not ctx.settings.hisparse_on:
        return None
    if cpu_engine(ctx):
        try:  # what the CPU engine decodes with: the kernels' reference ops on the HiSparse path
            importlib.import_module("hisparse_kernels.tiny_dsa.engine")
        except Exception as exc:
            return _fail("compiled_ops", f"the CPU engine's HiSparse ops do not load ({type(exc).__name__}: {exc})")
        return _ok("compiled_ops", f"CUDA ops not needed ({_CPU_ENGINE_NOTE}); the kernels' CPU reference ops load")
    missing = []
    try:
        importlib.import_module("hisparse_kernels._C")
    except Exception as exc:
        missing.append(f"hisparse_kernels._C ({type(exc).__name__}: {exc})")
    try:
        import torch

        from hisparse_runtime.plugin.kernel_swap import VLLM_OPS_MODULE

        importlib.import_module(VLLM_OPS_MODULE)  # registers torch.ops._C_cache_ops (the wheel has no vllm._C)
        namespace = torch.ops._C_cache_ops
        missing += [f"torch.ops._C_cache_ops.{op}" for op in VLLM_HISPARSE_OPS if not hasattr(namespace, op)]
    except Exception as exc:
        missing.append(f"vLLM's compiled ops ({type(exc).__name__}: {exc})")
    if missing:
        return _fail("compiled_ops", "compiled ops are missing: " + "; ".join(missing) +
                     ". Use the hisparse runtime image built for this vLLM release (runtime/Dockerfile)")  # fmt: skip
    return _ok("compiled_ops", "vLLM HiSparse ops and hisparse_kernels._C load")


# --- host memory -------------------------------------------------------------------------------------


def host_placement(ctx: PreflightContext) -> CheckOutcome | None:
    """HISPARSE_HOST_PLACEMENT names a policy, and this vLLM has the host-pool hook it patches."""
    if not ctx.settings.hisparse_on:
        return None
    from hisparse_runtime.plugin.placement import ENV, hook_missing, policy_from_env

    try:
        policy = policy_from_env(ctx.env)
    except ValueError as exc:
        return _fail("host_placement", f"env {exc}; vLLM would start with its own host placement")
    if policy == "vllm":
        return _ok("host_placement", f"{ENV} unset or vllm: vLLM's own host-pool order")
    missing = hook_missing()
    if missing:
        return _fail("host_placement", f"{ENV}={policy} needs {missing}, which this vLLM lacks; use the hisparse"
                     f" runtime image built for vLLM 0.33 or unset {ENV}")  # fmt: skip
    return _ok("host_placement", f"{ENV}={policy}: vLLM's host-pool hook is present")


def memlock(ctx: PreflightContext) -> CheckOutcome | None:
    need_gib = pinned_host_gib(ctx.settings)
    if not need_gib:
        return None
    limit = facts.memlock_limit_bytes()
    if limit != facts.UNLIMITED and limit < need_gib * GIB and ctx.ipc_lock():
        return _ok("memlock", f"CAP_IPC_LOCK held: RLIMIT_MEMLOCK ({limit / GIB:.3g} GiB) does not bound the"
                   f" {need_gib:g} GiB this pod pins")  # fmt: skip
    if limit != facts.UNLIMITED and limit < need_gib * GIB:
        return _fail("memlock", f"RLIMIT_MEMLOCK is {limit / GIB:.3g} GiB but this pod pins {need_gib:g} GiB;"
                     " raise the container's memlock limit (containerd/CRI-O default_ulimits memlock=-1, or the"
                     " runtime class used for HiSparse pods), or keep engine.ipcLock on (CAP_IPC_LOCK)")  # fmt: skip
    shown = "unlimited" if limit == facts.UNLIMITED else f"{limit / GIB:g} GiB"
    return _ok("memlock", f"memlock {shown} >= {need_gib:g} GiB pinned")


def host_memory(ctx: PreflightContext) -> CheckOutcome | None:
    need_gib = host_memory_needed_gib(ctx.settings)
    if not need_gib:
        return None
    try:
        available = facts.mem_available_bytes(ctx.meminfo)
    except (OSError, ValueError) as exc:
        return _fail("host_memory", f"cannot read {ctx.meminfo}: {exc}")
    limit = facts.cgroup_memory_limit_bytes(ctx.cgroup_memory_max)
    usable = min(available, limit) if limit is not None else available
    source = "the container's memory limit" if limit is not None and limit < available else "MemAvailable"
    if usable < need_gib * GIB:
        return _fail("host_memory", f"{source} is {usable / GIB:.1f} GiB but the host pools of"
                     f" {ctx.settings.parallelism.data_parallel_size_local} DP rank(s) plus headroom need"
                     f" {need_gib:g} GiB; lower hisparse.hostPoolGiB, or schedule on a node with free memory")  # fmt: skip
    return _ok("host_memory", f"{usable / GIB:.1f} GiB usable >= {need_gib:g} GiB needed")


def shm(ctx: PreflightContext) -> CheckOutcome:
    try:
        size = facts.shm_size_bytes(ctx.shm)
    except OSError as exc:
        return _fail("shm", f"cannot stat {ctx.shm}: {exc}; mount a memory-backed emptyDir at /dev/shm")
    if size < ctx.min_shm_gib * GIB:
        return _fail("shm", f"{ctx.shm} is {size / GIB:.2f} GiB, below {ctx.min_shm_gib:g} GiB; mount a"
                     " memory-backed emptyDir at /dev/shm with a sizeLimit of at least that")  # fmt: skip
    return _ok("shm", f"{ctx.shm} is {size / GIB:.1f} GiB")


# --- NIXL ------------------------------------------------------------------------------------------------


def nixl_side_channel(ctx: PreflightContext) -> CheckOutcome | None:
    if not ctx.settings.disaggregated:
        return None
    host = ctx.env.get(E.VLLM_NIXL_SIDE_CHANNEL_HOST, "")
    if not host or host == "localhost" or host.startswith("127.") or host == "::1":
        return _fail("nixl_side_channel", f"{E.VLLM_NIXL_SIDE_CHANNEL_HOST}={host or '(unset)'}: peers cannot reach"
                     " a loopback side channel; set it from the downward API (fieldRef status.podIP)")  # fmt: skip
    pod_ip = ctx.env.get("POD_IP")
    if pod_ip and pod_ip != host:
        return _fail("nixl_side_channel", f"{E.VLLM_NIXL_SIDE_CHANNEL_HOST}={host} but the pod IP is {pod_ip};"
                     " set it from the downward API (fieldRef status.podIP)")  # fmt: skip
    if not facts.is_local_address(host):
        return _fail("nixl_side_channel", f"{E.VLLM_NIXL_SIDE_CHANNEL_HOST}={host} is not an address of this pod;"
                     " set it from the downward API (fieldRef status.podIP)")  # fmt: skip
    return _ok("nixl_side_channel", f"side channel host {host} is this pod's address")


_UNAVAILABLE = re.compile(r"transports? (.+?) (?:is|are) not available, please use one or more of: (.+)$", re.M)


def ucx_transports(ctx: PreflightContext) -> CheckOutcome | None:
    if not ctx.settings.disaggregated:
        return None
    tls = ctx.env.get(E.UCX_TLS) or ",".join(ctx.settings.kv_transfer.nixl.ucx_tls)
    env = {**ctx.env, E.UCX_TLS: tls, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    argv = [sys.executable, "-m", "hisparse_runtime", "nixl-check", "loopback", "--size-mib", "4", "--parts", "4",
            "--timeout", str(ctx.ucx_timeout_s / 2)]  # fmt: skip
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=ctx.ucx_timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return _fail("ucx_transports", f"the NIXL loopback check with UCX_TLS={tls} did not finish in"
                     f" {ctx.ucx_timeout_s:g}s")  # fmt: skip
    missing = _UNAVAILABLE.search(run.stderr) or _UNAVAILABLE.search(run.stdout)
    if missing:
        return _fail("ucx_transports", f"UCX_TLS={tls}: transports {missing.group(1)} are not available on this"
                     f" node (available: {missing.group(2).strip()}); fix nixl.ucxTls or the node's drivers")  # fmt: skip
    try:
        result = json.loads(next(line for line in reversed(run.stdout.splitlines()) if line.startswith("{")))
    except (StopIteration, ValueError):
        return _fail("ucx_transports", f"the NIXL loopback check crashed (exit {run.returncode}): {run.stderr[-500:]}")
    if not result.get("ok"):
        return _fail("ucx_transports", f"UCX_TLS={tls}: NIXL could not move bytes in-process: {result.get('error')}")
    return _ok("ucx_transports", f"UCX_TLS={tls}: NIXL moved {result['bytes_verified']} bytes in-process")


# --- MoE backend ---------------------------------------------------------------------------------------


def moe_backend(ctx: PreflightContext) -> CheckOutcome | None:
    """The render chose the MoE backend (and its activation-scale rounding) for the GPU family of the
    nodes the role is pinned to; re-check it against the GPU this pod got."""
    s = ctx.settings
    try:
        found = ctx.gpus()
    except Exception:
        found = []
    if not found:
        return None  # the gpu check reports it
    g = found[0]
    live = architecture_of_capability(*g.capability)
    sm = f"sm_{g.capability[0]}{g.capability[1]}"
    if live is None:
        return None  # the gpu check refuses an architecture the image does not support
    if s.gpu_architecture is not None and live != s.gpu_architecture:
        return _fail("moe_backend", f"the render assumed {s.gpu_architecture} GPUs (the role's nodeSelector), but GPU"
                     f" {g.index} ({g.name}, {sm}) is {live}: the MoE backend was chosen for the wrong GPUs; fix the"
                     " role's nodeSelector nvidia.com/gpu.product or the node's labels")  # fmt: skip
    problems = moe.problems(s, live)
    unsafe = moe.rendered_scale_problem(s, live, ctx.env)
    if unsafe:
        problems.append(unsafe)
    if problems:
        return _fail("moe_backend", f"on {g.name} ({live}): " + "; ".join(problems))
    backend = moe.moe_backend(s) or "vLLM's choice"
    e8m0 = ctx.env.get(moe.VLLM_USE_DEEP_GEMM_E8M0)
    rounding = f", {moe.VLLM_USE_DEEP_GEMM_E8M0}={e8m0}" if e8m0 is not None else ""
    return _ok("moe_backend", f"{live} ({sm}): moe backend {backend}{rounding}")


# --- decode kernels ------------------------------------------------------------------------------------


def decode_kernels(ctx: PreflightContext) -> CheckOutcome | None:
    """``HISPARSE_DECODE_KERNELS`` names kernels; with ``hisparse`` the project's are registered under vLLM's
    op names here, in-process, exactly as the vLLM plugin will, and one real call through vLLM's name must
    reach them and compute what the op specifies. The plugin does not stop vLLM when its install fails
    (vLLM's own ops then serve): this check is where that failure stops the pod."""
    if E.HISPARSE_DECODE_KERNELS not in ctx.env and not ctx.settings.hisparse_on:
        return None
    from hisparse_runtime.plugin import kernel_swap

    env = kernel_swap.ENV
    fix = "or set spec.decode.hisparse.kernels to vllm"
    try:
        choice = kernel_swap.choice_from_env(ctx.env)
    except ValueError as exc:
        return _fail("decode_kernels", f"env {exc}; set spec.decode.hisparse.kernels, which renders it")
    if choice == "vllm":
        return _ok("decode_kernels", f"{env} unset or vllm: vLLM's own ops serve decode's HiSparse ops")
    if cpu_engine(ctx):
        return _ok("decode_kernels", f"not installed: {_CPU_ENGINE_NOTE}; it decodes with the kernels' CPU reference")
    target = {"dispatch_key": "CUDA", **ctx.kernel_swap}
    if target["dispatch_key"] == "CUDA":
        try:
            found = ctx.gpus()
        except Exception as exc:
            return _fail("decode_kernels", f"{env}={choice}: the project's kernels need a CUDA GPU, and GPUs cannot be"
                         f" queried ({type(exc).__name__}: {exc}); the image's torch must see CUDA, {fix}")  # fmt: skip
        if not found:
            return _fail("decode_kernels", f"{env}={choice}: the project's kernels need a CUDA GPU, and this pod sees"
                         f" none; schedule decode on GPU nodes (nvidia.com/gpu), {fix}")  # fmt: skip
    try:
        swap = kernel_swap.install(choice, **target)
        proof = kernel_swap.verify(vllm_ns=target.get("vllm_ns", kernel_swap.VLLM_NAMESPACE),
                                   dispatch_key=target["dispatch_key"])  # fmt: skip
    except Exception as exc:  # KernelSwapError names the op, the argument and both sides
        return _fail("decode_kernels", f"{env}={choice}: the project's kernels cannot serve vLLM's HiSparse ops here:"
                     f" {exc}. The vLLM plugin would fall back to vLLM's own ops, and a fallback is never silent:"
                     f" use the runtime image whose kernels were built for this vLLM release, {fix}")  # fmt: skip
    return _ok("decode_kernels", f"{env}={choice}: the project's kernels serve {len(swap.ops)} of vLLM's HiSparse ops"
               f" ({swap.dispatch_key}); {proof.op} reached them and left the specified state")  # fmt: skip


# --- RDMA devices ----------------------------------------------------------------------------------------


def rdma_devices(ctx: PreflightContext) -> CheckOutcome | None:
    """The RDMA devices the role asked for are in the pod: at least ``rdma.count`` verbs devices when the role
    requests an RDMA device plugin's resource, and every device Mooncake's ``deviceName`` names (prefill
    with the store over RDMA). Without them UCX silently falls back to TCP, and Mooncake fails to open its
    device only once vLLM has loaded the model."""
    s = ctx.settings
    mooncake = s.kv_transfer.mooncake
    named = ([d.strip() for d in mooncake.device_name.split(",") if d.strip()]
             if s.mooncake_on and mooncake.protocol == "rdma" else [])
    if not s.rdma_devices and not named:
        return None
    visible = facts.rdma_verbs_devices(ctx.rdma_dev, ctx.sysfs)
    seen = ", ".join(f"{v} ({k})" if v else k for k, v in visible.items()) or "none"
    problems = []
    if len(visible) < s.rdma_devices:
        problems.append(
            f"spec.{s.role}.rdma asks for {s.rdma_devices} RDMA device(s) per pod, but the pod sees {len(visible)} "
            f"verbs device(s) in {ctx.rdma_dev} ({seen}): the device plugin did not give this pod its devices, and "
            "NIXL's UCX would fall back to TCP while DeepEP and Mooncake over RDMA fail; check that rdma.resourceName "
            "is the resource the plugin advertises (kubectl describe node: Allocatable) and its device selector covers "
            "this node's HCAs")
    names = {v for v in visible.values() if v}
    missing = [d for d in named if d not in names]
    if missing:
        problems.append(
            f"spec.kvTransfer.mooncake.deviceName names {', '.join(missing)}, but the RDMA devices this pod can open "
            f"are: {', '.join(sorted(names)) or 'none'} ({ctx.rdma_dev}/uverbs* -> "
            f"{ctx.sysfs}/class/infiniband_verbs/*/ibdev): Mooncake's transfer engine could not open it; name devices "
            "the pod is given (request them with spec.prefill.rdma), or leave deviceName empty to let Mooncake choose")
    if problems:
        return _fail("rdma_devices", "; ".join(problems))
    return _ok("rdma_devices", f"RDMA verbs devices visible: {seen}")


CHECKS: tuple[Callable[[PreflightContext], CheckOutcome | None], ...] = (
    engine_rules, model_config, gpu, compiled_ops, memlock, host_memory, shm, nixl_side_channel, ucx_transports,
    host_placement, moe_backend, model_cache, decode_kernels, rdma_devices,
)
"""In exit-code order; all run, so one start reports every problem at once."""
