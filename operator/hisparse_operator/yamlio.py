"""YAML in and out for the CLI.

Reading is bounded and at least as strict as ``kubectl apply`` and the apiserver: a manifest is JSON
written as YAML, so the loader refuses what has no JSON form or would be resolved silently elsewhere:

- size, nesting depth, node count and alias references are capped *before* anything is expanded, so
  a few hundred bytes of nested anchors ("billion laughs") cannot grow into gigabytes;
- a mapping key written twice is an error, not "last one wins" (kubectl 1.35 and the apiserver keep the
  last value without a word: measured with ``kubectl apply --dry-run=server``);
- plain scalars are resolved as kubectl 1.35 resolves them (sigs.k8s.io/yaml's go-yaml v2, YAML 1.1
  without sexagesimals): ``y``/``n``/``on``/``off`` are booleans, ``93:20`` and ``=`` are strings, ``0x10``
  is 16, and a float with an integral value (``4096.0``, ``9.6e1``) is the integer Go's JSON encoder
  sends; scalar keys become the strings sigs.k8s.io/yaml makes of them (``0x10`` and ``16`` are one key);
- recursive aliases, infinities/NaN, null keys and tags without a JSON form (``!!binary``, ``!!set``,
  custom tags) are errors; timestamps stay the strings they are written as, as they do for kubectl;
- two documents of one stream naming the same object (kind, namespace, name) are an error: applying
  both would leave only the last.

Every error names its document by position (1-based, counting every ``---`` document) and, when the
document got far enough, by kind and namespace/name. Writing keeps multi-line strings (engine JSON,
EPP config) as literal blocks.
"""

from __future__ import annotations

import decimal
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

MAX_BYTES: Final = 3 * 1024 * 1024
"""Largest stream read (3 MiB, the apiserver's request-body limit)."""
MAX_DEPTH: Final = 64
"""Deepest nesting of mappings and sequences (a HiSparseDeployment is about 10 deep)."""
MAX_ALIASES: Final = 256
"""Alias references (``*name``) per stream."""
MAX_NODES: Final = 200_000
"""Nodes per document once every alias is expanded (the example manifests have a few hundred)."""

_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available (events only)
_JSON_SCALARS: Final = frozenset(
    f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "timestamp")
)
_MAP, _SEQ, _MERGE = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq", "tag:yaml.org,2002:merge"


class YamlInputError(ValueError):
    """A stream that is not a readable set of Kubernetes manifests; ``str()`` says where and why."""

    def __init__(self, message: str, document: int | None = None, label: str | None = None) -> None:
        self.document, self.label, self.reason = document, label, message
        where = f"document {document}" + (f" ({label})" if label else "") if document else "input"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Document:
    """One non-empty document of a stream."""

    index: int
    """1-based position in the stream, counting empty documents too (as an editor shows ``---``)."""
    data: Any
    line: int
    """1-based line where the document starts."""
    spelled: dict[tuple[str | int, ...], str] = field(default_factory=dict)
    """Where an unquoted scalar became something other than a string (``y`` -> true), what was written:
    so an error can say which value to quote."""

    @property
    def label(self) -> str:
        """``document 2 (HiSparseDeployment default/dsv32)``: how every error names this document."""
        ident = identity(self.data)
        if ident is None:
            return f"document {self.index} (line {self.line})"
        kind, namespace, name = ident
        return f"document {self.index} ({kind} {namespace}/{name})"


def identity(data: Any) -> tuple[str, str, str] | None:
    """(kind, namespace, name) of a manifest, the namespace defaulting to ``default``; ``None`` when
    the document has no name to report."""
    if not isinstance(data, dict):
        return None
    meta = data.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str):
        return None
    namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) and meta.get("namespace") else "default"
    kind = data.get("kind") if isinstance(data.get("kind"), str) else "?"
    return kind, namespace, name


