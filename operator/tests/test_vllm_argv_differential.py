"""Differential property test: the toolkit's ``extraArgs`` check against vLLM 0.33.0's real parser.

For generated extra arguments appended to a rendered decode argv, the engine core's ``owned-flags``
rule (which rebuilds vLLM's parser from its table) and vLLM itself (``FlexibleArgumentParser`` of
``vllm serve`` plus ``AsyncEngineArgs.from_cli_args``) must agree:

- the toolkit accepts  <=>  vLLM parses the argv and builds its engine args, and no extra token is
  read by vLLM as a flag the toolkit renders or forbids;
- the toolkit's restatement of vLLM's argv rewriting (``--model``, ``_``, ``-O``, dotted JSON keys)
  produces exactly the argv vLLM hands to argparse;
- for every accepted argv, each owned setting vLLM ends up with equals what the toolkit rendered.

Values are drawn per option type from the ones the engine core claims to model (see
``vllm_options``' docstring for the limits: config-dataclass options get ``{}`` or broken JSON).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hisparse_operator.api import role_settings, validate
from hisparse_runtime.engine import VLLM_VERSION, render_argv, vllm_options
from hisparse_runtime.engine.constraints import RULES, _dest_rules, _rendered_tokens
from opsupport import EXAMPLES

pytestmark = pytest.mark.vllm
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

FORBIDDEN, OWNED = _dest_rules()
CONTROLLED = set(FORBIDDEN) | set(OWNED)
ACTIONS = vllm_options.table()["actions"]


def _settings():
    d, errors = validate(yaml.safe_load((EXAMPLES / "deepseek-v32-single-node.yaml").read_text()))
    assert not errors and d is not None
    return role_settings(d, "decode")


BASE = _settings()


class _Capture(argparse.ArgumentParser):
    """Sits between FlexibleArgumentParser and argparse: records the argv vLLM hands to argparse."""

    captured: list[list[str]] = []

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        type(self).captured.append(list(args or []))
        return super().parse_args(args, namespace)


@pytest.fixture(scope="module")
def real():
    import vllm  # noqa: F401

    assert importlib.metadata.version("vllm") == VLLM_VERSION
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Hooked(FlexibleArgumentParser, _Capture):
        pass

    parser = FlexibleArgumentParser(prog="vllm")
    parser.add_argument("-v", "--version", action="version", version=VLLM_VERSION)
    serve_parser = ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    parser.__class__ = Hooked
    resolved: list[tuple[str, Any]] = []
    original = serve_parser._parse_optional

    def record(arg_string):
        result = original(arg_string)
        option = result[0] if isinstance(result, list) and len(result) == 1 else result
        resolved.append((arg_string, option[0] if isinstance(option, tuple) else None))
        return result

    serve_parser._parse_optional = record  # type: ignore[method-assign]
    emptied: list[str] = []
    original_values = serve_parser._get_values

    def values(action, arg_strings):
        # argparse (3.11) drops a '--' from an option's attached value and stores [] for a one-value option:
        # a value no type converter saw, which vLLM passes on unchecked (to uvicorn, a config) and which fails
        # only when it is used. vLLM's verdict counts it as a failure; seen here, in argparse's own result.
        result = original_values(action, arg_strings)
        if action.nargs is None and result == []:
            emptied.append(action.option_strings[0] if action.option_strings else action.dest)
        return result

    serve_parser._get_values = values  # type: ignore[method-assign]

    def run(argv: list[str]) -> dict[str, Any]:
        """vLLM's verdict on ``vllm serve ...``: ok, the argv argparse saw, the dests of its options, engine args."""
        _Capture.captured.clear()
        resolved.clear()
        emptied.clear()
        out: dict[str, Any] = {"ok": False, "argparse_argv": None, "dests": [], "engine": None, "error": None}
        try:
            args = parser.parse_args(argv[1:])
            if emptied:
                raise ValueError(f"argparse stored [] for {emptied} (a '--' value dropped): fails when used")
            args.model = args.model_tag
            out["engine"] = AsyncEngineArgs.from_cli_args(args)
            out["namespace"] = vars(args)
            out["ok"] = True
        except SystemExit as exc:
            out["error"] = f"exit {exc.code}"
        except Exception as exc:  # vLLM raises ValueError, IndexError, AssertionError, pydantic errors, ...
            out["error"] = f"{type(exc).__name__}: {exc}"
        if _Capture.captured:
            out["argparse_argv"] = _Capture.captured[0]
            out["resolved"] = list(resolved)
        return out

    return run


