"""The settings vLLM 0.33 would build from the whole argv and environment, judged by the HiSparse rules.

A rule forbids a setting, not a flag: ``--spec-method`` feeds the speculative config as much as
``--speculative-config`` does, ``--ubatch-size 2`` turns on the micro-batching ``--enable-dbo`` does
(``use_ubatching = enable_dbo or ubatch_size > 1``). Which argparse destinations feed each setting is
read from vLLM's own functions by ``scripts/gen-vllm-options`` (the table's ``effective`` section);
:data:`HANDLED` says, for every one of them, how the engine core judges it, and a test fails when the
table names a destination that is not here. Listed by hand, because vLLM builds them outside
``EngineArgs`` (in the API server or from variables): the listener (``--uds``), the optimization level's
values, ``VLLM_BATCH_INVARIANT`` and the container runtime's ``NVIDIA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from . import moe, vllm_options
from .role import RoleSettings

HANDLED: Final[dict[str, dict[str, str]]] = {
    "speculative": {
        "speculative_config": "owned (speculativeConfig)",
        "spec_method": "set: speculative decoding on", "spec_model": "set: speculative decoding on",
        "spec_tokens": "set: speculative decoding on",
    },
    "ubatching": {"enable_dbo": "owned (enableDbo)", "ubatch_size": "above 1: DBO's micro-batching"},
    "device_selection": {
        "device_ids": "refused: GPUs come from the pod's allotment",
        "distributed_executor_backend": "not a selection: read only to warn that --device-ids has no effect under Ray",
    },
    "moe_backend": {"moe_backend": "owned (moeBackend)", "kernel_config": "field moe_backend: owned (moeBackend)"},
    "hf_config": {"hf_overrides": "keys that are model facts: owned", "hf_config_path": "refused: replaces the config the facts come from"},
}
"""For each effective setting of the table, every destination vLLM reads to build it, and how it is judged."""

MODEL_FACTS: Final[dict[str, str]] = {
    "index_topk": "spec.model.indexTopk", "index_topk_freq": "spec.model.indexTopkFreq",
    "indexer_types": "spec.model.indexerTypes", "architectures": "spec.model.architecture",
}
"""``config.json`` keys the toolkit's typed model fields state (the hot-buffer, KV and MoE rules use them)."""

BATCH_INVARIANT: Final = "VLLM_BATCH_INVARIANT"

RULE_NAMES: Final = frozenset({"no-speculative-decoding", "no-dbo", "device-selection", "owned-flags", "listener",
                               "optimization-level", "cudagraph-mode", "batch-invariance"})
"""The rules the ``effective-settings`` check reports under (the typed fields' own rules where one exists)."""

MAX_ARG_STRLEN: Final = 131072
"""Linux's limit on one argv or environment string, NUL included (``MAX_ARG_STRLEN`` = 32 pages):
``execve`` fails with E2BIG past it, whatever the stack limit."""

MAX_EXEC_BYTES: Final = 1 << 20
"""Bound on the rendered argv plus environment, counted as ``execve`` does (each string, its NUL and its
pointer). Linux allows a quarter of the stack limit (2 MiB under the usual 8 MiB); half of that is left
for what Kubernetes and the image add to the environment (service links, ``ENV``), and 1 MiB is also the
ConfigMap limit of the engine settings the argv is rendered from."""


@dataclass(frozen=True)
class Finding:
    rule: str
    origin: tuple[Any, ...] | None
    message: str


def _last(parsed: vllm_options.Parsed, dest: str) -> vllm_options.Token | None:
    """The user's token that set ``dest`` last (a dotted key reaches argparse as the merged option), or None."""
    toks = [t for t, d in parsed.options if d == dest and t.origin is not None]
    return toks[-1] if toks else None


_LOCAL = threading.local()  # this check's arguments as written, by origin (checks run in several threads)


def _spelled(tok: vllm_options.Token) -> str:
    """The argument as the user wrote it (vLLM's rewriting turns ``-O.x=y`` into ``--optimization-level``)."""
    written = getattr(_LOCAL, "originals", {}).get(tok.origin, tok.text)
    return repr(written) + ("" if written == tok.text or written.startswith(tok.text) else f" (vLLM reads it as {tok.text})")


