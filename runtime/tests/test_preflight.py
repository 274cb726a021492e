"""Preflight checks against real files, limits, sockets, UCX and the engine's own validators.

Node facts a test cannot create (GPUs of a given architecture, a node's /proc/meminfo and cgroup
limit) are fed in through the context; each such place says so.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
from pathlib import Path

import pytest
from rtsupport import child_env, cli

from hisparse_runtime.engine import HiSparseSettings, ModelSettings, ParallelSettings, RoleSettings
from hisparse_runtime.preflight import EXIT_CODES, GpuFact, PreflightContext, checks, exit_code, run_preflight
from hisparse_runtime.preflight_report import read_report

GIB = 1 << 30
H200 = GpuFact(0, "NVIDIA H200", (9, 0))


def decode(pool_gib: float = 96, dp_local: int = 8, **overrides) -> RoleSettings:
    base = dict(
        role="decode",
        model=ModelSettings(source="pvc://models/glm-5.2", served_model_name="glm", index_topk=2048, index_topk_freq=4,
                            indexer_types=["full", "shared", "shared", "shared"]),  # fmt: skip
        image="img",
        parallelism=ParallelSettings(gpus_per_node=8, data_parallel_size=dp_local, data_parallel_size_local=dp_local,
                                     enable_expert_parallel=True),  # fmt: skip
        hisparse=HiSparseSettings(host_pool_gib=pool_gib),
        memory_request_gib=pool_gib * dp_local + 64,
    )
    base.update(overrides)
    return RoleSettings(**base)


def model_dir(tmp_path: Path, **config: object) -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    base = {"model_type": "glm_moe_dsa", "index_topk": 2048, "index_topk_freq": 4,
            "indexer_types": ["full", "shared", "shared", "shared"]}  # fmt: skip
    base.update(config)
    (d / "config.json").write_text(json.dumps({k: v for k, v in base.items() if v is not None}))
    return d


def meminfo(tmp_path: Path, available_gib: float) -> Path:
    # Node fact: a meminfo-format file standing in for a large node's /proc/meminfo.
    p = tmp_path / "meminfo"
    p.write_text(f"MemTotal:       {int(2048 * GIB / 1024)} kB\nMemFree:        1024 kB\n"
                 f"MemAvailable:   {int(available_gib * GIB / 1024)} kB\n")  # fmt: skip
    return p


def local_ipv4() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # UDP connect sends nothing; it picks the outgoing address
        except OSError:
            pytest.skip("no non-loopback IPv4 route on this machine")
        return s.getsockname()[0]


def ctx(settings: RoleSettings, tmp_path: Path, **kw) -> PreflightContext:
    if "model_dir" not in kw:
        kw["model_dir"] = model_dir(tmp_path)
    return PreflightContext(settings=settings, env=kw.pop("env", {}), **kw)


# --- one check at a time ---------------------------------------------------------------------------


def test_engine_rules_reuse_the_engine_validators(tmp_path: Path) -> None:
    outcome = checks.engine_rules(ctx(decode(memory_request_gib=100), tmp_path))
    assert not outcome.ok and outcome.exit_code == EXIT_CODES["engine_rules"]
    assert "resources.requests.memory" in outcome.message and "host-pool-fits-request" in outcome.message
    assert checks.engine_rules(ctx(decode(), tmp_path)).ok


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (dict(index_topk=None), "no index_topk"),
        (dict(index_topk=1024), "set indexTopk to 1024"),
        (dict(index_topk_freq=None), "index_topk_freq is 1"),
        (dict(indexer_types=["full", "full", "shared", "shared"]), "at layer 1"),
        (dict(indexer_types=None), "model.indexerTypes declares them but config.json has none"),
    ],
)
def test_model_config_must_match_the_declared_dsa_facts(tmp_path: Path, config: dict, needle: str) -> None:
    outcome = checks.model_config(ctx(decode(), tmp_path, model_dir=model_dir(tmp_path, **config)))
    assert outcome is not None and not outcome.ok and outcome.exit_code == EXIT_CODES["model_config"]
    assert needle in outcome.message


def test_model_config_that_matches_passes_and_a_missing_one_is_named(tmp_path: Path) -> None:
    assert checks.model_config(ctx(decode(), tmp_path)).ok  # type: ignore[union-attr]
    missing = checks.model_config(ctx(decode(), tmp_path, model_dir=tmp_path / "nowhere"))
    assert missing is not None and not missing.ok and "nowhere/config.json does not exist" in missing.message


def test_gpu_check_on_this_machine_reports_what_it_sees(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    outcome = checks.gpu(ctx(decode(), tmp_path))
    found = len(checks.facts.detect_gpus())
    assert outcome.ok is False  # 8 DP ranks need 8 GPUs; no test machine here has them
    assert f"{found} GPU(s) visible" in outcome.message and "= 8" in outcome.message


def test_gpu_architecture_must_be_hopper_or_blackwell(tmp_path: Path) -> None:
    # Node fact: GPUs cannot be created here, so the GPU list is given.
    hopper = ctx(decode(), tmp_path, gpus=lambda: [GpuFact(i, "NVIDIA H200", (9, 0)) for i in range(8)])
    assert checks.gpu(hopper).ok
    ampere = ctx(decode(), tmp_path, gpus=lambda: [GpuFact(i, "NVIDIA A100", (8, 0)) for i in range(8)])
    outcome = checks.gpu(ampere)
    assert not outcome.ok and "8.0" in outcome.message and "A100" in outcome.message


B200 = [GpuFact(i, "NVIDIA B200", (10, 0)) for i in range(8)]
GLM_ARCH = "GlmMoeDsaForCausalLM"


def glm(**overrides) -> RoleSettings:
    model = ModelSettings(source="pvc://models/glm-5.2", served_model_name="glm", index_topk=2048, index_topk_freq=4,
                          indexer_types=["full", "shared", "shared", "shared"], architecture=GLM_ARCH)  # fmt: skip
    return decode(model=model, **overrides)


def test_moe_backend_rendered_for_blackwell_holds_on_a_blackwell_gpu(tmp_path: Path) -> None:
    # Node fact: the GPU list is given (no Blackwell GPU here).
    outcome = checks.moe_backend(ctx(glm(gpu_architecture="blackwell"), tmp_path, gpus=lambda: B200,
                                     env={"VLLM_USE_DEEP_GEMM_E8M0": "0"}))
    assert outcome is not None and outcome.ok, outcome
    assert "flashinfer_trtllm" in outcome.message and "VLLM_USE_DEEP_GEMM_E8M0=0" in outcome.message


@pytest.mark.parametrize(
    ("settings", "gpus", "env", "needle"),
    [
        (glm(gpu_architecture="blackwell"), [H200] * 8, {}, "assumed blackwell"),  # pinned to B200, got an H200
        (glm(), B200, {}, "does not pin a GPU family"),  # unpinned GLM landed on Blackwell
        (glm(moe_backend="triton"), B200, {}, "VLLM_USE_DEEP_GEMM_E8M0 unset (vLLM's default 1)"),  # named, not pinned
        (glm(gpu_architecture="blackwell"), B200, {"VLLM_USE_DEEP_GEMM_E8M0": "1"}, "changed outside the operator"),
        (glm(moe_backend="hpc"), B200, {}, "runs only on hopper"),
    ],
)
def test_moe_backend_is_refused_on_the_live_gpu(tmp_path: Path, settings: RoleSettings, gpus: list, env: dict, needle: str) -> None:
    outcome = checks.moe_backend(ctx(settings, tmp_path, gpus=lambda: gpus, env=env))
    assert outcome is not None and not outcome.ok and outcome.exit_code == EXIT_CODES["moe_backend"]
    assert needle in outcome.message, outcome.message


def test_model_architecture_is_checked_against_config_json(tmp_path: Path) -> None:
    wrong = checks.model_config(ctx(glm(), tmp_path, model_dir=model_dir(tmp_path, architectures=["DeepseekV32ForCausalLM"])))
    assert wrong is not None and not wrong.ok and "set it to DeepseekV32ForCausalLM" in wrong.message
    undeclared = checks.model_config(ctx(decode(), tmp_path, model_dir=model_dir(tmp_path, architectures=[GLM_ARCH]), gpus=lambda: B200))
    assert undeclared is not None and not undeclared.ok and "model.architecture is unset" in undeclared.message
    on_hopper = checks.model_config(ctx(decode(), tmp_path, model_dir=model_dir(tmp_path, architectures=[GLM_ARCH]), gpus=lambda: [H200]))
    assert on_hopper is not None and on_hopper.ok, on_hopper  # the backend choice does not depend on it there
    right = checks.model_config(ctx(glm(), tmp_path, model_dir=model_dir(tmp_path, architectures=[GLM_ARCH])))
    assert right is not None and right.ok, right


def test_compiled_ops_missing_from_a_source_tree_are_named(tmp_path: Path) -> None:
    outcome = checks.compiled_ops(ctx(decode(), tmp_path))
    assert outcome is not None and not outcome.ok and outcome.exit_code == EXIT_CODES["compiled_ops"]
    assert "hisparse_kernels._C" in outcome.message and "runtime/Dockerfile" in outcome.message
    assert checks.compiled_ops(ctx(decode(hisparse=None, memory_request_gib=None), tmp_path)) is None


CPU_ENGINE = {"HISPARSE_SERVING_ENGINE": "cpu"}


def test_gpu_checks_report_the_cpu_engine_instead_of_failing(tmp_path: Path) -> None:
    def no_query() -> list:
        raise AssertionError("the CPU engine's pod must not query GPUs")

    cpu = ctx(decode(), tmp_path, env=CPU_ENGINE, gpus=no_query)
    outcome = checks.gpu(cpu)
    assert outcome.ok and "CPU engine" in outcome.message and "not queried" in outcome.message
    ops = checks.compiled_ops(cpu)
    assert ops is not None and ops.ok and "CPU reference ops load" in ops.message, ops
    # vLLM's own engine name keeps the real checks: 8 ranks on no GPU fail.
    assert not checks.gpu(ctx(decode(), tmp_path, env={"HISPARSE_SERVING_ENGINE": "vllm"}, gpus=lambda: [])).ok


def test_host_memory_headroom_is_the_roles_setting(tmp_path: Path) -> None:
    one_gpu = ParallelSettings(gpus_per_node=1)
    small = decode(pool_gib=1, dp_local=1, host_memory_headroom_gib=2, memory_request_gib=3, parallelism=one_gpu)
    assert checks.engine_rules(ctx(small, tmp_path)).ok
    fits = checks.host_memory(ctx(small, tmp_path, meminfo=meminfo(tmp_path, 3.5), cgroup_memory_max=tmp_path / "absent"))
    assert fits is not None and fits.ok and "3 GiB needed" in fits.message, fits
    short = decode(pool_gib=1, dp_local=1, host_memory_headroom_gib=2, memory_request_gib=2.5, parallelism=one_gpu)
    refused = checks.engine_rules(ctx(short, tmp_path))
    assert not refused.ok and "2 GiB headroom (hostMemoryHeadroomGiB) = 3 GiB" in refused.message, refused.message


def test_memlock_limit_against_pinned_pools(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (4 << 20, hard))  # a real, lowered limit for this process
    try:
        # Node fact: whether the container holds CAP_IPC_LOCK is given (the test process may run as root).
        too_much = checks.memlock(ctx(decode(pool_gib=1, dp_local=1), tmp_path, ipc_lock=lambda: False))
        fits = checks.memlock(ctx(decode(pool_gib=2 / 1024, dp_local=1), tmp_path, ipc_lock=lambda: False))  # 2 MiB
        locked = checks.memlock(ctx(decode(pool_gib=1, dp_local=1), tmp_path, ipc_lock=lambda: True))
    finally:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, hard))
    assert too_much is not None and not too_much.ok and "pins 1 GiB" in too_much.message
    assert "engine.ipcLock" in too_much.message
    assert fits is not None and fits.ok
    assert locked is not None and locked.ok and "CAP_IPC_LOCK held" in locked.message, locked


def test_cap_ipc_lock_is_read_from_the_effective_set(tmp_path: Path) -> None:
    from hisparse_runtime.preflight import facts

    status = tmp_path / "status"
    status.write_text("Name:\tpython3\nCapPrm:\t0000000000004000\nCapEff:\t0000000000000000\n")
    assert not facts.holds_capability(facts.CAP_IPC_LOCK, status)  # permitted is not effective
    status.write_text("Name:\tpython3\nCapEff:\t000001fffeffffff\n")
    assert facts.holds_capability(facts.CAP_IPC_LOCK, status)
    assert not facts.holds_capability(24, status)  # CAP_SYS_RESOURCE is not in that set


def test_host_memory_for_local_dp_ranks_plus_headroom(tmp_path: Path) -> None:
    s = decode(pool_gib=96, dp_local=8)  # 768 GiB pinned + 64 GiB headroom = 832 GiB
    roomy = ctx(s, tmp_path, meminfo=meminfo(tmp_path, 900), cgroup_memory_max=tmp_path / "absent")
    assert checks.host_memory(roomy).ok  # type: ignore[union-attr]
    short = checks.host_memory(ctx(s, tmp_path, meminfo=meminfo(tmp_path, 800)))
    assert short is not None and not short.ok and "832 GiB" in short.message and "8 DP rank(s)" in short.message
    # Node fact: a container limit below MemAvailable is the binding one.
    limit = tmp_path / "memory.max"
    limit.write_text(str(500 * GIB))
    capped = checks.host_memory(ctx(s, tmp_path, meminfo=meminfo(tmp_path, 900), cgroup_memory_max=limit))
    assert capped is not None and not capped.ok and "container's memory limit is 500.0 GiB" in capped.message
    limit.write_text("max\n")
    assert checks.host_memory(ctx(s, tmp_path, meminfo=meminfo(tmp_path, 900), cgroup_memory_max=limit)).ok  # type: ignore[union-attr]


def test_shm_size_is_measured_on_the_real_mount(tmp_path: Path) -> None:
    shm = Path("/dev/shm") if Path("/dev/shm").exists() else tmp_path
    assert checks.shm(ctx(decode(), tmp_path, shm=shm, min_shm_gib=0.001)).ok
    small = checks.shm(ctx(decode(), tmp_path, shm=shm, min_shm_gib=1 << 30))
    assert not small.ok and "emptyDir" in small.message and small.exit_code == EXIT_CODES["shm"]


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({}, "(unset)"),
        ({"VLLM_NIXL_SIDE_CHANNEL_HOST": "localhost"}, "loopback"),
        ({"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}, "loopback"),
        ({"VLLM_NIXL_SIDE_CHANNEL_HOST": "198.51.100.7"}, "not an address of this pod"),
    ],
)
def test_side_channel_host_must_be_the_pod_ip(tmp_path: Path, env: dict, needle: str) -> None:
    outcome = checks.nixl_side_channel(ctx(decode(), tmp_path, env=env))
    assert outcome is not None and not outcome.ok and needle in outcome.message


def test_side_channel_host_that_is_this_pods_address_passes(tmp_path: Path) -> None:
    ip = local_ipv4()
    assert checks.nixl_side_channel(ctx(decode(), tmp_path, env={"VLLM_NIXL_SIDE_CHANNEL_HOST": ip, "POD_IP": ip})).ok  # type: ignore[union-attr]
    other = checks.nixl_side_channel(ctx(decode(), tmp_path, env={"VLLM_NIXL_SIDE_CHANNEL_HOST": ip, "POD_IP": "10.9.9.9"}))
    assert other is not None and not other.ok and "10.9.9.9" in other.message
    assert checks.nixl_side_channel(ctx(decode(disaggregated=False), tmp_path)) is None


def test_ucx_transports_through_a_real_nixl_loopback(tmp_path: Path) -> None:
    pytest.importorskip("nixl_cu12", reason="NIXL is not installed")
    env = child_env()
    tcp = checks.ucx_transports(ctx(decode(), tmp_path, env={**env, "UCX_TLS": "tcp"}))
    assert tcp is not None and tcp.ok, tcp
    cuda = checks.ucx_transports(ctx(decode(), tmp_path, env={**env, "UCX_TLS": "cuda_ipc,cuda_copy,tcp"}))
    assert cuda is not None and not cuda.ok and "cuda_ipc" in cuda.message and "available:" in cuda.message


# --- all together ----------------------------------------------------------------------------------


def test_report_lists_every_applicable_check_and_exits_with_the_first_failure(tmp_path: Path) -> None:
    prefill = decode(role="prefill", hisparse=None, memory_request_gib=None, parallelism=ParallelSettings(gpus_per_node=1))
    env = {**child_env(), "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "UCX_TLS": "tcp"}
    report = run_preflight(ctx(prefill, tmp_path, shm=tmp_path, min_shm_gib=0.0, gpus=lambda: [H200], env=env))
    names = [c.name for c in report.checks]
    assert names == ["engine_rules", "model_config", "gpu", "shm", "nixl_side_channel", "ucx_transports", "moe_backend"], names
    assert exit_code(report) == EXIT_CODES["nixl_side_channel"]


def test_command_writes_the_report_and_uses_distinct_exit_codes(tmp_path: Path) -> None:
    settings = tmp_path / "decode.json"
    settings.write_text(json.dumps(decode(memory_request_gib=100).to_json_dict()))
    report_path = tmp_path / "report" / "preflight.json"
    run = subprocess.run(cli("preflight", "--role", "decode", "--config", str(settings), "--model-dir",
                             str(model_dir(tmp_path)), "--report", str(report_path)),
                         capture_output=True, text=True, timeout=180, env=child_env())  # fmt: skip
    assert run.returncode == EXIT_CODES["engine_rules"], run.stderr[-2000:]
    report = read_report(report_path)
    assert report is not None and json.loads(run.stdout)["checks"][0]["name"] == "engine_rules"
    assert {c.exit_code for c in report.checks if not c.ok} >= {30, 32}, "GPU absence is reported too"
    argv = cli("preflight", "--role", "prefill", "--config", str(settings), "--report", str(report_path))
    wrong_role = subprocess.run(argv,
                                capture_output=True, text=True, timeout=60, env=child_env())  # fmt: skip
    assert wrong_role.returncode == EXIT_CODES["engine_rules"] and "not prefill" in wrong_role.stdout


def test_host_placement_policy_is_named_and_its_vllm_hook_checked(tmp_path: Path) -> None:
    assert checks.host_placement(ctx(decode(hisparse=None, memory_request_gib=None), tmp_path)) is None
    stock = checks.host_placement(ctx(decode(), tmp_path))
    assert stock is not None and stock.ok and "vLLM's own" in stock.message
    bad = checks.host_placement(ctx(decode(), tmp_path, env={"HISPARSE_HOST_PLACEMENT": "tight"}))
    assert bad is not None and not bad.ok and bad.exit_code == EXIT_CODES["host_placement"]
    assert "HISPARSE_HOST_PLACEMENT='tight'" in bad.message and "pack, vllm" in bad.message
    pytest.importorskip("vllm", reason="vLLM 0.33.0 is not installed in this environment")
    pack = checks.host_placement(ctx(decode(), tmp_path, env={"HISPARSE_HOST_PLACEMENT": "pack"}))
    assert pack is not None and pack.ok, pack.message


def test_a_cached_model_must_carry_the_marker_of_the_declared_revision(tmp_path: Path) -> None:
    from hisparse_runtime.engine import MODEL_MARKER_FILE, ModelCacheSettings
    from hisparse_runtime.fetch_model import ModelMarker

    model = ModelSettings(source="hf://zai-org/GLM-5.2-FP8", revision="9f3c2a1e", size_gib=1, cache=ModelCacheSettings(),
                          served_model_name="glm", index_topk=2048, index_topk_freq=4,
                          indexer_types=["full", "shared", "shared", "shared"])  # fmt: skip
    settings = decode(model=model)
    assert model.vllm_model_arg == "/model-cache/hf/zai-org/GLM-5.2-FP8/9f3c2a1e"
    assert checks.model_cache(ctx(decode(), tmp_path)) is None, "pvc:// is mounted as it is"
    d = model_dir(tmp_path)
    unfilled = checks.model_cache(ctx(settings, tmp_path, model_dir=d))
    assert unfilled is not None and not unfilled.ok and unfilled.exit_code == EXIT_CODES["model_cache"]
    assert "was not filled" in unfilled.message and "ModelReady" in unfilled.message

    def mark(revision: str) -> None:
        marker = ModelMarker(source=model.source, revision=revision, commit="c" * 40,
                             files={"config.json": (d / "config.json").stat().st_size})
        (d / MODEL_MARKER_FILE).write_text(marker.model_dump_json())

    mark("0ld")
    other = checks.model_cache(ctx(settings, tmp_path, model_dir=d))
    assert other is not None and not other.ok and "at revision 0ld" in other.message and "9f3c2a1e" in other.message
    mark("9f3c2a1e")
    filled = checks.model_cache(ctx(settings, tmp_path, model_dir=d))
    assert filled is not None and filled.ok and "commit " + "c" * 40 in filled.message, filled.message
    # The sparse facts are then read from the cached config.json.
    facts = checks.model_config(ctx(settings, tmp_path, model_dir=model_dir(tmp_path, index_topk=1024)))
    assert facts is not None and not facts.ok and "index_topk is 1024" in facts.message


def test_decode_kernels_default_to_vllms_own_ops(tmp_path: Path) -> None:
    assert checks.decode_kernels(ctx(decode(hisparse=None, memory_request_gib=None), tmp_path)) is None
    for env in ({}, {"HISPARSE_DECODE_KERNELS": "vllm"}):
        stock = checks.decode_kernels(ctx(decode(), tmp_path, env=env))
        assert stock is not None and stock.ok and "vLLM's own ops" in stock.message, stock


def test_decode_kernels_refuse_an_unknown_choice_and_a_pod_without_a_gpu(tmp_path: Path) -> None:
    bad = checks.decode_kernels(ctx(decode(), tmp_path, env={"HISPARSE_DECODE_KERNELS": "triton"}))
    assert bad is not None and not bad.ok and bad.exit_code == EXIT_CODES["decode_kernels"]
    assert "HISPARSE_DECODE_KERNELS='triton'" in bad.message and "vllm, hisparse" in bad.message
    ours = {"HISPARSE_DECODE_KERNELS": "hisparse"}
    no_gpu = checks.decode_kernels(ctx(decode(), tmp_path, env=ours, gpus=lambda: []))
    assert no_gpu is not None and not no_gpu.ok and no_gpu.exit_code == EXIT_CODES["decode_kernels"]
    assert "need a CUDA GPU" in no_gpu.message and "spec.decode.hisparse.kernels to vllm" in no_gpu.message
    cpu = checks.decode_kernels(ctx(decode(), tmp_path, env={**ours, **CPU_ENGINE}, gpus=lambda: []))
    assert cpu is not None and cpu.ok and "CPU engine" in cpu.message, cpu


def test_decode_kernels_are_installed_and_proven_in_process(tmp_path: Path) -> None:
    """The whole check on CPU: vLLM's ops and ours stand in as test namespaces with the real schemas
    (``swapsupport``); preflight installs ours under vLLM's names and one call proves it."""
    pytest.importorskip("vllm", reason="vLLM 0.33.0 is not installed in this environment")
    from swapsupport import OURS_NS, UNWRITTEN_NS, VLLM_NS, standins

    from hisparse_runtime.plugin import kernel_swap

    standins()
    ours = {"HISPARSE_DECODE_KERNELS": "hisparse"}
    try:
        broken = checks.decode_kernels(ctx(decode(), tmp_path, env=ours, kernel_swap={
            "vllm_ns": VLLM_NS, "ours_ns": UNWRITTEN_NS, "dispatch_key": "CPU"}))
        assert broken is not None and not broken.ok and broken.exit_code == EXIT_CODES["decode_kernels"]
        assert "argument 0 'device_global_indices'" in broken.message and "never silent" in broken.message, broken
        proven = checks.decode_kernels(ctx(decode(), tmp_path, env=ours, gpus=lambda: [], kernel_swap={
            "vllm_ns": VLLM_NS, "ours_ns": OURS_NS, "dispatch_key": "CPU"}))
        assert proven is not None and proven.ok, proven
        assert "serve 4 of vLLM's HiSparse ops (CPU)" in proven.message
        assert f"{VLLM_NS}::hisparse_invalidate_written_slots reached them" in proven.message
    finally:
        kernel_swap.install("vllm", vllm_ns=VLLM_NS, dispatch_key="CPU")
