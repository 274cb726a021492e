"""The rendered argv of every role and pod is accepted by vLLM 0.33.0's own CLI parser and config
classes (run on CPU: ``VLLM_TARGET_DEVICE=cpu``), and our mirrors of vLLM's rules track its source."""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from hisparse_operator.api import role_settings, role_spec, validate
from hisparse_runtime.engine import (
    RULES,
    CpuOffloadSettings,
    ModelSettings,
    ParallelSettings,
    RoleSettings,
    check_role,
    kv_transfer_config,
    moe,
    vllm_options,
    VLLM_VERSION,
    flags,
    mooncake_config,
    render_argv,
)

from opsupport import REPO, VALID_EXAMPLES

pytestmark = pytest.mark.vllm
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@pytest.fixture(scope="module")
def vllm():
    import vllm  # noqa: F401  (heavy: import once per module)

    assert importlib.metadata.version("vllm") == VLLM_VERSION
    return vllm


@pytest.fixture(scope="module")
def serve(vllm):
    """`vllm serve` exactly as vLLM's CLI builds it, and a function parsing an argv through it."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="subparser")
    command = ServeSubcommand()
    serve_parser = command.subparser_init(sub)

    def parse(argv: list[str]) -> tuple[argparse.Namespace, AsyncEngineArgs]:
        assert argv[:2] == ["vllm", "serve"]
        args = parser.parse_args(argv[1:])
        command.validate(args)
        args.model = args.model_tag
        return args, AsyncEngineArgs.from_cli_args(args)

    parse.parser = serve_parser  # type: ignore[attr-defined]
    return parse


def _pods():
    """(example, role, worker index, settings) for every pod shape of every example."""
    for path in VALID_EXAMPLES:
        d, errors = validate(yaml.safe_load(path.read_text()))
        assert not errors and d is not None
        for role in ("prefill", "decode"):
            if role_spec(d, role) is None:
                continue
            s = role_settings(d, role)
            for worker in range(s.parallelism.nodes):
                yield pytest.param(s, worker, id=f"{path.stem}-{role}-w{worker}")


@pytest.mark.parametrize(("settings", "worker"), list(_pods()))
def test_vllm_parses_rendered_argv(serve, settings, worker):
    from vllm.config import AttentionConfig, CompilationConfig, KVTransferConfig
    from vllm.config.kernel import KernelConfig
    from vllm.config.kv_transfer import hisparse_host_pool_gib

    argv = render_argv(settings, worker_index=worker, leader_address="glm52-decode-0.glm52-decode")
    args, engine = serve(argv)
    p = settings.parallelism
    assert args.model == settings.model.vllm_model_arg
    assert engine.tensor_parallel_size == p.tensor_parallel_size
    assert engine.data_parallel_size == p.data_parallel_size
    assert engine.enable_expert_parallel == p.enable_expert_parallel
    assert engine.block_size == settings.engine.block_size
    assert engine.kv_cache_dtype == settings.engine.kv_cache_dtype
    assert engine.scheduler_reserve_full_isl is True
    if p.nodes > 1:
        assert engine.data_parallel_start_rank == worker * p.data_parallel_size_local
        assert engine.data_parallel_size_local == p.data_parallel_size_local
        assert engine.data_parallel_hybrid_lb is True

    kv = engine.kv_transfer_config
    assert isinstance(kv, KVTransferConfig)
    # Round trip: the rendered JSON is exactly what vLLM's class holds and re-serializes.
    rendered = json.loads(argv[argv.index(flags.KV_TRANSFER_CONFIG) + 1])
    again = KVTransferConfig(**rendered)
    for key, value in rendered.items():
        assert getattr(again, key) == value == getattr(kv, key)
    if settings.hisparse_on:
        assert hisparse_host_pool_gib(kv) == settings.hisparse.host_pool_gib
        assert kv.kv_role == ("kv_consumer" if settings.disaggregated else "kv_both")
        attention = engine.attention_config
        assert isinstance(attention, AttentionConfig) and attention.hisparse_config is not None
        if settings.hisparse.device_buffer_size is not None:
            assert attention.hisparse_config.device_buffer_size == settings.hisparse.device_buffer_size
        assert attention.hisparse_config.eager_host_mirror == settings.hisparse.eager_host_mirror
    else:
        assert hisparse_host_pool_gib(kv) is None
    assert isinstance(engine.compilation_config, CompilationConfig)
    # Each MultiConnector child is a KVTransferConfig of its own in vLLM (MultiConnector builds them so).
    for child in rendered.get("kv_connector_extra_config", {}).get("connectors", []):
        again_child = KVTransferConfig(**child)
        assert {k: getattr(again_child, k) for k in child} == child
    if settings.cpu_offload is not None:
        _assert_cpu_offload(kv, settings)
    backend = moe.moe_backend(settings)
    assert engine.moe_backend == (backend or "auto")
    KernelConfig(moe_backend=engine.moe_backend)  # vLLM's own config class accepts it
    assert engine.enable_return_routed_experts is settings.routed_experts


def _assert_cpu_offload(kv, settings) -> None:
    """The offload child is vLLM's OffloadingConnector with its CPU spec, sized per DP rank."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    assert kv.has_connector("OffloadingConnector")
    [child] = [c for c in kv.kv_connector_extra_config.get("connectors", [vars(kv)]) if c["kv_connector"] == "OffloadingConnector"]
    extra = child["kv_connector_extra_config"]
    assert OffloadingSpecFactory.get_spec_cls(extra) is CPUOffloadingSpec
    assert extra["cpu_bytes_to_use"] == settings.cpu_offload.size_gib * 2**30
    child_config = KVTransferConfig(**child)
    assert KVConnectorFactory.get_connector_class(child_config).__name__ == "OffloadingConnector"
    # The hybrid KV cache manager stays on (HiSparse needs it): every child must support HMA.
    assert KVConnectorFactory.supports_hma_config(kv)