def cudagraph_mode_problem(value: Any) -> str | None:
    """Why vLLM's ``CompilationConfig`` refuses this ``cudagraph_mode`` (its before-validator upper-cases
    strings to an enum name; other values must be an enum value), or None."""
    modes = vllm_options.table()["config_objects"]["cudagraph_modes"]
    if isinstance(value, str):
        return None if value.upper() in modes else f"{value!r} is not a CUDAGraphMode name ({', '.join(modes)}; any case)"
    if isinstance(value, int) and not isinstance(value, bool) and value in modes.values():
        return None
    return f"{value!r} is neither a CUDAGraphMode name ({', '.join(modes)}) nor one of its integers (0, 1, 2)"


def cudagraph_mode_name(value: Any) -> str | None:
    modes = vllm_options.table()["config_objects"]["cudagraph_modes"]
    if isinstance(value, str) and value.upper() in modes:
        return value.upper()
    return next((n for n, v in modes.items() if v == value and isinstance(value, int) and not isinstance(value, bool)), None)


def compilation_config_problems(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, why) for what vLLM's CompilationConfig refuses in a typed compilation config."""
    known = set(vllm_options.table()["config_objects"]["fields"]["compilation_config"])
    out = [(k, f"{k!r} is not a field of vLLM's CompilationConfig (it forbids unknown fields)") for k in config if k not in known]
    if "cudagraph_mode" in config and config["cudagraph_mode"] is not None:
        problem = cudagraph_mode_problem(config["cudagraph_mode"])
        if problem:
            out.append(("cudagraph_mode", problem))
    return out


def _speculative(s: RoleSettings, parsed: vllm_options.Parsed) -> Iterable[Finding]:
    for dest in ("spec_method", "spec_model", "spec_tokens"):
        tok = _last(parsed, dest)
        if tok is None or parsed.values.get(dest) is None:
            continue
        flag, value = vllm_options.long_of(dest), parsed.values[dest]
        fed = f"{_spelled(tok)} sets {flag} {value!r}, which vLLM folds into its speculative config (EngineArgs.create_speculative_config)"
        if s.hisparse_on:
            yield Finding("no-speculative-decoding", tok.origin,
                f"{fed}: speculative decoding is not supported with HiSparse decode (draft tokens would need hot-buffer rows "
                "the resolver never planned); remove it")
        else:
            yield Finding("owned-flags", tok.origin,
                f"{fed}, which the toolkit renders from speculativeConfig; set speculativeConfig "
                "(e.g. {\"method\": ..., \"num_speculative_tokens\": ...}) instead of passing it")


def _ubatching(s: RoleSettings, parsed: vllm_options.Parsed) -> Iterable[Finding]:
    tok, size = _last(parsed, "ubatch_size"), parsed.values.get("ubatch_size")
    if s.hisparse_on and tok is not None and isinstance(size, int) and size > 1:
        yield Finding("no-dbo", tok.origin,
            f"{_spelled(tok)} sets --ubatch-size {size}: vLLM micro-batches whenever ubatch_size > 1 "
            "(ParallelConfig.use_ubatching = enable_dbo or ubatch_size > 1), which is dual batch overlap by another name, "
            "and it is not supported with HiSparse decode; remove it (or use --ubatch-size 1)")


def _devices(parsed: vllm_options.Parsed) -> Iterable[Finding]:
    tok = _last(parsed, "device_ids")
    if tok is not None and parsed.values.get("device_ids"):
        yield Finding("device-selection", tok.origin,
            f"{_spelled(tok)} makes vLLM pick GPUs {parsed.values['device_ids']} itself instead of the ones Kubernetes "
            "allotted the pod: the engine would run on other GPUs or fail to find them; remove it "
            "(each pod uses exactly its parallelism.gpusPerNode GPUs)")


def _config_object(parsed: vllm_options.Parsed, dest: str) -> tuple[vllm_options.Token | None, Any]:
    """The token and merged value of a config-object option, whether given as JSON or as dotted keys."""
    tok = _last(parsed, dest)
    return tok, parsed.values.get(dest)