def _check_events(text: str) -> None:
    """Depth and alias caps on the event stream: iterative, nothing is built yet."""
    depth = aliases = 0
    index = 0
    try:
        for event in yaml.parse(text, Loader=_SafeLoader):
            if isinstance(event, yaml.DocumentStartEvent):
                index += 1
            elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise YamlInputError(f"nesting deeper than {MAX_DEPTH} levels (line {event.start_mark.line + 1}); "
                                         "no manifest is that deep: check the indentation", index)
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise YamlInputError(f"more than {MAX_ALIASES} alias references (*name); refused so that aliases "
                                         "cannot expand into an unbounded document: write the values out", index)
    except yaml.YAMLError as exc:
        raise YamlInputError(f"not valid YAML: {_yaml_reason(exc)}", index or None) from None


def _yaml_reason(exc: yaml.YAMLError) -> str:
    return " ".join(str(exc).split())


def _check_graph(root: yaml.Node, index: int) -> None:
    """Recursive aliases, expanded size, duplicate keys and non-JSON tags of one composed document."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in on_path:
            raise YamlInputError(f"recursive alias at line {node.start_mark.line + 1}: a manifest cannot contain itself", index)
        on_path.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, tuple[int, str]] = {}
            for k, v in node.value:
                if k.tag == _MERGE:
                    total += size(v)
                    continue
                if not isinstance(k, yaml.ScalarNode):
                    raise YamlInputError(f"a mapping key at line {k.start_mark.line + 1} is a "
                                         f"{'mapping' if isinstance(k, yaml.MappingNode) else 'sequence'}; JSON keys are strings", index)
                try:
                    name = _key_text(k)
                except yaml.constructor.ConstructorError as exc:
                    raise YamlInputError(f"line {k.start_mark.line + 1}: key {k.value!r}: {exc.problem}", index) from None
                if name in seen:
                    line, spelled = seen[name]
                    how = (f" ({', '.join(repr(t) for t in dict.fromkeys((spelled, k.value)) if t != name)} "
                           f"{'is' if len({spelled, k.value} - {name}) == 1 else 'are'} read as {json.dumps(name)} by kubectl's YAML 1.1)"
                           if {spelled, k.value} != {name} else "")
                    raise YamlInputError(f"line {k.start_mark.line + 1}: key {json.dumps(name)}{how} already set in map (at line "
                                         f"{line}); kubectl would silently keep only the last value, so one of the "
                                         "two is a mistake: keep one", index)
                seen[name] = (k.start_mark.line + 1, k.value)
                total += size(k) + size(v)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
        elif node.tag not in _JSON_SCALARS and node.tag != _MERGE:  # a ``<<`` value is the string "<<"
            raise YamlInputError(f"tag {node.tag} at line {node.start_mark.line + 1} has no JSON form; Kubernetes manifests "
                                 "are JSON: write a plain value", index)
        if node.tag not in (_MAP, _SEQ, _MERGE) and not isinstance(node, yaml.ScalarNode):
            raise YamlInputError(f"tag {node.tag} at line {node.start_mark.line + 1} has no JSON form; Kubernetes manifests "
                                 "are JSON: remove the tag", index)
        on_path.discard(key)
        if total > MAX_NODES:
            raise YamlInputError(f"more than {MAX_NODES} values once aliases are expanded (line {node.start_mark.line + 1}); "
                                 "refused so that aliases cannot expand into an unbounded document: write the values out", index)
        sizes[key] = total
        return total

    size(root)


def _key_text(node: yaml.ScalarNode) -> str:
    """A scalar key as the JSON key kubectl sends: ``0x10``, ``16`` and ``'16'`` are one key."""
    return _json_key(_scalar(node, key=True))


# --- YAML 1.1 as kubectl reads it ---------------------------------------------------------------------
# kubectl 1.35 reads manifests with sigs.k8s.io/yaml, which resolves plain scalars with its copy of go-yaml
# v2 (goyaml.v2/resolve.go) and converts the result to JSON. PyYAML's YAML 1.1 resolver differs on
# purpose-built details (go-yaml has no sexagesimal numbers and no ``=`` value tag, reads ``y``/``n`` as
# booleans and ``1e3`` or ``08`` as numbers), so the resolution is done here, once, as go-yaml does it.

_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL, _TIMESTAMP = (_TAG + t for t in ("str", "int", "float", "bool", "null", "timestamp"))
_GO_MAP: Final[dict[str, tuple[str, Any]]] = {
    **{w: (_BOOL, True) for w in ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")},
    **{w: (_BOOL, False) for w in ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")},
    **{w: (_NULL, None) for w in ("", "~", "null", "Null", "NULL")},
    **{w: (_FLOAT, math.nan) for w in (".nan", ".NaN", ".NAN")},
    **{w: (_FLOAT, math.inf) for w in (".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF")},
    **{w: (_FLOAT, -math.inf) for w in ("-.inf", "-.Inf", "-.INF")},
    "<<": (_MERGE, "<<"),
}
_GO_FLOAT: Final = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
"""go-yaml v2's ``yamlStyleFloat``; Go's ParseFloat takes exactly this decimal syntax (no underscores)."""
_GO_INT: Final = re.compile(r"^[-+]?(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)$")
"""What Go's ``strconv.ParseInt(s, 0, 64)`` accepts once go-yaml has removed the underscores."""
_INT64: Final = range(-(2**63), 2**63)


