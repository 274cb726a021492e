"""Each engine rule refuses what it must and accepts what it must, naming the field to change."""

from __future__ import annotations

import pytest
from hisparse_runtime.engine import (
    RULES,
    HiSparseSettings,
    KVTransferSettings,
    ModelSettings,
    NixlSettings,
    ParallelSettings,
    RoleSettings,
    check_host_pool_fits_nodes,
    check_role,
    termination_grace_seconds,
)
from hisparse_runtime.engine import effective, vllm_options
from hisparse_runtime.engine.cache import EngineOptions
from hisparse_runtime.engine.cpu_offload import CpuOffloadSettings

GLM = ModelSettings(source="hf://zai-org/GLM-5", served_model_name="glm", index_topk=2048, architecture="GlmMoeDsaForCausalLM")


def decode(**overrides) -> RoleSettings:
    """A valid single-node HiSparse decode engine (DP8 x TP1, 96 GiB per rank)."""
    base = dict(
        role="decode",
        model=ModelSettings(source="hf://deepseek-ai/DeepSeek-V3.2", served_model_name="ds", index_topk=2048),
        image="img",
        parallelism=ParallelSettings(gpus_per_node=8, data_parallel_size=8, data_parallel_size_local=8, enable_expert_parallel=True),
        hisparse=HiSparseSettings(host_pool_gib=96),
        memory_request_gib=900,
    )
    base.update(overrides)
    return RoleSettings(**base)


def rules_hit(s: RoleSettings) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for v in check_role(s):
        out.setdefault(v.rule, []).append(v.dotted)
    return out


def test_baseline_is_valid():
    assert check_role(decode()) == []


