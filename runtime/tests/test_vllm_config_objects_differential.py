"""Config-object options (``--compilation-config``, ``--kv-transfer-config``, ... : every option whose value
vLLM 0.33 validates with one of its config dataclasses) judged by the engine core against vLLM's own parser.

Generated JSON objects, made of each class's field names, unknown names and values of every JSON kind
(numbers in strings, pydantic's boolean words, the field's own choices), go through the engine core's
converter (the class's JSON schema, generated from vLLM into ``vllm_serve_options.json``) and through the
converter vLLM's ``serve`` parser registers for that option (``TypeAdapter(cls).validate_json``). Required:

- what the engine core refuses, vLLM refuses (it is never stricter than vLLM);
- what vLLM refuses at a field, the engine core refuses, except at the fields the table leaves to vLLM
  (a validator of vLLM's own) and for rules across fields (``__post_init__``, model validators), which a
  field-by-field check does not restate.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hisparse_runtime.engine import vllm_options

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
pytestmark = pytest.mark.vllm

SCHEMAS: dict[str, Any] = vllm_options.table()["config_objects"]["schemas"]
POOL: list[Any] = [0, 1, -1, 7, 2**40, 0.5, 1.0, -2.5, "x", "1", "1.0", "2.5", " 3 ", "+3", "1_000", ".5", "1e3", "inf",
                   "true", "yes", "off", "On", "T", "", "auto", True, False, None, [], [1, 2], ["a"], {}, {"a": 1}]


def _choices(node: Any) -> list[Any]:
    """Every enum value and const in a schema: the values a field's choices are made of."""
    if isinstance(node, list):
        return [v for n in node for v in _choices(n)]
    if not isinstance(node, dict):
        return []
    own = list(node.get("enum", [])) + ([node["const"]] if "const" in node else [])
    return own + [v for k, n in node.items() if k not in ("enum", "const") for v in _choices(n)]


@pytest.fixture(scope="module")
def vllm_converters() -> dict[str, Any]:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    out = {a.dest: a for a in serve._actions if a.dest in SCHEMAS}
    assert set(out) == set(SCHEMAS), "every config-object option of vLLM's parser has a schema in the table"
    return out


def _class_of(action: Any) -> Any:
    fn = action.type
    while not getattr(fn, "__qualname__", "").endswith("parse_dataclass"):
        names = fn.__code__.co_freevars
        fn = fn.__closure__[names.index("return_type")].cell_contents
    return fn.__defaults__[0]


def _vllm(action: Any, text: str) -> tuple[bool, list[tuple[Any, ...]]]:
    """(accepted, the locations of the field errors pydantic reports); a rule across fields reports ()."""
    from pydantic import TypeAdapter, ValidationError

    try:
        action.type(text)
        return True, []
    except argparse.ArgumentTypeError:
        try:
            TypeAdapter(_class_of(action)).validate_json(text)
        except ValidationError as exc:
            return False, [tuple(e["loc"]) for e in exc.errors()]
        return False, [()]
    except Exception:  # noqa: BLE001 - a __post_init__ raising something else: a rule across fields
        return False, [()]


def _ours(dest: str, text: str) -> bool:
    try:
        vllm_options._converter("dataclass", dest)(text)
        return True
    except argparse.ArgumentTypeError:
        return False


def _quoted_bounded_number(dest: str, obj: dict[str, Any]) -> bool:
    """Whether ``obj`` writes a number as a string in a field whose number has bounds."""
    bounds = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
    props = SCHEMAS[dest]["schema"].get("properties", {})

    def bounded(schema: dict[str, Any]) -> bool:
        if schema.get("type") in ("integer", "number") and bounds & set(schema):
            return True
        return any(bounded(b) for b in schema.get("anyOf", []))

    return any(isinstance(v, str) and bounded(props.get(k, {})) for k, v in obj.items())


@st.composite
def config_objects(draw) -> tuple[str, dict[str, Any]]:
    dest = draw(st.sampled_from(sorted(SCHEMAS)))
    schema = SCHEMAS[dest]["schema"]
    fields = sorted(schema.get("properties", {})) + ["not_a_field"]
    values = POOL + _choices(schema)
    obj = draw(st.dictionaries(st.sampled_from(fields), st.sampled_from(values), max_size=3))
    return dest, obj


def test_config_objects_are_judged_field_by_field_as_vllm_judges_them(vllm_converters) -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=1500, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(config_objects())
    def check(case: tuple[str, dict[str, Any]]) -> None:
        dest, obj = case
        text = json.dumps(obj)
        ours = _ours(dest, text)
        theirs, locs = _vllm(vllm_converters[dest], text)
        left = {f.split(".", 1)[1] for f in SCHEMAS[dest]["left_to_vllm"]}
        if not ours:
            if theirs:
                # The one spelling the check is stricter on: a bounded number written as a string.
                assert _quoted_bounded_number(dest, obj), f"--{dest} {text}: refused here, vLLM's parser accepts it"
                seen["a quoted bounded number"] += 1
                return
            seen["refused by both"] += 1
        elif theirs:
            seen["accepted by both"] += 1
        else:
            at_fields = [loc for loc in locs if loc and not (set(map(str, loc)) & left)]
            assert not at_fields, f"--{dest} {text}: vLLM refuses it at {at_fields}, accepted here"
            seen["left to vLLM"] += 1

    check()
    assert seen["refused by both"] >= 200 and seen["accepted by both"] >= 100, dict(seen)


def test_the_comparison_can_disagree(vllm_converters) -> None:
    """The oracle is vLLM's: a value of the wrong type is refused by both, a unknown field by both, and
    with the field's schema opened, the engine core would accept what vLLM refuses."""
    text = json.dumps({"kv_role": 3})
    assert not _ours("kv_transfer_config", text) and not _vllm(vllm_converters["kv_transfer_config"], text)[0]
    text = json.dumps({"bogus": 1})
    assert not _ours("eplb_config", text) and not _vllm(vllm_converters["eplb_config"], text)[0]
    saved = SCHEMAS["kv_transfer_config"]["schema"]["properties"]["kv_role"]
    try:
        SCHEMAS["kv_transfer_config"]["schema"]["properties"]["kv_role"] = {}
        vllm_options._config_validator.cache_clear()
        assert _ours("kv_transfer_config", json.dumps({"kv_role": 3}))
    finally:
        SCHEMAS["kv_transfer_config"]["schema"]["properties"]["kv_role"] = saved
        vllm_options._config_validator.cache_clear()
