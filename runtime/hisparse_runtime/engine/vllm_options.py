"""vLLM 0.33's ``vllm serve`` command line, rebuilt from its own parser, for checking ``extraArgs``.

vLLM is not installed where the operator runs, so ``vllm_serve_options.json`` (generated from the
installed vLLM by ``scripts/gen-vllm-options``; a test fails when it is stale) records its parser:
every option string it registers (hidden ones such as ``--no-enable-x`` too), each action's kind,
value count, value conversion and choices, and the top-level ``vllm`` options. From it this module
rebuilds a *standard-library argparse parser* with the same settings, so the parts of vLLM's
behaviour that are argparse's (abbreviations, ``--flag=value``, ``nargs``, negative numbers, ``--``,
ambiguity, choices, "invalid int value") are argparse's own code, not a re-implementation.

What vLLM's ``FlexibleArgumentParser.parse_args`` does before argparse sees the argv is restated
here step by step, in the same order: ``--model`` moved to the positional, ``--config FILE``
inlined, ``_`` -> ``-`` in names, ``-O3``/``-O=3``/``-O 3`` -> ``--optimization-level``, dotted JSON
keys (``--kv-transfer-config.kv_role x``, ``-cc.mode=3``, ``--x.list+ a,b``) merged into one JSON
argument appended at the end. Every token keeps its origin, so an error or an owned setting is
reported at the ``extraArgs[i]`` that caused it.

Values of options whose type is one of vLLM's config dataclasses (``--compilation-config``,
``--kv-transfer-config``, ... and their dotted keys) are validated field by field against the class's
JSON schema, generated from vLLM's pydantic class with pydantic's lax spellings (``"3"`` for 3, ``"yes"``
for true): unknown fields, wrong types and choices, nested objects included
(``runtime/tests/test_vllm_config_objects_differential.py`` compares every verdict with vLLM's parser).
The fields the toolkit owns or forbids in them (``kernel_config.moe_backend``, ``hf_overrides`` model
facts, ``compilation_config.cudagraph_mode``) are judged by ``effective``.

Limits, stated so nobody relies on more: a field with a validator of its own in vLLM (the table's
``left_to_vllm``) is checked for its type at most, and rules across fields (``__post_init__``, model
validators) are vLLM's; a bounded number written as a string (``"8"`` where vLLM wants ``> 0``) is
refused here though vLLM would take it (write the number); ``--lora-modules`` JSON items are checked for
their field names; what vLLM checks after parsing (``validate_parsed_serve_args``, ``VllmConfig``) is
not restated here except where a HiSparse rule mirrors it.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Final

TABLE_FILE: Final = "vllm_serve_options.json"

Origin = tuple[Any, ...] | None
"""Where a token came from: ``None`` for the toolkit's rendered argv, else a field path such as
``("extraArgs", 3)``."""


@functools.cache
def table() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath(TABLE_FILE).read_text())


@functools.cache
def _by_option() -> dict[str, dict[str, Any]]:
    return {o: a for a in table()["actions"] for o in a["options"]}


def dest_of(flag: str) -> str:
    """The argparse ``dest`` of a flag spelled exactly as vLLM registers it."""
    return _by_option()[flag]["dest"]


def long_of(dest: str) -> str:
    """The first long spelling of ``dest`` (what messages show)."""
    for a in table()["actions"]:
        if a["dest"] == dest:
            return next((o for o in a["options"] if o.startswith("--")), a["options"][0])
    raise KeyError(dest)


def known_environment_variables() -> frozenset[str]:
    """Every variable vLLM 0.33 reads through ``vllm.envs``."""
    return frozenset(table()["environment_variables"])


# --- value conversions (the names scripts/gen-vllm-options writes) ---------------------------------


def _human_int(value: str) -> int:
    """vLLM's ``human_readable_int``: ``1k`` = 1000, ``1K`` = 1024, decimals only with k/m/g/t."""
    value = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        if suffix in "kmgt":
            return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
        try:
            return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"decimals are not allowed with binary suffix {suffix}") from None
    return int(value)