@pytest.mark.parametrize(
    ("overrides", "rule", "path"),
    [
        (dict(model=ModelSettings(source="hf://a/b", served_model_name="x")), "dsa-index-topk", "model.indexTopk"),
        (dict(speculative_config={"method": "mtp"}), "no-speculative-decoding", "speculativeConfig"),
        (dict(enable_dbo=True), "no-dbo", "enableDbo"),
        (dict(compilation_config={"cudagraph_mode": "full"}), "cudagraph-mode", "compilationConfig.cudagraph_mode"),
        (dict(compilation_config={"cudagraph_mode": 2}), "cudagraph-mode", "compilationConfig.cudagraph_mode"),
        (dict(hisparse=HiSparseSettings(host_pool_gib=96, device_buffer_size=2047)), "hot-buffer-size", "hisparse.deviceBufferSize"),
        (dict(memory_request_gib=831), "host-pool-fits-request", "resources.requests.memory"),
        (dict(memory_request_gib=None), "host-pool-fits-request", "resources.requests.memory"),
        (dict(routed_experts=True), "routed-experts-pd", "routedExperts.enabled"),
        (dict(extra_args=["-tp=2"]), "owned-flags", "extraArgs[0]"),
        (dict(extra_args=["--max-num-seqs", "64", "--tensor_parallel_size", "2"]), "owned-flags", "extraArgs[2]"),
        (dict(extra_args=["-cc.cudagraph_mode=FULL"]), "owned-flags", "extraArgs[0]"),
        (dict(extra_args=["--no-enable-dbo"]), "owned-flags", "extraArgs[0]"),  # a hidden spelling vLLM registers
        (dict(extra_args=["--max-num-seqs", "abc"]), "extra-args-parse", "extraArgs[0]"),  # invalid int value
        (dict(extra_args=["--config", "more.yaml"]), "owned-flags", "extraArgs[0]"),
        (dict(extra_args=["--max-num-seqs"]), "extra-args-parse", "extraArgs[0]"),
        (dict(extra_args=["--kv-transfer-conf={}"]), "owned-flags", "extraArgs[0]"),  # abbreviation
        (dict(extra_args=["--disable-expert-parallel"]), "owned-flags", "extraArgs[0]"),
        (dict(extra_args=["-dcp", "2"]), "owned-flags", "extraArgs[0]"),
        (dict(engine=EngineOptions(extra_args=["--speculative_config={}"])), "owned-flags", "engine.extraArgs[0]"),
        (dict(extra_env={"UCX_TLS": "tcp"}), "owned-env", "extraEnv.UCX_TLS"),
        (dict(engine=EngineOptions(extra_env={"VLLM_USE_V2_MODEL_RUNNER": "0"})), "owned-env", "engine.extraEnv.VLLM_USE_V2_MODEL_RUNNER"),
        (dict(parallelism=ParallelSettings(gpus_per_node=8, data_parallel_size=8, data_parallel_size_local=4, tensor_parallel_size=1)),
         "parallel-layout", "parallelism.dataParallelSizeLocal"),
        (dict(parallelism=ParallelSettings(nodes=2, gpus_per_node=8, data_parallel_size=8, data_parallel_size_local=8)),
         "parallel-layout", "parallelism.dataParallelSize"),
        (dict(parallelism=ParallelSettings(gpus_per_node=8, data_parallel_size=8, data_parallel_size_local=8, all2all_backend="naive")),
         "parallel-layout", "parallelism.all2allBackend"),
        (dict(kv_transfer=KVTransferSettings(nixl=NixlSettings(side_channel_port=8195))), "side-channel-ports", "kvTransfer.nixl.sideChannelPort"),
        (dict(kv_transfer=KVTransferSettings(nixl=NixlSettings(link_check_port=5607))), "side-channel-ports", "kvTransfer.nixl.sideChannelPort"),
        # vLLM binds base + global DP rank: 65530 + 7 is past 65535.
        (dict(kv_transfer=KVTransferSettings(nixl=NixlSettings(side_channel_port=65530))), "side-channel-ports", "kvTransfer.nixl.sideChannelPort"),
        (dict(parallelism=ParallelSettings(gpus_per_node=8, data_parallel_size=8, data_parallel_size_local=8,
                                           enable_expert_parallel=True, data_parallel_rpc_port=8200)),
         "distinct-ports", "parallelism.dataParallelRpcPort"),
        (dict(kv_transfer=KVTransferSettings(nixl=NixlSettings(link_check_port=8000))), "distinct-ports", "kvTransfer.nixl.linkCheckPort"),
        (dict(extra_env={"VLLM_PORT": "9000"}), "owned-env", "extraEnv.VLLM_PORT"),
        (dict(extra_env={"VLLM_NIXL_SIDE_CHANEL_PORT": "1"}), "owned-env", "extraEnv.VLLM_NIXL_SIDE_CHANEL_PORT"),  # typo
        (dict(model=ModelSettings(source="hf://a/b", served_model_name="ds", index_topk=2048, revision="--trust-remote-code")),
         "rendered-values", "model.revision"),
        (dict(model=ModelSettings(source="hf://a/b", served_model_name="ds", index_topk=2048, revision="-cc.mode")),
         "rendered-values", "model.revision"),
        (dict(role="prefill"), "hisparse-decode-only", "hisparse"),
        (dict(cpu_offload=CpuOffloadSettings(size_gib=10), memory_request_gib=2000), "cpu-offload-hisparse", "cpuOffload"),
        (dict(role="prefill", hisparse=None, cpu_offload=CpuOffloadSettings(size_gib=200)), "host-pool-fits-request", "resources.requests.memory"),
        (dict(disaggregated=False, routed_experts=True, extra_args=["--disable-prefix-caching"]),
         "routed-experts-prefix-caching", "extraArgs[0]"),
        (dict(gpu_architecture="blackwell", model=GLM, moe_backend="auto"), "moe-backend", "moeBackend"),
        (dict(gpu_architecture="blackwell", moe_backend="hpc"), "moe-backend", "moeBackend"),
        (dict(gpu_architecture="hopper", moe_backend="flashinfer_trtllm"), "moe-backend", "moeBackend"),
        (dict(moe_backend="aiter"), "moe-backend", "moeBackend"),
        (dict(gpu_architecture="blackwell", model=GLM, extra_env={"VLLM_USE_DEEP_GEMM_E8M0": "1"}), "moe-backend", "moeBackend"),
        (dict(gpu_architecture="blackwell", moe_backend="flashinfer_moe_ep_mega_deep_gemm"), "moe-backend", "moeBackend"),
        (dict(extra_args=["--kv-offloading-size", "64"]), "owned-flags", "extraArgs[0]"),
        (dict(extra_args=["--moe-backend=triton"]), "owned-flags", "extraArgs[0]"),
        # Other routes to the same effective settings (engine/effective.py).
        (dict(extra_args=["--max-num-seqs", "8", "--spec-method", "deepseek_mtp"]), "no-speculative-decoding", "extraArgs[2]"),
        (dict(extra_args=["--spec_tokens=1"]), "no-speculative-decoding", "extraArgs[0]"),
        (dict(extra_args=["--ubatch-size", "2"]), "no-dbo", "extraArgs[0]"),
        (dict(extra_args=["--hf-overrides.index_topk", "4096"]), "owned-flags", "extraArgs[0]"),
        (dict(extra_args=['--hf-overrides={"text_config": {"index_topk": 4096}}']), "owned-flags", "extraArgs[0]"),
        (dict(extra_args=["--hf-config-path", "/other"]), "owned-flags", "extraArgs[0]"),
        (dict(extra_args=["--kernel-config.moe_backend=aiter"]), "owned-flags", "extraArgs[0]"),
        (dict(extra_args=['--kernel-config', '{"moe_backend": "triton"}']), "owned-flags", "extraArgs[0]"),
        (dict(extra_args=["--device-ids", "0"]), "device-selection", "extraArgs[0]"),
        (dict(extra_env={"NVIDIA_VISIBLE_DEVICES": "all"}), "owned-env", "extraEnv.NVIDIA_VISIBLE_DEVICES"),
        (dict(extra_args=["--uds", "/tmp/vllm.sock"]), "listener", "extraArgs[0]"),
        (dict(extra_args=["-O.cudagraph_mode=FULL"]), "optimization-level", "extraArgs[0]"),
        (dict(extra_args=["-cc.cudagraph_mode=full"]), "cudagraph-mode", "extraArgs[0]"),
        (dict(extra_env={"VLLM_BATCH_INVARIANT": "1"}), "batch-invariance", "extraEnv.VLLM_BATCH_INVARIANT"),
        (dict(engine=EngineOptions(extra_env={"VLLM_BATCH_INVARIANT": "yes"})), "batch-invariance", "engine.extraEnv.VLLM_BATCH_INVARIANT"),
        (dict(compilation_config={"cudagraph_mode": "2"}), "cudagraph-mode", "compilationConfig.cudagraph_mode"),
        (dict(compilation_config={"cudagraph_mode": [2, 0]}), "cudagraph-mode", "compilationConfig.cudagraph_mode"),
        (dict(compilation_config={"cudagraph_mod": "NONE"}), "compilation-config", "compilationConfig.cudagraph_mod"),
        (dict(extra_args=["--max-num-seqs", "8", "--middleware", "x" * (128 * 1024)]), "exec-limits", "extraArgs[3]"),
        (dict(extra_env={"BIG": "x" * (128 * 1024)}), "exec-limits", "extraEnv.BIG"),
        (dict(extra_args=["--middleware", "x" * 100_000] * 11), "exec-limits", "extraArgs"),
    ],
)
def test_rule_refuses(overrides, rule, path):
    hits = rules_hit(decode(**overrides))
    assert rule in hits, hits
    assert path in hits[rule]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4]}),
        dict(extra_args=["--max-num-seqs", "256", "--enable-chunked-prefill"]),
        dict(extra_args=["--max-num-batched-tokens=8192", "-q", "fp8"]),
        dict(extra_env={"VLLM_LOGGING_LEVEL": "DEBUG", "UCX_NET_DEVICES": "mlx5_0:1"}),
        dict(kv_transfer=KVTransferSettings(nixl=NixlSettings(side_channel_port=65528))),  # 65528 + 7 = 65535, the last port
        dict(hisparse=HiSparseSettings(host_pool_gib=96, device_buffer_size=2048)),
        dict(memory_request_gib=832),  # exactly 8 x 96 + 64
        dict(disaggregated=False, routed_experts=True),  # decode-only: vLLM allows routed experts
        dict(hisparse=None, enable_dbo=True, speculative_config={"method": "mtp"}, memory_request_gib=None),  # not HiSparse
        dict(role="prefill", hisparse=None, cpu_offload=CpuOffloadSettings(size_gib=100), memory_request_gib=8 * 100 + 64),
        dict(disaggregated=False, routed_experts=True, hisparse=None, cpu_offload=CpuOffloadSettings(size_gib=8)),
        dict(gpu_architecture="blackwell", model=GLM),  # the derived backend
        dict(gpu_architecture="blackwell", model=GLM, moe_backend="deep_gemm"),  # the honoured override
        dict(gpu_architecture="blackwell", model=GLM, extra_env={"VLLM_USE_DEEP_GEMM_E8M0": "0"}),  # agrees
        dict(gpu_architecture="hopper", model=GLM, moe_backend="auto"),  # no UE8M0 hazard on Hopper
        # The routes above, with values that leave the owned setting alone.
        dict(extra_args=["--spec-method", "None", "--ubatch-size", "1", "-O3", "--kernel-config.linear_backend=auto"]),
        dict(extra_args=["--hf-overrides.rope_theta", "10000", "-O", "2"]),
        dict(extra_env={"VLLM_BATCH_INVARIANT": "0"}),
        dict(compilation_config={"cudagraph_mode": "piecewise"}),
        dict(compilation_config={"cudagraph_mode": 1}),
        dict(hisparse=None, memory_request_gib=None, extra_args=["--ubatch-size", "2"], extra_env={"VLLM_BATCH_INVARIANT": "1"}),
        dict(extra_args=["--middleware", "x" * (128 * 1024 - 1)]),  # the longest argument Linux execs
    ],
)
def test_rule_accepts(overrides):
    assert check_role(decode(**overrides)) == []