def test_unknown_flag_fails_the_parser(serve):
    """The check above can fail: a flag vLLM does not know is an argparse error (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        serve(["vllm", "serve", "m", "--hisparse-pool-gib", "160"])
    assert exited.value.code == 2


def test_every_flag_constant_exists_in_vllm(serve):
    known = {o for action in serve.parser._actions for o in action.option_strings}
    ours = {v for k, v in vars(flags).items() if k.isupper() and isinstance(v, str) and v.startswith("--")}
    missing = sorted(ours - known)
    assert not missing, f"flags vLLM {VLLM_VERSION} does not define: {missing}"


def test_options_table_matches_installed_vllm(vllm):
    """The table the engine core checks extraArgs with is vLLM's own parser, regenerated and compared."""
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-vllm-options"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, "vllm_serve_options.json is stale: run scripts/gen-vllm-options"


def test_every_vllm_spelling_of_an_owned_flag_is_owned(serve):
    """Every option string vLLM registers for an owned or forbidden dest (hidden ``--no-enable-x``
    included) and every unique prefix of it resolves to that dest in the rebuilt parser."""
    from hisparse_runtime.engine.constraints import _dest_rules

    forbidden, owned = _dest_rules()
    registered = serve.parser._option_string_actions
    checked = 0
    for spelling, action in registered.items():
        if action.dest not in owned and action.dest not in forbidden:
            continue
        candidates = [spelling] + [spelling[:n] for n in range(3, len(spelling)) if spelling.startswith("--")
                                   and sum(o.startswith(spelling[:n]) for o in registered) == 1]
        for text in candidates:
            value = [] if action.nargs == 0 else ["{}" if "config" in action.dest else "1"]
            tokens = [vllm_options.Token(t, ("extraArgs", 0)) for t in [text, *value]]
            try:
                parsed = vllm_options.parse([vllm_options.Token("serve"), vllm_options.Token("m"), *tokens])
            except vllm_options.Refused:
                continue  # a value vLLM refuses: refused either way
            assert (tokens[0], action.dest) in parsed.options, text
            checked += 1
    assert checked > 200