def _human_int_or_auto(value: str) -> int:
    value = value.strip()
    return -1 if value == "-1" or value.lower() == "auto" else _human_int(value)


def _expand_json_numbers(value: str) -> str:
    """vLLM expands ``80g`` inside JSON config values (outside strings) before validating them."""
    parts = re.split(r'("(?:[^"\\]|\\.)*")', value)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b", lambda m: str(_human_int(m.group())), parts[i])
    return "".join(parts)


def _config_object(value: str) -> dict[str, Any]:
    parsed = json.loads(_expand_json_numbers(value))
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(parsed).__name__}")
    return parsed


def _dict_or_str(value: str) -> Any:
    if not re.match(r"(?s)^\s*{.*}\s*$", value):
        return value
    return None if value in ("", "None") else json.loads(value)


def _device_ids(value: str) -> list[int | str]:
    return [int(p) if p.isdigit() else p for p in (part.strip() for part in value.split(","))]


_BASE_TYPES: Final[dict[str, Callable[[str], Any]]] = {
    "str": str, "int": int, "float": float, "json": json.loads, "human_int": _human_int,
    "human_int_or_auto": _human_int_or_auto, "dict_or_str": _dict_or_str, "dataclass": _config_object,
    "lower_snake": lambda s: s.lower().replace("-", "_"), "device_ids": _device_ids,
}


@functools.cache
def _config_validator(dest: str) -> Any:
    """A JSON-schema validator of the config object behind ``dest`` (the table's ``config_objects.schemas``)."""
    import jsonschema

    return jsonschema.Draft202012Validator(table()["config_objects"]["schemas"][dest]["schema"])


def _config_object_of(dest: str) -> Callable[[str], dict[str, Any]]:
    """``--x-config JSON`` as vLLM's ``parse_dataclass`` reads it: a JSON object that its config class
    validates field by field (types in pydantic's lax spellings, choices, no unknown fields, nested objects
    too). Fields with a validator of their own, and rules across fields, are left to vLLM (the table says
    which)."""
    entry = table()["config_objects"]["schemas"].get(dest)

    def convert(value: str) -> dict[str, Any]:
        parsed = _config_object(value)
        if entry is None:
            return parsed
        errors = sorted(_config_validator(dest).iter_errors(parsed), key=lambda e: list(e.absolute_path))
        if errors:
            raise argparse.ArgumentTypeError("; ".join(_schema_error(entry["class"], e) for e in errors[:3]))
        return parsed

    return convert


_JSON_TYPES: Final = {"integer": "an integer", "number": "a number", "boolean": "a boolean", "string": "a string",
                      "array": "an array", "object": "an object", "null": "null"}


def _accepted(schema: dict[str, Any]) -> list[str]:
    """What a (lax) field schema takes, in words: its JSON types and choices, not the lax spellings."""
    if "anyOf" in schema:
        return [w for branch in schema["anyOf"] if branch.get("$comment") != "pydantic lax" for w in _accepted(branch)]
    if "enum" in schema:
        return [f"one of {', '.join(repr(v) for v in schema['enum'])}"]
    if "const" in schema:
        return [repr(schema["const"])]
    kind = schema.get("type")
    return [_JSON_TYPES.get(k, k) for k in (kind if isinstance(kind, list) else [kind])] if kind else ["a valid value"]


def _schema_error(cls: str, error: Any) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "(the object)"
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return f"vLLM's {cls} has no field {', '.join(repr(e) for e in extra)} at {where} (it forbids unknown fields)"
    if error.validator in ("anyOf", "type", "enum", "const"):
        accepted = " or ".join(dict.fromkeys(_accepted(error.schema)))
        return f"vLLM's {cls} refuses {error.instance!r} at {where}: it must be {accepted}"
    return f"vLLM's {cls} refuses {error.instance!r} at {where}: {error.message}"