def test_every_port_that_must_move_is_named_at_once():
    """Three listeners on one port: the two a manifest sets are each reported at their own field."""
    s = decode(parallelism=ParallelSettings(gpus_per_node=8, data_parallel_size=8, data_parallel_size_local=8,
                                            enable_expert_parallel=True, data_parallel_rpc_port=8200),
               kv_transfer=KVTransferSettings(nixl=NixlSettings(link_check_port=8200)))
    hits = rules_hit(s)
    assert sorted(hits["distinct-ports"]) == ["kvTransfer.nixl.linkCheckPort", "parallelism.dataParallelRpcPort"], hits


def test_negative_numbers_are_values_not_flags():
    assert check_role(decode(extra_args=["--max-num-seqs", "-1"])) == []


def test_host_pool_fits_nodes():
    s = decode(parallelism=ParallelSettings(nodes=2, gpus_per_node=8, data_parallel_size=16, data_parallel_size_local=8))
    assert check_host_pool_fits_nodes(s, {"a": 900, "b": 2000}) == []
    [v] = check_host_pool_fits_nodes(s, {"a": 900, "b": 500, "c": 100})
    assert v.dotted == "hisparse.hostPoolGiB" and "only 1 of the 3 nodes" in v.message and "needs 2" in v.message


def test_every_rule_has_a_refusing_case():
    """A rule no case above refuses could be dead code or silently broken. Derived from the table of
    test_rule_refuses, so adding a rule without a refusing case fails here."""
    marks = test_rule_refuses.pytestmark  # type: ignore[attr-defined]
    cases = next(m.args[1] for m in marks if m.name == "parametrize")
    refused = {rule for _, rule, _ in cases}
    if effective.RULE_NAMES <= refused:  # the effective-settings check reports under these rules
        refused.add("effective-settings")
    # nixl-kv-consumer guards the renderer, which never produces a bad config: its check is refused below.
    assert set(RULES) - {"nixl-kv-consumer"} <= refused, set(RULES) - refused