def _go_int(text: str) -> int | None:
    if not _GO_INT.match(text):
        return None
    sign, digits = (-1, text[1:]) if text[0] == "-" else (1, text.lstrip("+"))
    if len(digits) > 1 and digits[0] == "0" and digits[1] not in "xXoObB":
        digits = "0o" + digits[1:]  # a leading 0 is octal in Go
    return sign * int(digits, 0)


def _go_float(text: str) -> float | None:
    if not _GO_FLOAT.match(text):
        return None
    value = float(text)
    return None if math.isinf(value) else value  # Go's ParseFloat fails with ErrRange on overflow


def go_resolve(text: str) -> tuple[str, Any]:
    """The tag and value go-yaml v2 gives a plain (unquoted, untagged) scalar."""
    if text in _GO_MAP:
        return _GO_MAP[text]
    hint = text[:1]
    if hint == ".":
        value = _go_float(text)
        if value is not None:
            return _FLOAT, value
    elif hint and (hint in "+-" or hint.isdigit()) and hint.isascii():
        plain = text.replace("_", "")
        number = _go_int(plain)
        if number is not None and (number in _INT64 or (number >= 0 and number < 2**64 and plain[0] != "+")):
            return _INT, number
        value = _go_float(plain)
        if value is not None:
            return _FLOAT, value
        # Beyond 64 bits without a decimal float's syntax (0x..., 0b...): go-yaml keeps the text.
    return _STR, text


def _json_number(value: float | int) -> int | float:
    """A number as the apiserver receives it. kubectl decodes the JSON it converted into int64 or float64 and
    encodes that again: an integer beyond int64 becomes a float64; Go's encoder writes an integral float
    below 1e21 as its shortest digits without a fraction (``4096.0`` is sent as ``4096``, ``9.6e1`` as
    ``96``, 1.2345678901234567e19 as ``12345678901234567000``), and that text decodes as an integer only
    when it fits int64."""
    if isinstance(value, int):
        return value if value in _INT64 else float(value)
    if value.is_integer() and abs(value) < 1e21:
        digits = int(format(decimal.Decimal(repr(value)).normalize(), "f"))
        if digits in _INT64:
            return digits
    return value