def _converter(name: str, dest: str = "") -> Callable[[str], Any]:
    if name.startswith("optional:"):
        inner = _converter(name.removeprefix("optional:"), dest)
        return lambda v: None if v in ("", "None") else inner(v)
    if name == "dataclass":
        return _config_object_of(dest)
    if name.startswith("parse:"):
        return _converter(name.removeprefix("parse:"), dest)  # vLLM only re-raises the ValueError as ArgumentTypeError
    return _BASE_TYPES[name]


# --- the rebuilt parser ----------------------------------------------------------------------------


class Refused(Exception):
    """vLLM would exit (or raise) on this argv before serving; ``str()`` is why."""

    def __init__(self, message: str, origin: Origin = None) -> None:
        super().__init__(message)
        self.origin = origin


class Unverifiable(Refused):
    """vLLM would read more arguments from somewhere no check can see (``--config FILE``)."""


class _Boolean(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, negative: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.negative = frozenset(negative)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, option_string not in self.negative)


class _Exit(argparse.Action):
    """``--help`` and ``--version``: vLLM prints and exits instead of serving."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        raise Refused(f"{option_string} prints a text and exits instead of serving")


class _Parser(argparse.ArgumentParser):
    """argparse with vLLM's settings whose errors raise and which records how it read each token."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resolved: list[tuple[str, argparse.Action | None]] = []

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise Refused(message)

    def _parse_optional(self, arg_string: str) -> Any:
        result = super()._parse_optional(arg_string)
        option = result[0] if isinstance(result, list) and len(result) == 1 else result  # 3.12 returns a list
        self.resolved.append((arg_string, option[0] if isinstance(option, tuple) else None))
        return result


def _add(parser: argparse.ArgumentParser, a: dict[str, Any]) -> None:
    kind, options = a["kind"], a["options"]
    common: dict[str, Any] = {"dest": a["dest"], "default": argparse.SUPPRESS}
    if kind == "boolean":
        parser.add_argument(*options, action=_Boolean, negative=a.get("negative", ()), **common)
    elif kind in ("help", "version"):
        parser.add_argument(*options, action=_Exit, dest=a["dest"])
    elif kind in ("store_true", "store_false"):
        parser.add_argument(*options, action=kind, **common)
    elif kind == "count":
        parser.add_argument(*options, action="count", **common)
    else:  # store, append, lora (a store of nargs "+" whose items are checked after parsing)
        kwargs: dict[str, Any] = {"type": _converter(a["type"] or "str", a["dest"])}
        if a["nargs"] is not None:
            kwargs["nargs"] = a["nargs"]
        if "const" in a:
            kwargs["const"] = a["const"]
        if "choices" in a:
            kwargs["choices"] = a["choices"]
        parser.add_argument(*options, action="append" if kind == "append" else "store", **kwargs, **common)


_LOCAL = threading.local()


def _parsers() -> tuple[_Parser, _Parser]:
    """This thread's parsers: built once (about 300 options), reused; parsing changes only ``resolved``."""
    if not hasattr(_LOCAL, "parsers"):
        _LOCAL.parsers = _build()
    return _LOCAL.parsers


def _build() -> tuple[_Parser, _Parser]:
    t = table()
    settings = {"allow_abbrev": t["allow_abbrev"], "fromfile_prefix_chars": t["fromfile_prefix_chars"],
                "prefix_chars": t["prefix_chars"]}
    top = _Parser(prog="vllm", add_help=False, **settings)
    top.add_argument(*[o for o in t["top_level_options"] if o in ("-h", "--help")], action=_Exit, dest="help")
    top.add_argument(*[o for o in t["top_level_options"] if o in ("-v", "--version")], action=_Exit, dest="version")
    subparsers = top.add_subparsers(dest="subparser", parser_class=_Parser)
    serve = subparsers.add_parser("serve", add_help=False, **settings)
    for p in t["positionals"]:
        serve.add_argument(p["dest"], nargs=p["nargs"], default=argparse.SUPPRESS)
    for a in t["actions"]:
        _add(serve, a)
    return top, serve


# --- FlexibleArgumentParser.parse_args, restated -----------------------------------------------------