def test_nixl_consumer_check_refuses_producer_and_missing_hisparse():
    from hisparse_runtime.engine.constraints import nixl_consumer_problem

    good = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}, {"kv_connector": "HiSparseConnector"}]}}
    assert nixl_consumer_problem(good) is None
    both = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "NixlConnector", "kv_role": "kv_both"}, {"kv_connector": "HiSparseConnector"}]}}
    assert "kv_both" in nixl_consumer_problem(both)
    assert nixl_consumer_problem({"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}) == "no HiSparseConnector beside NIXL"
    assert RULES["nixl-kv-consumer"](decode()) == []  # and what the renderer produces passes


def test_termination_grace_covers_unpinning():
    small = termination_grace_seconds(decode())
    big = termination_grace_seconds(decode(hisparse=HiSparseSettings(host_pool_gib=160), memory_request_gib=1400))
    assert big - small == (160 - 96) * 8 // 4  # 0.25 s per pinned GiB
    assert small >= 120 + 8 * 96 // 4


def test_every_destination_feeding_an_effective_setting_is_judged():
    """The table lists, read from vLLM's own functions, every argparse destination that feeds each
    effective setting; each must be judged here. A new vLLM option reaching one fails this test."""
    table = vllm_options.table()["effective"]
    assert set(table) == set(effective.HANDLED)
    for setting, entry in table.items():
        assert set(entry["dests"]) == set(effective.HANDLED[setting]), (setting, entry["source"])
    # The derivation found the routes the rules exist for (a broken generator would find none).
    assert {"spec_method", "spec_tokens", "spec_model"} <= set(table["speculative"]["dests"])
    assert "ubatch_size" in table["ubatching"]["dests"]


def test_suggested_fixes_are_accepted():
    """The fix each message names is itself valid: the typed field instead of the route."""
    assert check_role(decode(model=ModelSettings(source="hf://deepseek-ai/DeepSeek-V3.2", served_model_name="ds", index_topk=2048),
                             hisparse=HiSparseSettings(host_pool_gib=96, device_buffer_size=4096))) == []
    assert check_role(decode(moe_backend="triton")) == []
    assert check_role(decode(compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"})) == []
