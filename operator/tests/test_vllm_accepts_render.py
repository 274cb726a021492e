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
        assert kv.kv_role == "kv_consumer"
        attention = engine.attention_config
        assert isinstance(attention, AttentionConfig) and attention.hisparse_config is not None
        if settings.hisparse.device_buffer_size is not None:
            assert attention.hisparse_config.device_buffer_size == settings.hisparse.device_buffer_size
        assert attention.hisparse_config.eager_host_mirror == settings.hisparse.eager_host_mirror
    else:
        assert hisparse_host_pool_gib(kv) is None
    assert isinstance(engine.compilation_config, CompilationConfig)


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
