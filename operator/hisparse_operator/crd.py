"""The CustomResourceDefinition, generated from the API models (never edited by hand).

pydantic emits JSON Schema 2020-12 with ``$defs``; Kubernetes wants a *structural* OpenAPI v3.0 schema:
everything inlined, ``nullable`` instead of ``null`` unions, ``additionalProperties`` only for maps,
``x-kubernetes-*`` extensions for free-form and int-or-string fields, boolean exclusive bounds.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from .api import HiSparseDeployment, labels
from .yamlio import dump

CRD_FILE: Final = f"{labels.GROUP}_{labels.PLURAL}.yaml"

PRINTER_COLUMNS: Final = [
    {"name": "Prefill", "type": "string", "jsonPath": ".status.prefill.ready", "description": "Ready/desired prefill replicas"},
    {"name": "Decode", "type": "string", "jsonPath": ".status.decode.ready", "description": "Ready/desired decode replicas"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Stable", "type": "string", "jsonPath": ".status.stableRevision", "description": "Revision serving traffic"},
    {"name": "Canary-Step", "type": "integer", "jsonPath": ".status.canary.step", "description": "Current canary step"},
    {"name": "Canary-Weight", "type": "integer", "jsonPath": ".status.canary.weight", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP: Final = {"title", "$defs", "discriminator", "examples"}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    node = {k: v for k, v in node.items() if k not in _DROP}
    if node.get("x-kubernetes-int-or-string"):
        return node
    for key in ("anyOf", "oneOf"):
        options = node.get(key)
        if options and any(o.get("type") == "null" for o in options):
            rest = [o for o in options if o.get("type") != "null"]
            node.pop(key)
            node.pop("default", None) if node.get("default") is None else None
            if len(rest) == 1:
                node = {**_structural(rest[0], defs), **{k: v for k, v in node.items()}}
            else:
                node[key] = rest
            node["nullable"] = True
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "enum" in node and "type" not in node:
        node["type"] = "string" if all(isinstance(v, str) for v in node["enum"]) else "integer"
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), (int, float)) and not isinstance(node.get(bound), bool):
            node[plain] = node.pop(bound)
            node[bound] = True
    extra = node.get("additionalProperties")
    if extra is False:
        node.pop("additionalProperties")
    elif extra is True or extra == {}:
        node.pop("additionalProperties")
        node["x-kubernetes-preserve-unknown-fields"] = True
    if isinstance(node.get("description"), str):
        # Docstrings are reST-ish and wrapped: one line, single backticks, for `kubectl explain`.
        node["description"] = " ".join(node["description"].replace("``", "`").split())
    if "default" in node and node["default"] is None:
        node.pop("default")
    if "default" in node and isinstance(node["default"], (dict, list)) and not node["default"]:
        node.pop("default")  # empty defaults add nothing and trip apiserver defaulting of nested fields
    out = {k: _structural(v, defs) for k, v in node.items()}
    if out.get("type") == "object" and out.get("x-kubernetes-preserve-unknown-fields") and "properties" not in out:
        out.pop("additionalProperties", None)
    return out


def openapi_schema() -> dict[str, Any]:
    """The structural ``openAPIV3Schema`` of the HiSparseDeployment."""
    raw = HiSparseDeployment.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema = _structural(raw, defs)
    props = schema["properties"]
    # The apiserver owns metadata; a CRD schema may only say it is an object.
    props["metadata"] = {"type": "object"}
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    schema["required"] = ["spec"]
    return schema


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{labels.PLURAL}.{labels.GROUP}",
            "labels": {labels.APP_NAME: labels.APP_NAME_VALUE},
        },
        "spec": {
            "group": labels.GROUP,
            "names": {
                "kind": labels.KIND,
                "listKind": f"{labels.KIND}List",
                "plural": labels.PLURAL,
                "singular": labels.SINGULAR,
                "shortNames": list(labels.SHORT_NAMES),
                "categories": ["hisparse", "llm-d"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": labels.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated from hisparse_operator.api by `hisparse crd`. Do not edit.\n"
    return header + dump(build_crd())
