"""CPU KV offload composition and sizing, GPU families from node labels, the MoE backend default and
its scale-format environment, routed experts where vLLM allows them."""

from __future__ import annotations

import pytest
from hisparse_runtime.engine import (
    CpuOffloadSettings,
    HiSparseSettings,
    ModelSettings,
    ParallelSettings,
    RoleSettings,
    architecture_of_capability,
    architecture_of_labels,
    check_role,
    host_memory_needed_gib,
    kv_transfer_config,
    moe,
    pinned_host_gib,
    render_argv,
    render_env,
)
from hisparse_runtime.engine.connectors import connector_names

DSV32 = ModelSettings(source="hf://deepseek-ai/DeepSeek-V3.2", served_model_name="ds", index_topk=2048)
GLM = ModelSettings(source="hf://zai-org/GLM-5", served_model_name="glm", index_topk=2048, architecture="GlmMoeDsaForCausalLM")
LAYOUT = ParallelSettings(gpus_per_node=8, data_parallel_size=8, data_parallel_size_local=8, enable_expert_parallel=True)


def role(**overrides) -> RoleSettings:
    base = dict(role="prefill", model=DSV32, image="img", parallelism=LAYOUT)
    base.update(overrides)
    return RoleSettings(**base)


@pytest.mark.parametrize(
    ("labels", "arch"),
    [
        ({"nvidia.com/gpu.product": "NVIDIA-H200"}, "hopper"),
        ({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "hopper"),
        ({"nvidia.com/gpu.product": "NVIDIA-GH200-480GB"}, "hopper"),
        ({"nvidia.com/gpu.product": "NVIDIA-B200"}, "blackwell"),
        ({"nvidia.com/gpu.product": "NVIDIA-GB200"}, "blackwell"),
        ({"nvidia.com/gpu.product": "NVIDIA-B300-SXM6-AC"}, "blackwell"),
        ({"nvidia.com/gpu.product": "NVIDIA-B200-SHARED"}, "blackwell"),
        ({"nvidia.com/gpu.product": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"}, "blackwell-sm120"),
        ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, "ampere"),
        ({"nvidia.com/gpu.product": "NVIDIA-L40S"}, "ada"),
        ({"nvidia.com/gpu.product": "Tesla-V100"}, None),
        ({"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.compute.major": "10", "nvidia.com/gpu.compute.minor": "0"}, "blackwell"),
        ({}, None),
    ],
)
def test_gpu_family_from_gfd_labels(labels, arch):
    assert architecture_of_labels(labels) == arch


def test_gpu_family_from_capability():
    assert [architecture_of_capability(*c) for c in [(9, 0), (10, 0), (10, 3), (12, 0), (8, 9), (8, 0), (7, 0)]] == [
        "hopper", "blackwell", "blackwell", "blackwell-sm120", "ada", "ampere", None]


def test_prefill_composes_nixl_with_cpu_offload():
    s = role(cpu_offload=CpuOffloadSettings(size_gib=100))
    config = kv_transfer_config(s)
    assert config["kv_connector"] == "MultiConnector" and config["kv_role"] == "kv_producer"
    nixl, offload = config["kv_connector_extra_config"]["connectors"]
    assert nixl == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    assert offload == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "CPUOffloadingSpec", "cpu_bytes_to_use": 100 * 2**30, "eviction_policy": "lru"}}


def test_prefill_with_offload_and_mooncake_keeps_the_local_tier_first():
    from hisparse_runtime.engine import KVTransferSettings, MooncakeStoreSettings

    s = role(cpu_offload=CpuOffloadSettings(size_gib=8), kv_transfer=KVTransferSettings(mooncake=MooncakeStoreSettings(enabled=True)))
    assert connector_names(kv_transfer_config(s)) == ["NixlConnector", "OffloadingConnector", "MooncakeStoreConnector"]


def test_decode_only_offload_is_the_connector_itself():
    s = role(role="decode", disaggregated=False, cpu_offload=CpuOffloadSettings(size_gib=8))
    assert kv_transfer_config(s)["kv_connector"] == "OffloadingConnector"