def _moe(s: RoleSettings, parsed: vllm_options.Parsed) -> Iterable[Finding]:
    tok, config = _config_object(parsed, "kernel_config")
    if tok is None or not isinstance(config, dict) or "moe_backend" not in config:
        return
    value = config["moe_backend"]
    backend = str(value).lower().replace("-", "_")
    if backend == (moe.moe_backend(s) or "auto"):
        return  # what the render makes effective anyway: no second value
    why = ""
    if backend in moe.MoEBackend.__args__:  # type: ignore[attr-defined]
        problems = moe.problems(s.model_copy(update={"moe_backend": backend}))
        why = f"; the moeBackend rule refuses this value too: {'; '.join(problems)}" if problems else ""
    yield Finding("owned-flags", tok.origin,
        f"{_spelled(tok)} sets kernel_config.moe_backend {value!r}, the MoE backend the toolkit renders from moeBackend "
        f"and checks for the GPU family and model; a second value would silently win over the rendered one{why}. "
        "Set moeBackend instead of passing it")


def _hf_config(parsed: vllm_options.Parsed) -> Iterable[Finding]:
    tok, overrides = _config_object(parsed, "hf_overrides")
    if tok is not None and isinstance(overrides, dict):
        for key in [k for k in overrides if k in MODEL_FACTS] + [
                k for k in (overrides.get("text_config") or {}) if isinstance(overrides.get("text_config"), dict) and k in MODEL_FACTS]:
            yield Finding("owned-flags", tok.origin,
                f"{_spelled(tok)} overrides the model's {key} through hf_overrides; the toolkit states it in "
                f"{MODEL_FACTS[key]} and sizes the hot buffer and the KV layout by it, so vLLM would run with a "
                f"different value than every check here assumed (a top-k above deviceBufferSize exits at startup): "
                f"set {MODEL_FACTS[key]} instead and remove the override")
    tok = _last(parsed, "hf_config_path")
    if tok is not None and parsed.values.get("hf_config_path"):
        yield Finding("owned-flags", tok.origin,
            f"{_spelled(tok)} makes vLLM read the model's config from another path, so the model facts the toolkit "
            "checks (spec.model.indexTopk, architecture, indexer types) would not be the ones served; remove it")


def _listener(s: RoleSettings, parsed: vllm_options.Parsed) -> Iterable[Finding]:
    tok = _last(parsed, "uds")
    if tok is not None and parsed.values.get("uds"):
        yield Finding("listener", tok.origin,
            f"{_spelled(tok)} makes vLLM serve on a Unix socket and leave its TCP port {s.vllm_port}, which the readiness "
            "probes (and on decode the llm-d sidecar) connect to: the pod would never become ready; remove it")


def _optimization_level(s: RoleSettings, parsed: vllm_options.Parsed) -> Iterable[Finding]:
    tok, value = _last(parsed, "optimization_level"), parsed.values.get("optimization_level")
    if tok is None or value is None:
        return
    levels = vllm_options.table()["config_objects"]["optimization_levels"]
    if re.fullmatch(r"[0-9]", str(value)) and int(value) in levels:
        return
    hint = (" In vLLM 0.33 every '-O...' token is the optimization level: '-O.x' is not a compilation-config key, so"
            f" {str(value).lstrip('.')!r} never reaches the compilation config." if str(value).startswith(".") else "")
    fix = ("set compilationConfig (cudagraph_mode FULL is refused with HiSparse; FULL_AND_PIECEWISE, the default, "
           "already captures full decode graphs)" if "cudagraph" in str(value) else f"use -O0 to -O{max(levels)}")
    yield Finding("optimization-level", tok.origin,
        f"{_spelled(tok)} sets --optimization-level {value!r}, but vLLM's VllmConfig accepts only "
        f"{', '.join(map(str, levels))} and exits at startup: the pod would crash-loop.{hint} Instead {fix}")


def _compilation_fields(s: RoleSettings, parsed: vllm_options.Parsed) -> Iterable[Finding]:
    """``--compilation-config`` is owned (refused by owned-flags); its fields still get their own rule."""
    tok, config = _config_object(parsed, "compilation_config")
    if tok is not None and isinstance(config, dict) and s.hisparse_on and cudagraph_mode_name(config.get("cudagraph_mode")) == "FULL":
        yield Finding("cudagraph-mode", tok.origin,
            f"{_spelled(tok)} sets compilation_config.cudagraph_mode FULL: HiSparse does not support cudagraph_mode=FULL "
            "(vLLM exits at startup); remove it and keep compilationConfig's default FULL_AND_PIECEWISE, which still "
            "captures full graphs for decode batches")


