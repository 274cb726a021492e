"""Rendered objects are valid Kubernetes, checked offline: built-in kinds against the Kubernetes 1.35
OpenAPI schemas (kubernetes-validate, strict: unknown fields fail), custom kinds (LeaderWorkerSet,
InferencePool, HTTPRoute, PodMonitor) against their upstream CRD schemas read from the Go module
cache at the versions the dev cluster installs. The e2e suite adds server-side dry-run."""

from __future__ import annotations

import copy
import functools
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hisparse_operator.crd import openapi_schema
from hisparse_devcluster import _gomod
from hisparse_devcluster.versions import KUBERNETES_VERSION, UPSTREAM_CRDS
from hisparse_operator.api import labels as L, validate
from hisparse_operator.controller.rollout import snapshot
from hisparse_operator.render import Canary, render, render_validated, revision
from opsupport import VALID_EXAMPLES

K8S_SCHEMA_VERSION = KUBERNETES_VERSION.lstrip("v").rsplit(".", 1)[0] + ".0"


def _nullable_to_jsonschema(node: Any) -> Any:
    """OpenAPI v3.0 ``nullable: true`` -> JSON Schema's ``type: [T, "null"]``."""
    if isinstance(node, list):
        return [_nullable_to_jsonschema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable_to_jsonschema(v) for k, v in node.items()}
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def upstream_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema of every upstream CRD the dev cluster installs."""
    out = {}
    for crds in UPSTREAM_CRDS:
        root = _gomod.module_dir(crds.module, crds.version)
        for doc in _gomod.load_documents(_gomod.yaml_files(root, crds.paths)):
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for v in doc["spec"]["versions"]:
                out[(f"{group}/{v['name']}", kind)] = _nullable_to_jsonschema(v["schema"]["openAPIV3Schema"])
    return out


def _rendered() -> list[Any]:
    """Every object of each example, and of each example in the middle of a canary (the candidate's
    fleet, the split route, the parity Job, the stable spec's ControllerRevision)."""
    params = []
    for path in VALID_EXAMPLES:
        doc = yaml.safe_load(path.read_text())
        for o in render(doc):
            params.append(pytest.param(o, id=f"{path.stem}-{o['kind']}-{o['metadata']['name']}"))
        stable, _ = validate(doc, None)
        doc["spec"]["engine"] = {**(doc["spec"].get("engine") or {}), "image": "registry.example/hisparse-runtime:next"}
        doc["spec"]["rollout"] = {"strategy": "Canary", "parity": {"promptsConfigMap": "my-prompts"}}
        # The candidate's EPP PodMonitor, with the bearer token an authenticated EPP asks for.
        doc["spec"]["monitoring"] = {**(doc["spec"].get("monitoring") or {}),
                                     "eppMetricsAuth": {"tokenSecretName": "epp-metrics-reader"}}
        candidate, _ = validate(doc, None)
        assert stable is not None and candidate is not None
        during = [o for o in render_validated(stable, Canary(candidate, 30, True))
                  if o["kind"] == "HTTPRoute" or o["metadata"]["labels"].get(L.TRACK)]
        for o in [*during, snapshot(stable, revision(stable))]:
            params.append(pytest.param(o, id=f"{path.stem}-canary-{o['kind']}-{o['metadata']['name']}"))
    # The topology example's other gang scheduler: Volcano's schedulerName and queue on both kinds of workload.
    from test_topology import volcano_variant

    for o in render(volcano_variant()):
        if o["kind"] in ("Deployment", "LeaderWorkerSet"):
            params.append(pytest.param(o, id=f"production-topology-volcano-{o['kind']}-{o['metadata']['name']}"))
    return params


@pytest.mark.parametrize("obj", _rendered())
def test_rendered_object_matches_its_schema(obj):
    key = (obj["apiVersion"], obj["kind"])
    if key in upstream_schemas():
        jsonschema.validate(obj, upstream_schemas()[key], cls=jsonschema.Draft7Validator)
        return
    try:
        kubernetes_validate.validate(obj, K8S_SCHEMA_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        pytest.fail(f"no schema for {key}: every rendered kind must be validated")


def test_invalid_objects_fail_the_validators():
    """Both validators above can fail: a typo'd field and a wrong type are caught."""
    objs = render(yaml.safe_load(VALID_EXAMPLES[0].read_text()))
    deployment = copy.deepcopy(next(o for o in objs if o["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_SCHEMA_VERSION, strict=True)
    pool = copy.deepcopy(next(o for o in objs if o["kind"] == "InferencePool"))
    pool["spec"]["targetPorts"] = [{"number": "eight thousand"}]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pool, upstream_schemas()[(pool["apiVersion"], "InferencePool")], cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_examples_match_our_crd_schema(path):
    """The generated CRD accepts every example as written (what `kubectl apply` sends). Draft 4:
    OpenAPI v3.0, like our CRD, spells exclusive bounds as booleans."""
    schema = _nullable_to_jsonschema(openapi_schema())
    jsonschema.validate(yaml.safe_load(path.read_text()), schema, cls=jsonschema.Draft4Validator)


def test_crd_schema_rejects_what_the_model_rejects():
    """A wrong type and a bound the model enforces are refused by the CRD schema too."""
    schema = _nullable_to_jsonschema(openapi_schema())
    doc = yaml.safe_load(VALID_EXAMPLES[0].read_text())
    doc["spec"]["decode"]["hisparse"]["deviceBufferSize"] = 40000
    with pytest.raises(jsonschema.ValidationError, match="40000"):
        jsonschema.validate(doc, schema, cls=jsonschema.Draft4Validator)