# --- argv generation ----------------------------------------------------------------------------------

def _values(a: dict[str, Any]) -> st.SearchStrategy[str]:
    kind = (a["type"] or "str").split(":")[-1]
    good = {"int": ["4", "0", "-1", "1_000"], "float": ["0.5", "-1.5", "3", "nan"], "human_int": ["1k", "2K", "64", "1.5K"],
            "human_int_or_auto": ["auto", "-1", "4k"], "json": ["{}", '{"a": 1}', "[1]"], "dataclass": ["{}"],
            "dict_or_str": ['{"a": "b"}', "plain"], "str": ["abc", "a.b", "-x"], "lower_snake": ["AUTO", "Triton"],
            "device_ids": ["0,1"]}.get(kind, ["abc"])
    bad = {"int": ["x", "1.5"], "float": ["x"], "human_int": ["1.5X"], "json": ["{", "nope"], "dataclass": ["{", "[]"],
           "dict_or_str": ["{bad}"]}.get(kind, [])
    choices = [str(c) for c in a.get("choices") or [] if c is not None][:6]
    if a["type"] and a["type"].startswith("optional:"):
        good = good + ["None", ""]
    if a["kind"] == "lora":
        good, bad = ["name=/path"], ['{"name": "x"}']
    return st.sampled_from(good + bad + choices + ["-1", "--", "stray"])


def _spelling(a: dict[str, Any]) -> st.SearchStrategy[str]:
    options = a["options"]
    longs = [o for o in options if o.startswith("--")]
    forms = [st.sampled_from(options)]
    if longs:
        forms.append(st.sampled_from(longs).map(lambda o: "--" + o[2:].replace("-", "_")))
        forms.append(st.tuples(st.sampled_from(longs), st.integers(3, 40)).map(lambda t: t[0][: max(3, min(t[1], len(t[0])))]))
    return st.one_of(forms)


@st.composite
def option_tokens(draw) -> list[str]:
    interesting = [a for a in ACTIONS if a["dest"] in CONTROLLED or a["kind"] != "store" or a["type"] != "str"]
    a = draw(st.sampled_from(ACTIONS if draw(st.booleans()) else interesting))
    spelled = draw(_spelling(a))
    takes_value = a["nargs"] != 0
    # Dotted keys of config-dataclass options name fields that vLLM validates and the toolkit does not
    # (the documented limit): those get dotted keys only when the toolkit refuses them anyway (owned).
    kind = (a["type"] or "").split(":")[-1]
    dotted = (kind == "json" or (kind == "dataclass" and a["dest"] in CONTROLLED)) and draw(st.booleans())
    if dotted:
        key = spelled + "." + draw(st.sampled_from(["mode", "kv_role", "x_y", "a.b", "list+"]))
        value = draw(st.sampled_from(["3", "kv_producer", "FULL", "1k", "a,b", '{"c": 1}']))
        return [f"{key}={value}"] if draw(st.booleans()) else [key, value]
    if not takes_value:
        return [spelled] if draw(st.integers(0, 5)) else [f"{spelled}=1"]
    count = draw(st.integers(0, 3 if a["nargs"] in ("+", "*") else 1))
    values = [draw(_values(a)) for _ in range(count)]
    if values and draw(st.booleans()):
        return [f"{spelled}={values[0]}", *values[1:]]
    return [spelled, *values]


special = st.sampled_from([["-O3"], ["-O", "2"], ["-O=1"], ["-O"], ["-Odecode"], ["--"], ["--help"], ["-h"], ["--help=all"],
                           ["--version"], ["--config", "x.yaml"], ["--config=x.yaml"], ["--model", "other"], ["stray"], ["-1.5"],
                           ["--served_model_name", "x"], ["@args.txt"], ["--no-such-flag"], ["-x"], ["--max-num-s", "1"], ["--model=x"]])