def argv_findings(s: RoleSettings, parsed: vllm_options.Parsed) -> list[Finding]:
    """Every effective-setting rule on a parsed argv (the rendered one plus the extra arguments)."""
    _LOCAL.originals = {**{("engine", "extraArgs", i): a for i, a in enumerate(s.engine.extra_args)},
                        **{("extraArgs", i): a for i, a in enumerate(s.extra_args)}}
    return [*_speculative(s, parsed), *_ubatching(s, parsed), *_devices(parsed), *_moe(s, parsed), *_hf_config(parsed),
            *_listener(s, parsed), *_optimization_level(s, parsed), *_compilation_fields(s, parsed)]


def env_findings(s: RoleSettings, base: tuple[Any, ...], env: dict[str, str]) -> list[Finding]:
    value = env.get(BATCH_INVARIANT)
    if value is None:
        return []
    path = (*base, BATCH_INVARIANT)
    try:
        on = bool(int(value))
    except ValueError:
        return [Finding("batch-invariance", path,
            f"{BATCH_INVARIANT}={value!r}: vLLM reads it as an integer (int(...)) and fails at startup on anything else; "
            "use 0 or remove it")]
    if on and s.hisparse_on:
        return [Finding("batch-invariance", path,
            f"{BATCH_INVARIANT}={value}: vLLM 0.33 offers batch invariance only for attention backends with "
            "supports_batch_invariance, and the sparse MLA backends HiSparse decode runs on lack it, so vLLM refuses to "
            "start and the pod crash-loops; remove it (parity tolerates near-ties instead)")]
    return []


def exec_findings(s: RoleSettings, argv: list[str], env: list[dict[str, Any]],
                  origins: dict[int, tuple[Any, ...]], env_base: dict[str, tuple[Any, ...]]) -> list[Finding]:
    """The rendered ``execve`` must fit Linux's limits: each string below MAX_ARG_STRLEN, all below MAX_EXEC_BYTES."""
    out, total = [], 0
    for i, arg in enumerate(argv):
        size = len(arg.encode()) + 1
        total += size + 8
        if size > MAX_ARG_STRLEN:
            out.append(Finding("exec-limits", origins.get(i),
                f"argument {i} of the vllm command line is {size - 1} bytes ({arg[:40]!r}...): Linux refuses to exec a "
                f"program with a single argument of {MAX_ARG_STRLEN} bytes or more (MAX_ARG_STRLEN, NUL included), so the "
                "container would fail to start; shorten it (pass a large value through a file the image reads)"))
    for e in env:
        if "value" not in e:
            continue
        item = f"{e['name']}={e['value']}"
        size = len(item.encode()) + 1
        total += size + 8
        if size > MAX_ARG_STRLEN:
            out.append(Finding("exec-limits", env_base.get(e["name"]),
                f"{e['name']} is {size - 1} bytes as NAME=value: Linux refuses to exec with a single environment string of "
                f"{MAX_ARG_STRLEN} bytes or more (MAX_ARG_STRLEN), so the container would fail to start; shorten it"))
    if total > MAX_EXEC_BYTES and not out:
        out.append(Finding("exec-limits", None,
            f"the vllm command line and environment take {total} bytes as execve counts them, above the {MAX_EXEC_BYTES} "
            "this toolkit allows (half of Linux's 2 MiB under the usual 8 MiB stack limit, leaving room for what "
            "Kubernetes adds): the container could fail to start with E2BIG; shorten extraArgs / extraEnv"))
    return out


__all__ = ["HANDLED", "RULE_NAMES", "MODEL_FACTS", "MAX_ARG_STRLEN", "MAX_EXEC_BYTES", "Finding", "argv_findings", "env_findings",
           "exec_findings", "cudagraph_mode_problem", "cudagraph_mode_name", "compilation_config_problems"]