@dataclass(frozen=True)
class Token:
    text: str
    origin: Origin = None


def _dashes(key: str) -> str:
    """``--a_b.c_d`` -> ``--a-b.c_d``: vLLM replaces ``_`` in the name up to the first dot."""
    head, dot, tail = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """vLLM's merge of repeated dotted keys: nested objects merge, lists concatenate, the rest is replaced."""
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        elif isinstance(v, list) and isinstance(into.get(k), list):
            into[k] += v
        else:
            into[k] = v


def _dotted_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return _human_int(text)
        except (ValueError, argparse.ArgumentTypeError):
            return text


def preprocess(tokens: list[Token]) -> list[Token]:
    """The argv ``FlexibleArgumentParser.parse_args`` hands to argparse for ``vllm serve ...``."""
    args = list(tokens)
    texts = [t.text for t in args]
    model_at = next((i for i, a in enumerate(texts) if re.match(r"^--model(=.+|$)", a)), None)
    if model_at is not None:
        tok = args[model_at]
        if len(args) > 1 and not args[1].text.startswith("-"):
            # The rendered model is already the positional: vLLM would see two models and exit.
            raise Refused(f"{tok.text} names a second model beside the positional one {args[1].text!r} "
                          "(vLLM moves it in front and then refuses the other as an unrecognized argument)", tok.origin)
        if tok.text == "--model":
            if model_at + 1 >= len(args):
                raise Refused("--model needs a value (vLLM fails with IndexError)", tok.origin)
            model, rest = Token(args[model_at + 1].text, tok.origin), model_at + 2
        else:
            model, rest = Token(tok.text.removeprefix("--model="), tok.origin), model_at + 1
        args = [args[0], model, *args[1:model_at], *args[rest:]]
        texts = [t.text for t in args]
    if (len(args) > 1 and args[1].text.startswith("-") and not any(re.match(r"^--config(=.+|$)", a) for a in texts)
            and any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in texts)):
        raise Refused("the model must be the first positional argument", args[1].origin)
    if "--config" in texts:
        where = args[texts.index("--config")].origin
        raise Unverifiable("--config", where)

    processed: list[Token] = []
    for i, tok in enumerate(args):
        arg = tok.text
        if arg.startswith("--help="):
            processed.append(Token("--help", tok.origin))
        elif arg.startswith("--"):
            if "=" in arg:
                key, value = arg.split("=", 1)
                processed.append(Token(f"{_dashes(key)}={value}", tok.origin))
            else:
                processed.append(Token(_dashes(arg), tok.origin))
        elif arg.startswith("-O") and arg != "-O":
            level = arg[3:] if arg[2] == "=" else arg[2:]
            processed += [Token("--optimization-level", tok.origin), Token(level, tok.origin)]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1].text in {"0", "1", "2", "3"}:
            processed.append(Token("--optimization-level", tok.origin))
        else:
            processed.append(tok)

    delete: set[int] = set()
    merged: dict[str, dict[str, Any]] = {}
    merged_origin: dict[str, Origin] = {}
    for i, tok in enumerate(processed):
        if i in delete:
            continue
        arg = tok.text
        if arg.startswith("--") and "." not in arg:
            continue
        if arg.startswith("-") and "." in arg:
            if "=" in arg:
                arg, value = arg.split("=", 1)
                if "." not in arg:
                    continue
            else:
                if i + 1 >= len(processed):
                    raise Refused(f"{arg} needs a value (vLLM fails with IndexError)", tok.origin)
                value = processed[i + 1].text
                delete.add(i + 1)
            if arg.endswith("+"):
                arg, value = arg[:-1], json.dumps(value.split(","))
            key, *keys = arg.split(".")
            nested: Any = _dotted_value(value)
            for k in reversed(keys):
                nested = {k: nested}
            _merge(merged.setdefault(key, {}), nested)
            merged_origin.setdefault(key, tok.origin)
            delete.add(i)
    out = [t for i, t in enumerate(processed) if i not in delete]
    for key, value in merged.items():
        out += [Token(key, merged_origin[key]), Token(json.dumps(value), merged_origin[key])]
    return out