# Other routes to the effective settings HiSparse decode forbids or the toolkit owns (engine/effective.py),
# with values that reach the setting and values that leave it alone.
routes = st.sampled_from([
    ["--spec-method", "deepseek_mtp"], ["--spec-tokens", "1"], ["--spec_model=x"], ["--spec-method", "None"],
    ["--ubatch-size", "2"], ["--ubatch-size", "1"], ["--ubatch_size=3"],
    ["--kernel-config.moe_backend=aiter"], ["--kernel-config.moe_backend", "triton"], ["--kernel-config.linear_backend=auto"],
    ['--kernel-config={"moe_backend": "auto"}'], ["--hf-overrides.index_topk", "4096"], ['--hf-overrides={"index_topk": 1}'],
    ["--hf-overrides.rope_theta", "1"], ["--device-ids", "0"], ["--device-ids=0,1"], ["--uds", "/tmp/s"],
    ["-O.cudagraph_mode=FULL"], ["-O3"], ["-O", "0"], ["-Ox"], ["-cc.cudagraph_mode=FULL"], ["--hf-config-path", "/c"],
])
extra_args = st.lists(st.one_of(option_tokens(), special, routes), max_size=4).map(lambda parts: [t for p in parts for t in p])


# --- the property ---------------------------------------------------------------------------------------

def _norm(value: Any) -> Any:
    """A config object as its fields, without the random ``engine_id`` vLLM draws per instance."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: v for k, v in dataclasses.asdict(value).items() if k != "engine_id"}
    return value


def _toolkit(extras: list[str]) -> list[Any]:
    s = BASE.model_copy(update={"extra_args": extras})
    return RULES["owned-flags"](s) + RULES["effective-settings"](s)


def _effective_changes(theirs: dict[str, Any], alone: dict[str, Any]) -> list[str]:
    """The effective settings vLLM's own code would build differently from the rendered argv alone."""
    if not theirs["ok"]:
        return []
    from types import SimpleNamespace

    from pydantic import TypeAdapter
    from vllm.config import ParallelConfig
    from vllm.config.vllm import OptimizationLevel
    from vllm.engine import arg_utils

    engine, base, out = theirs["engine"], alone["engine"], []
    # A field argparse left as a bare list where vLLM expects one value (a config object, a number):
    # vLLM's engine fails on it when it starts (create_engine_config reads its attributes).
    unusable = [f.name for f in dataclasses.fields(engine)
                if getattr(engine, f.name) == [] and not isinstance(getattr(base, f.name), (list, tuple, set))]
    if unusable:
        return [f"{', '.join(unusable)} without a value (fails at engine start)"]
    # vLLM's create_speculative_config, with the final SpeculativeConfig (which needs the model) stubbed.
    real_cls, arg_utils.SpeculativeConfig = arg_utils.SpeculativeConfig, lambda **kw: kw  # type: ignore[assignment]
    try:
        if dataclasses.replace(engine).create_speculative_config(None, None) is not None:  # type: ignore[arg-type]
            out.append("speculative config")
    except ValueError:
        out.append("speculative config (refused)")
    finally:
        arg_utils.SpeculativeConfig = real_cls  # type: ignore[assignment]
    if ParallelConfig.use_ubatching.fget(SimpleNamespace(enable_dbo=engine.enable_dbo, ubatch_size=engine.ubatch_size)):
        out.append("ubatching")
    if engine.kernel_config.moe_backend != base.kernel_config.moe_backend:
        out.append("moe backend")
    from hisparse_runtime.engine.effective import MODEL_FACTS

    overrides = engine.hf_overrides if isinstance(engine.hf_overrides, dict) else {}
    if set(overrides) & set(MODEL_FACTS) or engine.hf_config_path:
        out.append("model facts")
    if engine.device_ids:
        out.append("device ids")
    if theirs["namespace"].get("uds"):
        out.append("listener")
    try:
        TypeAdapter(OptimizationLevel).validate_python(engine.optimization_level)
    except Exception:
        out.append("optimization level (refused by VllmConfig)")
    return out


RENDERED = ["vllm", *[t.text for t in _rendered_tokens(BASE)]]


@pytest.fixture(scope="module")
def rendered_alone(real):
    verdict = real(RENDERED)
    assert verdict["ok"], verdict["error"]
    return verdict