def test_offload_counts_in_the_host_pool_rule():
    s = role(cpu_offload=CpuOffloadSettings(size_gib=100))
    assert host_memory_needed_gib(s) == 8 * 100 + 64
    assert pinned_host_gib(s) == 800
    [v] = [v for v in check_role(s) if v.rule == "host-pool-fits-request"]
    assert "8 DP ranks x cpuOffload.sizeGiB 100 = 800 GiB pinned + 64 GiB headroom (hostMemoryHeadroomGiB) = 864 GiB" in v.message
    assert check_role(s.model_copy(update={"memory_request_gib": 864})) == []


def test_decode_offload_and_host_pool_add_up():
    s = role(role="decode", disaggregated=False, hisparse=HiSparseSettings(host_pool_gib=96), cpu_offload=CpuOffloadSettings(size_gib=10))
    assert host_memory_needed_gib(s) == 8 * 106 + 64


def test_moe_default_follows_architecture_and_model():
    assert moe.moe_backend(role(model=GLM, gpu_architecture="blackwell")) == "flashinfer_trtllm"
    assert moe.moe_backend(role(model=GLM, gpu_architecture="blackwell-sm120")) == "triton"
    assert moe.moe_backend(role(model=GLM, gpu_architecture="hopper")) is None  # vLLM chooses
    assert moe.moe_backend(role(model=DSV32, gpu_architecture="blackwell")) is None
    online = role(model=DSV32, gpu_architecture="blackwell", extra_args=["--quantization", "fp8"])
    assert moe.scale_sensitive(online) == "online quantization (--quantization fp8)"
    assert moe.moe_backend(online) == "flashinfer_trtllm"
    assert moe.online_quantization(role(extra_args=["-q=fp8"])) == "fp8"
    assert moe.moe_backend(role(model=GLM, gpu_architecture="blackwell", moe_backend="deep_gemm")) == "deep_gemm"


def test_scale_rounding_follows_the_rendered_backend():
    derived = role(model=GLM, gpu_architecture="blackwell")
    argv = render_argv(derived)
    assert argv[argv.index("--moe-backend") + 1] == "flashinfer_trtllm"
    assert {"name": "VLLM_USE_DEEP_GEMM_E8M0", "value": "0"} in render_env(derived)
    override = role(model=GLM, gpu_architecture="blackwell", moe_backend="deep_gemm")
    assert {"name": "VLLM_USE_DEEP_GEMM_E8M0", "value": "1"} in render_env(override)
    hopper = role(model=GLM, gpu_architecture="hopper")
    assert "--moe-backend" not in render_argv(hopper)
    assert all(e["name"] != "VLLM_USE_DEEP_GEMM_E8M0" for e in render_env(hopper))
    agreeing = role(model=GLM, gpu_architecture="blackwell", extra_env={"VLLM_USE_DEEP_GEMM_E8M0": "0"})
    assert [e["name"] for e in render_env(agreeing)].count("VLLM_USE_DEEP_GEMM_E8M0") == 1


def test_live_architecture_can_differ_from_the_render():
    """Preflight re-runs the MoE rule with the live GPU's family: an unpinned GLM role that lands on
    Blackwell has no named backend and is refused there, though it passed on an unknown family."""
    s = role(model=GLM)
    assert moe.problems(s) == []
    assert moe.scale_hazard(s, "blackwell") and moe.moe_backend(s, "blackwell") == "flashinfer_trtllm"


def test_routed_experts_where_vllm_allows_them():
    decode_only = role(role="decode", disaggregated=False, routed_experts=True, cpu_offload=CpuOffloadSettings(size_gib=8),
                       memory_request_gib=200)
    assert check_role(decode_only) == []
    assert "--enable-return-routed-experts" in render_argv(decode_only)
    [v] = [v for v in check_role(role(routed_experts=True)) if v.rule == "routed-experts-pd"]
    assert "NixlConnector" in v.message and "decode-only deployment" in v.message and "cpuOffload" in v.message