def test_rendered_mooncake_config_loads(vllm):
    from vllm.distributed.mooncake_store import MooncakeStoreConfig

    d, _ = validate(yaml.safe_load((VALID_EXAMPLES[0].parent / "hisparse-deployment.yaml").read_text()))
    config = mooncake_config(role_settings(d, "prefill"))
    assert config is not None
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(config, f)
        f.flush()
        loaded = MooncakeStoreConfig.from_file(f.name)
    assert loaded.master_server_address.endswith(":50051")
    assert loaded.global_segment_size == 256 * 1024**3
    assert loaded.mode == "embedded"


# vLLM's HiSparse startup errors (VllmConfig) -> the rule that mirrors each one here.
# "requires NVIDIA CUDA" is checked on the live pod by preflight (GPU present and supported).
VLLM_HISPARSE_RULES = {
    "HiSparse currently requires NVIDIA CUDA": "preflight:gpu",
    "HiSparse does not support pipeline parallelism": "owned-flags",
    "HiSparse does not support decode context parallelism": "owned-flags",
    "HiSparse does not support cudagraph_mode=FULL": "cudagraph-mode",
    "HiSparse requires --scheduler-reserve-full-isl": "owned-flags",
    "HiSparse is only supported for DSA models with index_topk": "dsa-index-topk",
    "HiSparse requires the hybrid KV cache manager": "owned-flags",
    "HiSparse requires Model Runner V2": "owned-env",
}


def test_mirrored_rules_cover_vllm_source(vllm):
    """Every HiSparse startup error in vLLM 0.33's VllmConfig has a mirror here; if vLLM adds one,
    this fails until the engine core learns it."""
    from vllm.config import vllm as vllm_config

    source = inspect.getsource(vllm_config)
    # Startup rejections only (`raise ValueError("HiSparse ...")`); warnings are not rules.
    messages = {m.rstrip(";., ") for m in re.findall(r'raise ValueError\(\s*"(HiSparse [^"]*?)(?:[;.]|")', source)}
    assert len(messages) >= 6, f"vLLM's HiSparse checks moved; found only {messages}"
    unmatched = sorted(m for m in messages if not any(m.startswith(k) or k.startswith(m) for k in VLLM_HISPARSE_RULES))
    assert not unmatched, f"vLLM HiSparse rules without a mirror: {unmatched}"
    for rule in VLLM_HISPARSE_RULES.values():
        assert rule.startswith("preflight:") or rule in RULES
    # The host-pool rules live in vllm.config.kv_transfer.
    from vllm.config import kv_transfer

    kv_source = Path(inspect.getfile(kv_transfer)).read_text()
    assert "host_pool_gib must be positive" in kv_source and "Only one HiSparseConnector" in kv_source


# --- routed experts, connectors, MoE backends: vLLM's rules run against the toolkit's mirrors ----------


def _topologies() -> list[RoleSettings]:
    """Every role of every example, plus the compositions the examples do not show."""
    out = [s for p in _pods() for s in [p.values[0]]]
    model = ModelSettings(source="hf://deepseek-ai/DeepSeek-V3.2", served_model_name="ds", index_topk=2048)
    layout = ParallelSettings(gpus_per_node=8, tensor_parallel_size=8)
    offload = CpuOffloadSettings(size_gib=8)
    for role, disaggregated, extra in [
        ("decode", False, dict(cpu_offload=offload)),  # decode-only, offload alone
        ("decode", True, dict(cpu_offload=offload)),  # P/D decode without HiSparse, NIXL + offload
        ("prefill", True, dict(cpu_offload=offload)),
        ("decode", False, {}),  # no connector at all
    ]:
        out.append(RoleSettings(role=role, model=model, image="img", parallelism=layout, disaggregated=disaggregated,
                                memory_request_gib=1000, **extra))  # fmt: skip
    return out