def _scalar(node: yaml.ScalarNode, *, key: bool = False) -> Any:
    """A scalar node's JSON value as kubectl sends it (explicit tags must agree with the value, as in go-yaml);
    ``key``: go-yaml's own value, which sigs.k8s.io/yaml spells as the JSON key (no JSON round trip)."""
    if node.tag in (_STR, _MERGE):
        return node.value
    tag, value = go_resolve(node.value)
    if tag != node.tag and not (node.tag == _FLOAT and tag == _INT) and node.tag != _TIMESTAMP:
        raise yaml.constructor.ConstructorError(
            None, None, f"cannot decode {tag.replace(_TAG, '!!')} `{node.value}` as a {node.tag.replace(_TAG, '!!')}",
            node.start_mark)
    if node.tag == _TIMESTAMP or tag == _TIMESTAMP:
        return node.value
    if isinstance(value, float) or node.tag == _FLOAT:
        value = float(value)
        if not key and (math.isinf(value) or math.isnan(value)):
            raise yaml.constructor.ConstructorError(None, None, f"{node.value} is not a JSON number", node.start_mark)
        return value if key else _json_number(value)
    return value if key or isinstance(value, bool) or not isinstance(value, int) else _json_number(value)


class _GoResolver(yaml.resolver.BaseResolver):
    """Plain scalars resolved as go-yaml v2 resolves them; everything else as YAML says."""

    def resolve(self, kind: type, value: str, implicit: tuple[bool, bool]) -> str:  # type: ignore[override]
        if kind is yaml.ScalarNode and implicit[0]:
            return go_resolve(value)[0]
        return super().resolve(kind, value, implicit)