@settings(max_examples=int(os.environ.get("HISPARSE_ARGV_EXAMPLES", "120")), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(extras=extra_args)
@example(extras=["--h11-max-incomplete-event-size=--"])  # a frontend option: nothing in vLLM checks it
@example(extras=["--no-enable-dbo"])
@example(extras=["--kv-transfer-config.kv_role", "kv_producer"])
@example(extras=["-cc.cudagraph_mode=FULL"])
@example(extras=["--max-num-seqs", "-1.5"])
@example(extras=["--enable-d"])
@example(extras=["--config", "x.yaml"])
@example(extras=["--max_num_seqs=8", "-O3", "--enforce-eager"])
@example(extras=["--dtype", "half", "--max-num-batched-tokens", "8k"])
@example(extras=["--spec-method", "deepseek_mtp", "--spec-tokens", "1"])
@example(extras=["--ubatch-size", "2"])
@example(extras=["--hf-overrides.index_topk", "4096"])
@example(extras=["--kernel-config.moe_backend=aiter"])
@example(extras=["--device-ids", "0,1"])
@example(extras=["--uds", "/tmp/s"])
@example(extras=["-O.cudagraph_mode=FULL"])
@example(extras=["--ubatch-size", "1", "-O3", "--hf-overrides.rope_theta", "1"])
@example(extras=["--kernel-config=--"])
@example(extras=["--max-num-seqs=--"])
def test_toolkit_and_vllm_agree(real, rendered_alone, extras):
    argv = RENDERED + extras
    mine = _toolkit(extras)
    theirs = real(argv)
    tokens = [vllm_options.Token(t) for t in RENDERED[1:]] + [vllm_options.Token(t, ("extraArgs", i)) for i, t in enumerate(extras)]
    try:
        processed = vllm_options.preprocess(tokens)
    except vllm_options.Refused:
        processed = None
    if theirs["argparse_argv"] is not None and processed is not None:
        assert [t.text for t in processed] == theirs["argparse_argv"], "vLLM rewrote the argv differently"
    elif processed is not None and theirs["argparse_argv"] is None:
        pytest.fail(f"vLLM refused before argparse ({theirs['error']}), the toolkit's rewriting did not")
    touched = []
    if processed is not None and theirs["argparse_argv"] is not None:
        seen = iter(theirs["resolved"])
        for tok in processed[1:]:
            if tok.text == "--":
                break
            text, action = next(seen, (None, None))
            if text != tok.text:
                break
            if action is not None and tok.origin is not None and action.dest in CONTROLLED:
                touched.append((tok.text, action.dest))
    vllm_accepts = theirs["ok"] and not touched and not _effective_changes(theirs, rendered_alone)
    assert (not mine) == vllm_accepts, (
        f"extras {extras}: toolkit {[v.message for v in mine] or 'accepts'}; vLLM ok={theirs['ok']} "
        f"error={theirs['error']} owned flags touched={touched} "
        f"effective settings changed={_effective_changes(theirs, rendered_alone)}")
    if vllm_accepts:
        base_ns, ns = rendered_alone["namespace"], theirs["namespace"]
        for dest in CONTROLLED:
            assert _norm(ns.get(dest)) == _norm(base_ns.get(dest)), f"{dest} changed by {extras}"
            if hasattr(theirs["engine"], dest):
                assert _norm(getattr(theirs["engine"], dest)) == _norm(getattr(rendered_alone["engine"], dest)), dest


def test_the_differential_test_can_fail(real):
    """Both verdicts are real: vLLM refuses a bad value and reads a hidden spelling as an owned flag."""
    assert not real(RENDERED + ["--max-num-seqs", "x"])["ok"]
    verdict = real(RENDERED + ["--no-enable-dbo"])
    assert verdict["ok"] and verdict["namespace"]["enable_dbo"] is False
    assert _toolkit(["--no-enable-dbo"]) and not _toolkit(["--max-num-seqs", "8"])
    assert json.loads(json.dumps(render_argv(BASE)))  # the rendered argv is plain strings
    # The effective-setting verdict is vLLM's: each route changes what its own code builds.
    for extras, what in [(["--spec-tokens", "1"], "speculative config"), (["--ubatch-size", "2"], "ubatching"),
                         (["--device-ids", "0"], "device ids"), (["--kernel-config.moe_backend=triton"], "moe backend")]:
        assert what in _effective_changes(real(RENDERED + extras), real(RENDERED)), extras
    assert _effective_changes(real(RENDERED + ["--ubatch-size", "1"]), real(RENDERED)) == []