def _aux_output_self(kv_transfer_config):
    """What ``VllmConfig._verify_aux_output_compatibility`` reads, with every requirement but the
    connectors met, so vLLM's verdict is its connector rule alone."""
    from types import SimpleNamespace as NS

    return NS(aux_output_config=NS(enabled=True), use_v2_model_runner=True,
              model_config=NS(runner_type="generate", is_moe=True), cache_config=NS(enable_prefix_caching=True),
              speculative_config=None, kv_transfer_config=kv_transfer_config,
              parallel_config=NS(pipeline_parallel_size=1, decode_context_parallel_size=1, prefill_context_parallel_size=1))  # fmt: skip


def test_routed_experts_rule_matches_vllm(vllm):
    """vLLM's own routed-experts check, run on each topology's rendered connectors, refuses exactly
    where the toolkit's rule does; and the connector list we mirror is the one in vLLM's source."""
    from vllm.config import KVTransferConfig, VllmConfig

    from hisparse_runtime.engine.constraints import ROUTED_EXPERTS_REFUSED_CONNECTORS

    source = inspect.getsource(VllmConfig._verify_aux_output_compatibility)
    listed = re.search(r"for connector_name in \(([^)]*)\)", source)
    assert listed, "vLLM's routed-experts connector list moved"
    assert tuple(re.findall(r'"(\w+)"', listed.group(1))) == ROUTED_EXPERTS_REFUSED_CONNECTORS
    assert "AuxOutput Connector requires prefix caching" in source
    verdicts = {"refused": 0, "allowed": 0}
    for settings in _topologies():
        s = settings.model_copy(update={"routed_experts": True})
        rendered = kv_transfer_config(s)
        try:
            VllmConfig._verify_aux_output_compatibility(_aux_output_self(KVTransferConfig(**rendered) if rendered else None))
            vllm_refuses = False
        except ValueError as exc:
            assert "PD auxiliary output is not supported" in str(exc)
            vllm_refuses = True
        ours = any(v.rule == "routed-experts-pd" for v in check_role(s))
        assert ours == vllm_refuses, (s.role, s.disaggregated, rendered)
        verdicts["refused" if ours else "allowed"] += 1
    assert verdicts["refused"] >= 3 and verdicts["allowed"] >= 3, verdicts  # both sides were compared


def test_connector_lookup_matches_vllm(vllm):
    """``connector_names`` (which the routed-experts mirror reads) sees what vLLM's has_connector sees."""
    from vllm.config import KVTransferConfig

    from hisparse_runtime.engine.connectors import connector_names

    names = {"NixlConnector", "HiSparseConnector", "OffloadingConnector", "MooncakeStoreConnector", "MultiConnector"}
    for settings in _topologies():
        rendered = kv_transfer_config(settings)
        if rendered is None:
            continue
        config = KVTransferConfig(**rendered)
        ours = set(connector_names(rendered))
        assert {n for n in names if config.has_connector(n)} == ours | ({"MultiConnector"} if rendered["kv_connector"] == "MultiConnector" else set())


def test_offload_connector_rules_match_vllm(vllm):
    """Why the toolkit renders the OffloadingConnector child itself: vLLM's --kv-offloading-size replaces
    the whole connector (NIXL would be gone); and the CPU spec's keys are the ones vLLM reads."""
    from types import SimpleNamespace as NS

    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.kv_offload.cpu import spec as cpu_spec

    from hisparse_runtime.engine import offload_connector
    from hisparse_runtime.engine.cpu_offload import CPU_SPEC, OFFLOADING

    prefill = next(s for s in _topologies() if s.role == "prefill" and s.cpu_offload is not None)
    ns = NS(cache_config=NS(kv_offloading_size=10.0, kv_offloading_backend="native"),
            kv_transfer_config=KVTransferConfig(**kv_transfer_config(prefill)))  # fmt: skip
    VllmConfig._post_init_kv_transfer_config(ns)
    assert ns.kv_transfer_config.kv_connector == OFFLOADING and not ns.kv_transfer_config.has_connector("NixlConnector")
    assert ns.kv_transfer_config.kv_role == offload_connector(prefill)["kv_role"] == "kv_both"
    source = inspect.getsource(cpu_spec)
    for key in offload_connector(prefill)["kv_connector_extra_config"]:
        if key != "spec_name":
            assert f'extra_config.get("{key}"' in source, key
    from vllm.v1.kv_offload import factory

    assert f'"{CPU_SPEC}"' in inspect.getsource(factory)
    assert "kv_offloading_size" in flags.KV_OFFLOADING_SIZE.replace("-", "_")
    assert RULES["owned-flags"](prefill.model_copy(update={"extra_args": ["--kv-offloading-size", "8"]}))


