"""argv, env, connector JSON and the KV-compatibility hash of the engine core."""

from __future__ import annotations

import json

import pytest
from hisparse_runtime.engine import (
    HiSparseSettings,
    KVTransferSettings,
    ModelSettings,
    MooncakeStoreSettings,
    ParallelSettings,
    RoleSettings,
    flags,
    kv_compat_hash,
    kv_transfer_config,
    render_argv,
    render_env,
)
from hisparse_runtime.engine.cache import EngineOptions

MODEL = ModelSettings(source="hf://zai-org/GLM-5.2-FP8", served_model_name="glm", index_topk=2048, index_topk_freq=4, revision="abc")
WIDE = ParallelSettings(nodes=8, gpus_per_node=8, data_parallel_size=64, data_parallel_size_local=8, enable_expert_parallel=True)


def role(r: str, **kw) -> RoleSettings:
    base = dict(role=r, model=MODEL, image="img:1")
    if r == "decode":
        base.update(parallelism=WIDE, hisparse=HiSparseSettings(host_pool_gib=160), memory_request_gib=1500)
    else:
        base.update(parallelism=ParallelSettings(gpus_per_node=8, tensor_parallel_size=8))
    base.update(kw)
    return RoleSettings(**base)


def arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_decode_kv_config_is_multiconnector_consumer_with_hisparse():
    cfg = kv_transfer_config(role("decode"))
    assert cfg["kv_connector"] == "MultiConnector" and cfg["kv_role"] == "kv_consumer"
    nixl, hs = cfg["kv_connector_extra_config"]["connectors"]
    assert nixl == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}
    assert hs["kv_connector"] == "HiSparseConnector" and hs["kv_connector_extra_config"] == {"host_pool_gib": 160}


def test_prefill_kv_config_with_and_without_mooncake():
    assert kv_transfer_config(role("prefill")) == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    with_store = role("prefill", kv_transfer=KVTransferSettings(mooncake=MooncakeStoreSettings(enabled=True)))
    children = kv_transfer_config(with_store)["kv_connector_extra_config"]["connectors"]
    assert [c["kv_connector"] for c in children] == ["NixlConnector", "MooncakeStoreConnector"]


def test_decode_only_uses_hisparse_connector_alone():
    assert kv_transfer_config(role("decode", disaggregated=False))["kv_connector"] == "HiSparseConnector"


@pytest.mark.parametrize("worker", [0, 3, 7])
def test_wide_ep_start_rank_per_worker(worker):
    argv = render_argv(role("decode"), worker_index=worker, leader_address="leader")
    assert arg(argv, flags.DATA_PARALLEL_START_RANK) == str(8 * worker)
    assert arg(argv, flags.DATA_PARALLEL_ADDRESS) == "leader"
    assert flags.DATA_PARALLEL_HYBRID_LB in argv and flags.ENABLE_EXPERT_PARALLEL in argv
    assert json.loads(arg(argv, flags.ATTENTION_CONFIG)) == {"hisparse_config": {"eager_host_mirror": True}}


def test_multinode_needs_leader_and_valid_index():
    with pytest.raises(ValueError, match="leader address"):
        render_argv(role("decode"))
    with pytest.raises(ValueError, match="outside"):
        render_argv(role("decode"), worker_index=8, leader_address="x")


def test_extra_args_come_last_engine_then_role():
    s = role("prefill", engine=EngineOptions(extra_args=["--a"]), extra_args=["--b"])
    assert render_argv(s)[-2:] == ["--a", "--b"]


