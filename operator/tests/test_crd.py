"""The CRD in crds/ is generated from the API models, structural, and its CEL rules compile."""

from __future__ import annotations

from typing import Any

from hisparse_operator.api._cel import compile_expression
import yaml
from hisparse_operator.crd import CRD_FILE, PRINTER_COLUMNS, build_crd, crd_yaml
from opsupport import REPO


def _walk(node: Any, path: str = ""):
    if isinstance(node, dict):
        yield path, node
        for key in ("properties",):
            for name, child in (node.get(key) or {}).items():
                yield from _walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def _schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_crds_directory_is_up_to_date():
    on_disk = (REPO / "crds" / CRD_FILE).read_text()
    assert on_disk == crd_yaml(), "crds/ is stale: run `hisparse crd > crds/" + CRD_FILE + "`"


def test_schema_is_structural():
    for path, node in _walk(_schema()):
        assert "$ref" not in node, path
        assert "title" not in node, path
        assert "const" not in node, path
        if node.get("x-kubernetes-int-or-string"):
            assert node.get("anyOf") == [{"type": "integer"}, {"type": "string"}], f"{path}: int-or-string branches must be bare"
            continue
        for rule in node.get("x-kubernetes-validations", []):
            # fieldPath must name a property the schema declares (metadata declares none).
            if rule.get("fieldPath"):
                head = rule["fieldPath"].lstrip(".").split(".")[0].split("[")[0]
                assert head in node.get("properties", {}), f"{path}: fieldPath {rule['fieldPath']} is not in the schema"
        assert "type" in node, f"{path or '(root)'} has no type (structural schemas need one everywhere)"
        for key in ("anyOf", "oneOf", "allOf"):
            for branch in node.get(key, []):
                assert "type" not in branch, f"{path}: {key} branches may not set a type"
        if "additionalProperties" in node:
            assert "properties" not in node, f"{path}: properties and additionalProperties are exclusive"
            assert isinstance(node["additionalProperties"], dict), path
        if node.get("type") == "object" and not node.get("x-kubernetes-preserve-unknown-fields") and path != ".metadata":
            assert "properties" in node or "additionalProperties" in node, f"{path}: object without fields"


def test_cel_rules_compile_and_every_field_is_described():
    rules = 0
    for path, node in _walk(_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            compile_expression(rule["rule"])
            assert rule["message"] and rule["rule"]
            rules += 1
        if path.startswith(".spec.") and not path.endswith("{}") and not path.endswith("[]"):
            assert node.get("description"), f"{path} has no description"
    assert rules >= 3


def test_crd_identity_and_columns():
    crd = build_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "hisparsedeployments.serving.hisparse.dev"
    assert spec["names"]["shortNames"] == ["hsd"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    for column in PRINTER_COLUMNS:
        parts = column["jsonPath"].split("[")[0].strip(".").split(".")
        if parts[0] != "status":
            continue
        node = status
        for part in parts[1:]:
            node = node["properties"][part]
        assert node.get("type") in ("string", "integer", "array"), column
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_crd_file_is_yaml_of_one_object():
    docs = list(yaml.safe_load_all((REPO / "crds" / CRD_FILE).read_text()))
    assert len(docs) == 1 and docs[0]["kind"] == "CustomResourceDefinition"