@dataclass
class Parsed:
    """What ``vllm serve`` would run with."""

    values: dict[str, Any]
    """Every dest the argv set (argparse ``dest`` -> converted value); defaults are absent."""
    options: list[tuple[Token, str]] = field(default_factory=list)
    """Each token argparse read as an option, with the dest it resolved to (after abbreviation)."""


_LORA_FIELDS: Final = frozenset({"name", "path", "base_model_name", "is_3d_lora_weight"})


def _check_lora(values: list[Any] | None, origin: Origin) -> None:
    for item in values or []:
        if item in (None, "") or ("=" in item and "," not in item):
            continue
        try:
            data = json.loads(item)
        except json.JSONDecodeError:
            raise Refused(f"--lora-modules item {item!r} is neither NAME=PATH nor JSON", origin) from None
        if not isinstance(data, dict) or not {"name", "path"} <= set(data) or not set(data) <= _LORA_FIELDS:
            raise Refused(f"--lora-modules item {item!r} must be a JSON object with name and path", origin)


def parse(tokens: list[Token]) -> Parsed:
    """Parse ``["serve", MODEL, ...]`` as vLLM 0.33 would; raises :class:`Refused` where vLLM would exit."""
    processed = preprocess(tokens)
    top, serve = _parsers()
    serve.resolved = []
    try:
        namespace = top.parse_args([t.text for t in processed])
    except Refused as exc:
        # argparse names the option it failed on; point at the token that spelled it.
        origin = _origin_of_error(str(exc), processed, serve)
        raise Refused(str(exc), exc.origin if exc.origin is not None else origin) from None
    for text, action in serve.resolved:
        flag, eq, value = text.partition("=")
        if action is not None and action.nargs is None and eq and value == "--":
            # argparse (Python 3.11) removes a '--' from an attached value: the option then holds an
            # empty list that no type converter saw, and vLLM fails only when the engine starts.
            origin = next((t.origin for t in processed if t.text == text and t.origin is not None), None)
            raise Refused(f"{text} gives {flag} the value '--', which argparse drops: vLLM would store an empty list "
                          "for it, unchecked, and fail when the engine starts; give a real value or remove the option",
                          origin)
    options = _options(processed, serve)
    values = {k: v for k, v in vars(namespace).items() if k != "subparser"}
    lora = [tok for tok, dest in options if dest == "lora_modules"]
    if lora:
        _check_lora(values.get("lora_modules"), lora[-1].origin)
    return Parsed(values, options)


def _options(processed: list[Token], serve: _Parser) -> list[tuple[Token, str]]:
    """Line up the serve parser's record of ``_parse_optional`` with the tokens it read (``serve`` and
    everything after a bare ``--`` are not options)."""
    out = []
    seen = iter(serve.resolved)
    for tok in processed[1:]:
        if tok.text == "--":
            break
        text, action = next(seen, (None, None))
        if text != tok.text:
            break
        if action is not None:
            out.append((tok, action.dest))
    return out


def _origin_of_error(message: str, processed: list[Token], serve: _Parser) -> Origin:
    m = re.match(r"argument ([^:]+):", message)
    if m:
        spellings = set(m.group(1).split("/"))
        read = processed[1: 1 + len(serve.resolved)]
        for i in reversed(range(len(read))):
            action = serve.resolved[i][1]
            if action is not None and spellings & set(action.option_strings):
                # The option's own token, else the value after it (a rendered flag with a user's value).
                for tok in read[i: i + 2]:
                    if tok.origin is not None:
                        return tok.origin
    m = re.search(r"(?:unrecognized arguments|ambiguous option): (\S+)", message)
    if m:
        for tok in processed:
            if tok.origin is not None and (tok.text == m.group(1) or tok.text.split("=", 1)[0] == m.group(1).split("=", 1)[0]):
                return tok.origin
    return next((t.origin for t in processed if t.origin is not None), None)