def test_env_side_channel_from_pod_ip_and_owned_first():
    env = render_env(role("decode", extra_env={"ZED": "1", "ALPHA": "2"}))
    by_name = {e["name"]: e for e in env}
    assert by_name["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert by_name["VLLM_USE_V2_MODEL_RUNNER"]["value"] == "1"
    assert [e["name"] for e in env][-2:] == ["ALPHA", "ZED"]


def test_decode_kernels_render_an_env_var_only_when_the_projects_are_chosen():
    stock = role("decode")
    ours = role("decode", hisparse=HiSparseSettings(host_pool_gib=160, kernels="hisparse"))
    assert "HISPARSE_DECODE_KERNELS" not in {e["name"] for e in render_env(stock)}
    assert {"name": "HISPARSE_DECODE_KERNELS", "value": "hisparse"} in render_env(ours)
    # The default is left out of the serialized settings (the engine ConfigMap), the choice is kept.
    assert "kernels" not in stock.to_json_dict()["hisparse"] and ours.to_json_dict()["hisparse"]["kernels"] == "hisparse"
    # vLLM's argv is the same: the plugin swaps the ops, vLLM's hisparse_config does not know the setting.
    assert render_argv(ours, leader_address="l") == render_argv(stock, leader_address="l")
    assert kv_compat_hash(ours) == kv_compat_hash(stock), "the same KV layout either way"


def test_kv_compat_hash_pairs_roles_and_splits_builds():
    p, d = role("prefill"), role("decode")
    assert kv_compat_hash(p) == kv_compat_hash(d)
    assert kv_compat_hash(role("decode", image="img:2")) != kv_compat_hash(d)
    assert kv_compat_hash(role("decode", engine=EngineOptions(block_size=128))) != kv_compat_hash(d)
    assert kv_compat_hash(role("decode", engine=EngineOptions(kv_cache_dtype="bfloat16"))) != kv_compat_hash(d)
    other_model = MODEL.model_copy(update={"revision": "def"})
    assert kv_compat_hash(role("decode", model=other_model)) != kv_compat_hash(d)
    # Ignored on purpose (see compat.IGNORED): limits that do not change the KV layout.
    assert kv_compat_hash(role("decode", engine=EngineOptions(max_model_len=4096))) == kv_compat_hash(d)
    renamed = MODEL.model_copy(update={"served_model_name": "glm-b"})
    assert kv_compat_hash(role("decode", model=renamed)) == kv_compat_hash(d)


def test_pvc_and_s3_sources():
    pvc = ModelSettings(source="pvc://models/glm/5.2", served_model_name="m")
    assert pvc.vllm_model_arg == "/models/glm/5.2" and pvc.pvc_claim == "models"
    s3 = role("prefill", model=ModelSettings(source="s3://bucket/glm", served_model_name="m"))
    argv = render_argv(s3)
    assert argv[2] == "s3://bucket/glm" and arg(argv, flags.LOAD_FORMAT) == "runai_streamer"


@pytest.mark.parametrize(
    ("args", "dests", "refused"),
    [
        (["--enable_dbo"], ["enable_dbo"], None),
        (["--no-enable-dbo"], ["enable_dbo"], None),  # hidden, but registered by vLLM's EnableDisableAction
        (["-cc.mode=3"], ["compilation_config"], None),  # dotted key: merged and appended as -cc '{"mode": 3}'
        (["-tp=4"], ["tensor_parallel_size"], None),
        (["-tp", "4"], ["tensor_parallel_size"], None),
        (["--kv-transfer-config={}"], ["kv_transfer_config"], None),
        (["--max-num-seqs", "-1"], ["max_num_seqs"], None),  # a negative number is a value
        (["--kv-transfer-conf", "{}"], ["kv_transfer_config"], None),  # argparse abbreviation
        (["-O3"], ["optimization_level"], None),
        (["--max-num-seqs"], None, "expected one argument"),
        (["--max-num-seqs", "--enforce-eager"], None, "expected one argument"),
        (["--max-num-seqs", "x"], None, "invalid int value"),
        (["--max-num-s", "4"], None, "ambiguous option"),
        (["fp8"], None, "unrecognized arguments: fp8"),
        (["--no-such-flag"], None, "unrecognized arguments: --no-such-flag"),
        (["--enforce-eager=1"], None, "ignored explicit argument"),
        (["--dtype", "int3"], None, "invalid choice"),
        (["--kv-transfer-config.kv_role"], None, "needs a value"),
        (["--help"], None, "exits instead of serving"),
        (["--model", "other"], None, "second model"),
    ],
)
def test_parse_follows_vllm_parser(args, dests, refused):
    from hisparse_runtime.engine import vllm_options

    tokens = [vllm_options.Token("serve"), vllm_options.Token("m")] + [vllm_options.Token(a, ("extraArgs", i)) for i, a in enumerate(args)]
    if refused is None:
        parsed = vllm_options.parse(tokens)
        assert [d for t, d in parsed.options if t.origin is not None] == dests
    else:
        with pytest.raises(vllm_options.Refused, match=refused) as exc:
            vllm_options.parse(tokens)
        assert exc.value.origin is not None and exc.value.origin[0] == "extraArgs"