class _Constructor(yaml.constructor.SafeConstructor):
    """Construction into the JSON kubectl sends."""

    def construct_json_scalar(self, node: yaml.ScalarNode) -> Any:
        return _scalar(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        # Keys become JSON strings *before* insertion: as Python keys, 1 and true would be one key.
        self.flatten_mapping(node)  # merge keys first, explicit keys after (and winning), as YAML says
        return {_key_text(k) if isinstance(k, yaml.ScalarNode) else _json_key(self.construct_object(k, deep=deep)):
                self.construct_object(v, deep=deep) for k, v in node.value}


def _json_key(key: Any) -> str:
    """sigs.k8s.io/yaml's conversion of a resolved key to a JSON key (null and 64-bit-overflowing keys are
    refused there: ``unsupported map key``)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int) and key in _INT64:
        return str(key)
    if isinstance(key, float):
        if math.isnan(key) or math.isinf(key):
            return ".nan" if math.isnan(key) else (".inf" if key > 0 else "-.inf")  # sigs.k8s.io/yaml's spelling
        return _go_float32_g(key)
    raise yaml.constructor.ConstructorError(None, None, f"a {'null' if key is None else 'too large'} mapping key has no "
                                            "JSON form (kubectl fails: unsupported map key): quote it")


def _go_float32_g(value: float) -> str:
    """``strconv.FormatFloat(v, 'g', -1, 32)``: the shortest digits that round-trip as a float32, written
    with an exponent when it is below -4 or at least 6 (``1e+06``, ``123456``, ``0.0001``, ``1e-05``)."""
    import struct

    def f32(x: float) -> float:
        return struct.unpack("f", struct.pack("f", x))[0]

    target = f32(value)
    if math.isinf(target):  # finite as a float64, beyond float32 (1E100): kubectl writes it as .inf
        return ".inf" if target > 0 else "-.inf"
    if target == 0:
        return "-0" if math.copysign(1, target) < 0 else "0"
    sign = "-" if target < 0 else ""
    for count in range(1, 10):
        text = f"{abs(target):.{count - 1}e}"
        if f32(float(text)) == abs(target):
            break
    mantissa, exp = text.split("e")
    digits, exponent = mantissa.replace(".", "").rstrip("0") or "0", int(exp)
    if exponent < -4 or exponent >= 6:
        body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{body}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if exponent < 0:
        return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
    whole = digits[: exponent + 1].ljust(exponent + 1, "0")
    frac = digits[exponent + 1:]
    return f"{sign}{whole}{'.' + frac if frac else ''}"


_Parser = getattr(yaml, "CParser", None)


class _Loader(*((_Parser,) if _Parser else (yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer)),
              _GoResolver):  # type: ignore[misc]
    """Parser (libyaml when available) and composer with go-yaml's scalar resolution."""

    def __init__(self, stream: str) -> None:
        if _Parser:
            _Parser.__init__(self, stream)
        else:
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            yaml.composer.Composer.__init__(self)
        _GoResolver.__init__(self)


for _tag in (_INT, _FLOAT, _BOOL, _NULL, _TIMESTAMP, _MERGE):  # (a ``<<`` in value position is a string)
    _Constructor.add_constructor(_tag, _Constructor.construct_json_scalar)
_Constructor.add_constructor(_MAP, _Constructor.construct_yaml_map)


def load_documents(text: str | bytes) -> list[Document]:
    """Every non-empty document of a stream, each checked as described in the module docstring.

    Raises :class:`YamlInputError` naming the document; nothing is returned for a partly bad stream.
    """
    if isinstance(text, bytes):
        if len(text) > MAX_BYTES:
            raise YamlInputError(f"{len(text)} bytes is over the {MAX_BYTES}-byte limit (the apiserver's request limit)")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise YamlInputError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise YamlInputError(f"over the {MAX_BYTES}-byte limit (the apiserver's request limit)")
    _check_events(text)
    docs: list[Document] = []
    loader = _Loader(text)
    index = 0
    try:
        while loader.check_node():
            index += 1
            node = loader.get_node()
            if node is None:
                continue
            _check_graph(node, index)
            constructor = _Constructor()
            try:
                data = constructor.construct_document(node)
            except (yaml.YAMLError, RecursionError) as exc:
                raise YamlInputError(f"cannot construct: {_yaml_reason(exc) if isinstance(exc, yaml.YAMLError) else 'too deep'}",
                                     index) from None
            if data is not None:
                docs.append(Document(index, data, node.start_mark.line + 1, _spellings(node)))
    except yaml.YAMLError as exc:
        raise YamlInputError(f"not valid YAML: {_yaml_reason(exc)}", index or None) from None
    finally:
        loader.dispose()
    _check_unique(docs)
    return docs


def _spellings(root: yaml.Node) -> dict[tuple[str | int, ...], str]:
    """Path -> text of every plain scalar that did not become a string (merged mappings are not followed)."""
    out: dict[tuple[str | int, ...], str] = {}
    stack: list[tuple[yaml.Node, tuple[str | int, ...]]] = [(root, ())]
    seen: set[int] = set()
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            stack += [(v, (*path, _key_text(k))) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(v, (*path, i)) for i, v in enumerate(node.value)]
        elif node.style is None and node.tag != _STR:
            out[path] = node.value
    return out


def _check_unique(docs: list[Document]) -> None:
    first: dict[tuple[str, str, str], Document] = {}
    for doc in docs:
        ident = identity(doc.data)
        if ident is None:
            continue
        if ident in first:
            kind, namespace, name = ident
            raise YamlInputError(f"{kind} {namespace}/{name} is also {first[ident].label}; applying both would keep only "
                                 "the last one: rename one or remove it", doc.index, f"{kind} {namespace}/{name}")
        first[ident] = doc


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # libyaml when available
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    """Multi-line strings as literal blocks; a string that kubectl's YAML 1.1 (go-yaml v2) would read as
    something else (``1234567e12``, ``y``, ``0x1f``, ``08``) single-quoted. PyYAML's own resolver, which the
    dumper consults for everything else, quotes what a PyYAML reader would misread (``1e+3``, ``93:20``, ``~``)."""
    # Float syntax is quoted even where go-yaml keeps it a string (``12e4567890`` overflows Go's ParseFloat):
    # another YAML reader would take it for a number.
    number_like = go_resolve(value)[0] != _STR or _GO_FLOAT.match(value.replace("_", ""))
    style = "|" if "\n" in value else ("'" if number_like else None)
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_all(objects: Iterable[dict[str, Any]]) -> str:
    return yaml.dump_all(list(objects), Dumper=_Dumper, sort_keys=False, width=4096)


def dump(obj: dict[str, Any]) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=4096)