def test_moe_backend_rules_match_vllm(vllm):
    """The MoE backend choices are vLLM's; its own model gate agrees with ours; and the premises of the
    Blackwell scale rule hold in this wheel (one global UE8M0 switch, GLM DSA not auto-handled)."""
    from typing import get_args

    from vllm.config import kernel
    from vllm.utils import deep_gemm
    from vllm.model_executor.layers.quantization.utils import fp8_utils

    assert get_args(kernel.MoEBackend) == get_args(moe.MoEBackend)
    assert kernel.FLASHINFER_MOE_EP_ARCHITECTURES == moe.FLASHINFER_MOE_EP_ARCHITECTURES
    assert set(moe.ARCHITECTURES) | moe.ROCM_ONLY <= set(get_args(kernel.MoEBackend))
    for backend in get_args(kernel.MoEBackend):
        for arch in ("DeepseekV4ForCausalLM", "GlmMoeDsaForCausalLM"):
            try:
                kernel.validate_flashinfer_moe_ep_model(backend, [arch])
                vllm_refuses = False
            except ValueError:
                vllm_refuses = True
            s = _glm_on_blackwell(model_architecture=arch, moe_backend=backend)
            ours = any("only serves DeepSeek-V4" in p for p in moe.problems(s))
            assert ours == vllm_refuses, (backend, arch)
    # vLLM's own Blackwell exclusions do not cover GLM DSA, so the toolkit's rule is not redundant.
    assert "glm_moe_dsa" not in deep_gemm._DEEPGEMM_BLACKWELL_EXCLUDED_MODEL_TYPES
    # The activation-scale rounding follows one global switch, not the selected MoE backend...
    assert "use_ue8m0 = is_deep_gemm_e8m0_used()" in inspect.getsource(fp8_utils.per_token_group_quant_fp8)
    assert moe.VLLM_USE_DEEP_GEMM_E8M0 in inspect.getsource(deep_gemm.is_deep_gemm_e8m0_used)
    # ...packed UE8M0 on both Blackwell families.
    oracle = inspect.getsource(deep_gemm.DeepGemmQuantScaleFMT.init_oracle_cache)
    assert "is_device_capability_family(100)" in oracle and "is_device_capability_family(120)" in oracle
    # The families the toolkit allows backends on come from vLLM's documentation of each.
    doc = inspect.getsource(kernel.KernelConfig)
    assert re.search(r'"hpc": .*Hopper only', doc) and re.search(r'"flashinfer_b12x": .*SM12x', doc)
    assert re.search(r'"flashinfer_moe_ep_cutedsl".*\n.*\n.*requires Blackwell, expert parallelism', doc)


def _glm_on_blackwell(model_architecture: str, moe_backend: str) -> RoleSettings:
    model = ModelSettings(source="hf://zai-org/GLM-5", served_model_name="glm", index_topk=2048, architecture=model_architecture)
    layout = ParallelSettings(gpus_per_node=8, data_parallel_size=8, data_parallel_size_local=8, enable_expert_parallel=True)
    return RoleSettings(role="prefill", model=model, image="img", parallelism=layout, gpu_architecture="blackwell",
                        moe_backend=moe_backend)  # fmt: skip
