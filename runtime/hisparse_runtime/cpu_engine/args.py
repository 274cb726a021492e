"""``vllm serve`` argv -> what the CPU engine serves, through vLLM 0.33.0's own parser and config classes.

The argv is parsed exactly as ``vllm serve`` parses it (the ``serve`` subcommand's parser, its
``validate``, ``AsyncEngineArgs.from_cli_args``), so an argv vLLM refuses is refused here with the same
argparse exit code 2. vLLM's HiSparse startup rules that can be checked without a GPU (``VllmConfig``
refuses them before loading weights) are checked again here, with vLLM's wording; they exit 1, as
``vllm serve`` does on a config error.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["EngineConfigError", "ServeConfig", "parse_serve_argv"]

KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]


class EngineConfigError(ValueError):
    """A setting vLLM would refuse at startup (exit 1)."""


@dataclass(frozen=True)
class ServeConfig:
    """The parsed ``vllm serve`` settings this engine acts on (the rest is parsed, then ignored)."""

    model: str
    revision: str | None
    served_model_name: str
    host: str | None
    port: int
    block_size: int | None
    max_model_len: int | None
    max_logprobs: int
    tensor_parallel_size: int
    data_parallel_size: int
    kv_role: KVRole | None
    nixl: bool
    """A NixlConnector is configured (directly or as a MultiConnector child)."""
    hisparse_host_pool_gib: float | None
    hisparse_device_buffer_size: int | None
    kv_load_failure_policy: str
    engine_id: str | None
    shutdown_timeout: int
    connectors: tuple[str, ...] = field(default_factory=tuple)

    @property
    def hisparse(self) -> bool:
        return self.hisparse_host_pool_gib is not None


_serve_parser: tuple[argparse.ArgumentParser, Any] | None = None


def _parser() -> tuple[argparse.ArgumentParser, Any]:
    """``vllm``'s top-level parser with the ``serve`` subcommand, built once (it is slow to build)."""
    global _serve_parser
    if _serve_parser is None:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = FlexibleArgumentParser(prog="vllm")
        sub = parser.add_subparsers(dest="subparser")
        command = ServeSubcommand()
        command.subparser_init(sub)
        _serve_parser = (parser, command)
    return _serve_parser


def _connectors(kv: Any) -> list[dict[str, Any]]:
    if kv is None or not kv.kv_connector:
        return []
    if kv.kv_connector == "MultiConnector":
        return list((kv.kv_connector_extra_config or {}).get("connectors", []))
    return [{"kv_connector": kv.kv_connector, "kv_role": kv.kv_role,
             "kv_connector_extra_config": kv.kv_connector_extra_config}]  # fmt: skip


def parse_serve_argv(argv: list[str], environ: dict[str, str] | None = None) -> ServeConfig:
    """Parse ``serve MODEL [options]`` (``vllm``'s argv without the program name).

    argparse errors exit 2 (``SystemExit``), as in vLLM; startup rules raise ``EngineConfigError``.
    """
    from vllm.config import KVTransferConfig
    from vllm.config.kv_transfer import hisparse_host_pool_gib
    from vllm.engine.arg_utils import AsyncEngineArgs

    environ = dict(os.environ if environ is None else environ)
    parser, command = _parser()
    args = parser.parse_args(argv)
    if args.subparser != "serve":
        parser.error(f"only `vllm serve` is served by this engine, not {args.subparser!r}")
    command.validate(args)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    kv = engine.kv_transfer_config
    if kv is not None and not isinstance(kv, KVTransferConfig):
        kv = KVTransferConfig(**kv)
    try:
        pool_gib = hisparse_host_pool_gib(kv)
    except ValueError as exc:
        raise EngineConfigError(str(exc)) from exc
    connectors = _connectors(kv)
    names = tuple(str(c.get("kv_connector")) for c in connectors)
    device_buffer = None
    if pool_gib is not None:
        _check_hisparse(engine, environ)
        attention = engine.attention_config
        hs = getattr(attention, "hisparse_config", None) if attention is not None else None
        device_buffer = getattr(hs, "device_buffer_size", None)
    served = engine.served_model_name
    if isinstance(served, (list, tuple)):
        served = served[0] if served else None
    return ServeConfig(
        model=str(engine.model),
        revision=engine.revision,
        served_model_name=str(served or engine.model),
        host=args.host,
        port=int(args.port),
        block_size=engine.block_size,
        max_model_len=engine.max_model_len,
        max_logprobs=int(engine.max_logprobs),
        tensor_parallel_size=int(engine.tensor_parallel_size),
        data_parallel_size=int(engine.data_parallel_size),
        kv_role=kv.kv_role if kv is not None else None,
        nixl="NixlConnector" in names,
        hisparse_host_pool_gib=pool_gib,
        hisparse_device_buffer_size=device_buffer,
        kv_load_failure_policy=str(getattr(kv, "kv_load_failure_policy", "fail") or "fail"),
        engine_id=getattr(kv, "engine_id", None),
        shutdown_timeout=int(engine.shutdown_timeout or 0),
        connectors=names,
    )


def _check_hisparse(engine: Any, environ: dict[str, str]) -> None:
    """vLLM 0.33's HiSparse startup rejections (``VllmConfig.__post_init__``) that need no GPU."""
    problems = []
    if int(engine.pipeline_parallel_size or 1) > 1:
        problems.append("HiSparse does not support pipeline parallelism")
    if int(getattr(engine, "decode_context_parallel_size", 1) or 1) > 1:
        problems.append("HiSparse does not support decode context parallelism")
    if engine.scheduler_reserve_full_isl is False:
        problems.append("HiSparse requires --scheduler-reserve-full-isl")
    if getattr(engine, "disable_hybrid_kv_cache_manager", None) is True:
        problems.append("HiSparse requires the hybrid KV cache manager")
    if environ.get("VLLM_USE_V2_MODEL_RUNNER", "1").strip() == "0":
        problems.append("HiSparse requires Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER is 0)")
    compilation = engine.compilation_config
    mode = getattr(compilation, "cudagraph_mode", None)
    if mode is not None and str(getattr(mode, "name", mode)).upper() == "FULL":
        problems.append("HiSparse does not support cudagraph_mode=FULL")
    if problems:
        raise EngineConfigError("; ".join(problems))
