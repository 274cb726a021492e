"""YAML in and out for the CLI.

Reading is bounded and at least as strict as ``kubectl apply`` and the apiserver: a manifest is JSON
written as YAML, so the loader refuses what has no JSON form or would be resolved silently elsewhere:

- size, nesting depth, node count and alias references are capped *before* anything is expanded, so
  a few hundred bytes of nested anchors ("billion laughs") cannot grow into gigabytes;
- a mapping key written twice is an error, not "last one wins" (kubectl 1.35 and the apiserver keep the
  last value without a word: measured with ``kubectl apply --dry-run=server``);
- recursive aliases, infinities/NaN and tags without a JSON form (``!!binary``, ``!!set``, custom
  tags) are errors; timestamps stay the strings they are written as, as they do for kubectl, and
  scalar keys (``1: x``) become strings, as sigs.k8s.io/yaml converts them;
- two documents of one stream naming the same object (kind, namespace, name) are an error: applying
  both would leave only the last.

Every error names its document by position (1-based, counting every ``---`` document) and, when the
document got far enough, by kind and namespace/name. Writing keeps multi-line strings (engine JSON,
EPP config) as literal blocks.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
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

_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available
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
            seen: dict[str, int] = {}
            for k, v in node.value:
                if k.tag == _MERGE:
                    total += size(v)
                    continue
                if not isinstance(k, yaml.ScalarNode):
                    raise YamlInputError(f"a mapping key at line {k.start_mark.line + 1} is a "
                                         f"{'mapping' if isinstance(k, yaml.MappingNode) else 'sequence'}; JSON keys are strings", index)
                name = _key_text(k)
                if name in seen:
                    raise YamlInputError(f"line {k.start_mark.line + 1}: key {json.dumps(name)} already set in map (at line "
                                         f"{seen[name]}); kubectl would silently keep only the last value, so one of the "
                                         "two is a mistake: keep one", index)
                seen[name] = k.start_mark.line + 1
                total += size(k) + size(v)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
        elif node.tag not in _JSON_SCALARS:
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
    """A scalar key as the JSON key kubectl sends (``1`` and ``"1"`` are one key)."""
    if node.tag == "tag:yaml.org,2002:null":
        return "null"
    if node.tag == "tag:yaml.org,2002:bool":
        return "true" if node.value.lower() in ("true", "yes", "on", "y") else "false"
    return node.value


class _Constructor(yaml.constructor.SafeConstructor):
    """Safe construction with the JSON forms kubectl produces."""

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> str:  # type: ignore[override]
        return str(node.value)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:  # type: ignore[override]
        value = super().construct_yaml_float(node)
        if math.isinf(value) or math.isnan(value):
            raise yaml.constructor.ConstructorError(None, None, f"{node.value} is not a JSON number", node.start_mark)
        return value

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        # Keys become JSON strings *before* insertion: as Python keys, 1 and true would be one key.
        self.flatten_mapping(node)  # merge keys first, explicit keys after (and winning), as YAML says
        return {_json_key(self.construct_object(k, deep=deep)): self.construct_object(v, deep=deep) for k, v in node.value}


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


_Constructor.add_constructor("tag:yaml.org,2002:timestamp", _Constructor.construct_yaml_timestamp)
_Constructor.add_constructor("tag:yaml.org,2002:float", _Constructor.construct_yaml_float)
_Constructor.add_constructor("tag:yaml.org,2002:map", _Constructor.construct_yaml_map)


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
    loader = _SafeLoader(text)
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
                docs.append(Document(index, data, node.start_mark.line + 1))
    except yaml.YAMLError as exc:
        raise YamlInputError(f"not valid YAML: {_yaml_reason(exc)}", index or None) from None
    finally:
        loader.dispose()
    _check_unique(docs)
    return docs


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


_GO_YAML_NUMBER: Final = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
"""A plain scalar kubectl's YAML parser (go-yaml) reads as a number. PyYAML's YAML 1.1 resolver reads
``12e4567890`` (no dot, unsigned exponent) as a string and writes it unquoted, so a hash label of that
shape would reach the apiserver as a number (``cannot unmarshal number into ... labels``)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else ("'" if _GO_YAML_NUMBER.match(value) else None)
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_all(objects: Iterable[dict[str, Any]]) -> str:
    return yaml.dump_all(list(objects), Dumper=_Dumper, sort_keys=False, width=4096)


def dump(obj: dict[str, Any]) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=4096)
