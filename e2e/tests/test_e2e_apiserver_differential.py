"""The CLI's Kubernetes rules against the apiserver's own, by server-side dry run.

Generated manifests change one field that Kubernetes itself has rules for (names, namespaces, label keys
and values, node selectors, environment variable names, quantities) to values near and across each rule's
edges. Each goes through ``validate`` (what ``hisparse validate``, render and the webhook run), then:

- **accepted**: the resource itself and every object the operator would apply for it, the stable fleet
  and, mid-canary, the candidate's fleet, the split route and the parity Job, are sent to the real
  kube-apiserver with ``kubectl create --dry-run=server``: every one must be accepted (the CLI accepts
  only what the apiserver accepts);
- **refused by a Kubernetes rule** (the field's own validator, not a product rule such as the 40-character
  name): what an unchecked render would send, the same objects rendered with a placeholder in that field
  and the value put in its place, must be refused by the apiserver too (the CLI refuses only what the
  apiserver refuses, for the apiserver's own rules).

No webhook takes part: the apiserver's schema, its built-in validation and the upstream CRDs' schemas and
CEL rules are the oracle.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import apply_crds, get_json
from hisparse_devcluster import Cluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hisparse_operator.api import validate
from hisparse_operator.render import Canary, render_validated

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"
BASE = yaml.safe_load((REPO / "examples" / "deepseek-v32-single-node.yaml").read_text())
NAMESPACE = "apiserver-differential"
KUBE_RULE = "schema:value_error"
"""The rule id of a field validator's refusal: the Kubernetes rules of ``engine/kube.py`` report as it."""

# Edge values of each rule, beside generated ones: lengths at and past the limits, first and last
# characters, dots, underscores, prefixes, signs, exponents, suffixes.
_NAME_EDGES = ["a" * 40, "a" * 41, "9abc", "abc-", "-abc", "a.b", "a_b", "Abc", "a", "", "a" * 63, "a-9"]
_KEY_EDGES = ["a" * 63, "a" * 64, "example.com/" + "a" * 63, "example.com/" + "a" * 64, "Example.com/a",
              "a/b/c", "/a", "a/", "_a", "a_", "a.b_c-d", "x.y.z/A.b", "-a.com/b", ("a" * 64) + ".com/b", "a" * 253 + "/b"]
_LABEL_VALUE_EDGES = ["", "a" * 63, "a" * 64, "A.b_c-D", "-a", "a-", "_a", "a.", "a b", "a/b", "0", "é"]
_ENV_EDGES = ["A=B", "", " ", "~", "a.b-c", "A B", "1A", "é", "\t", "$X", "a" * 200]
_QUANTITY_EDGES = ["64Gi", "64GB", "64gi", "+64Gi", "-64Gi", ".5Ti", "5.", "1e3", "1E3", "1e3Gi", "64 Gi", "0x40",
                   "64Ki", "64k", "64K", "64m", "1.5Gi", "1..5Gi", "64Mi ", "1e", "6.4e1G", "+.5Ti", "64Ei", "1e-3"]


def _text(alphabet: str, max_size: int) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, min_size=0, max_size=max_size)


names = st.sampled_from(_NAME_EDGES) | _text("abz09-.A_", 45)
label_keys = st.sampled_from(_KEY_EDGES) | st.builds(
    lambda prefix, name: name if prefix is None else f"{prefix}/{name}",
    st.none() | _text("ab.-9A", 14), _text("aZ9-_./", 66))
label_values = st.sampled_from(_LABEL_VALUE_EDGES) | _text("aZ9-_. /", 66)
env_names = st.sampled_from(_ENV_EDGES) | _text("ABCXYZ_=. -$a1é", 12)
quantities = st.sampled_from(_QUANTITY_EDGES) | st.builds(
    lambda sign, digits, frac, exp, suffix: f"{sign}{digits}{frac}{exp}{suffix}",
    st.sampled_from(["", "+", "-"]), st.sampled_from(["", "0", "64", "1000", "12345678"]),
    st.sampled_from(["", ".", ".5", ".25"]), st.sampled_from(["", "e3", "E-2", "e+1", "e"]),
    st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E", "m", "n", "u", "gi", "GB", "B"]))

# field -> (values, the placeholder written into the base for the unchecked render; None: the value stays
# on the resource itself, whose own metadata the apiserver judges)
FIELDS: dict[str, tuple[st.SearchStrategy[Any], str | None]] = {
    "metadata.name": (names, "zqxname"),
    "metadata.namespace": (names, None),
    "metadata.labels.key": (label_keys, None),
    "metadata.labels.value": (label_values, None),
    "spec.decode.nodeSelector.key": (label_keys, "zqxkey"),
    "spec.decode.nodeSelector.value": (label_values, "zqxval"),
    "spec.engine.extraEnv": (env_names, "ZQXENV"),
    "spec.decode.shmSize": (quantities, "7777Mi"),
    "spec.prefill.resources.requests.cpu": (quantities, "63500m"),
}


def _set(doc: dict[str, Any], field: str, value: str) -> None:
    spec = doc["spec"]
    if field == "metadata.name":
        doc["metadata"]["name"] = value
    elif field == "metadata.namespace":
        doc["metadata"]["namespace"] = value
    elif field == "metadata.labels.key":
        doc["metadata"]["labels"] = {value: "v"}
    elif field == "metadata.labels.value":
        doc["metadata"]["labels"] = {"example.com/team": value}
    elif field == "spec.decode.nodeSelector.key":
        spec["decode"]["nodeSelector"] = {value: "v"}
    elif field == "spec.decode.nodeSelector.value":
        spec["decode"]["nodeSelector"] = {"example.com/pool": value}
    elif field == "spec.engine.extraEnv":
        spec.setdefault("engine", {})["extraEnv"] = {value: "1"}
    elif field == "spec.decode.shmSize":
        spec["decode"]["shmSize"] = value
    elif field == "spec.prefill.resources.requests.cpu":
        spec["prefill"]["resources"]["requests"]["cpu"] = value
    else:
        raise AssertionError(field)


def _manifest(field: str, value: str) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["metadata"]["namespace"] = NAMESPACE
    _set(doc, field, value)
    return doc


def _objects(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The resource and everything the operator applies for it: the stable fleet, then mid-canary the
    candidate's fleet, the split route and the parity Job. ``doc`` must be valid."""
    stable, errors = validate(doc)
    assert stable is not None and not errors, errors
    candidate_doc = copy.deepcopy(doc)
    candidate_doc["spec"].setdefault("engine", {})["image"] = "registry.example/hisparse-runtime:next"
    candidate_doc["spec"]["rollout"] = {"strategy": "Canary", "parity": {"promptsConfigMap": "prompts"}}
    candidate, errors = validate(candidate_doc)
    assert candidate is not None and not errors, errors
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for o in [*render_validated(stable), *render_validated(stable, Canary(candidate, 30, True))]:
        out[(o["kind"], o["metadata"]["name"])] = o
    return [doc, *out.values()]


def _unchecked(field: str, value: str) -> list[dict[str, Any]]:
    """What a render without the CLI's check would send: the objects of a manifest with a placeholder in
    ``field``, with ``value`` written wherever the placeholder landed (and the resource as written)."""
    placeholder = FIELDS[field][1]
    if placeholder is None:
        return [_manifest(field, value)]
    objects = _objects(_manifest(field, placeholder))[1:]
    text = json.dumps(objects)
    assert placeholder in text, f"the placeholder of {field} reaches no rendered object"
    return [_manifest(field, value), *json.loads(text.replace(placeholder, json.dumps(value)[1:-1]))]


def _namespaced(objects: list[dict[str, Any]], field: str, value: str) -> list[dict[str, Any]]:
    """A namespace under test is judged as the Namespace object it names (a dry run creates nothing, so
    nothing could be created inside it); everything else goes to the test's namespace."""
    out = [{**o, "metadata": {**o["metadata"], "namespace": NAMESPACE}} for o in objects]
    if field == "metadata.namespace":
        out.insert(0, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": value}})
    return out


@pytest.fixture(scope="module")
def server(cluster: Cluster) -> Any:
    apply_crds(cluster, CRD)
    hooks = [h for c in get_json(cluster, "validatingwebhookconfigurations")["items"] for h in c.get("webhooks", [])
             if any("serving.hisparse.dev" in r.get("apiGroups", []) for r in h.get("rules", []))]
    assert not hooks, f"a webhook for HiSparseDeployments is configured ({[h['name'] for h in hooks]}): this test " \
                      "compares with the apiserver's own rules only"
    cluster.kubectl("create", "namespace", NAMESPACE)

    def accepts(objects: list[dict[str, Any]]) -> tuple[bool, str]:
        stream = "".join("---\n" + json.dumps(o) + "\n" for o in objects)
        res = subprocess.run([str(cluster.kubectl_path), f"--kubeconfig={cluster.kubeconfig}", "create",
                              "--dry-run=server", "-o", "name", "-f", "-"], input=stream, capture_output=True,
                             text=True, timeout=120, check=False)
        return res.returncode == 0, res.stderr.strip()

    yield accepts
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def test_the_cli_accepts_only_what_the_apiserver_accepts(server: Any) -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=120, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(st.sampled_from(sorted(FIELDS)).flatmap(lambda f: st.tuples(st.just(f), FIELDS[f][0])))
    def check(case: tuple[str, str]) -> None:
        field, value = case
        doc = _manifest(field, value)
        _, errors = validate(doc)
        if not errors:
            ok, why = server(_namespaced(_objects(doc), field, value))
            assert ok, f"{field}={value!r}: the CLI accepts it, the apiserver refuses: {why}"
            seen["accepted"] += 1
            return
        kube = [e for e in errors if e.rule == KUBE_RULE]
        if not kube:
            seen["refused by a product rule"] += 1
            return
        ok, _ = server(_namespaced(_unchecked(field, value), field, value))
        assert not ok, f"{field}={value!r}: the CLI refuses it ({kube[0]}), the apiserver accepts what it would be"
        seen["refused by both"] += 1

    check()
    # Both verdicts occurred often enough for the comparison to mean something.
    assert seen["accepted"] >= 20 and seen["refused by both"] >= 20, dict(seen)


def test_the_comparison_can_disagree(server: Any) -> None:
    """The oracle is live: a label value the apiserver refuses, smuggled past the CLI's check into the
    objects, is refused by the apiserver; and the same objects with a valid value are accepted."""
    assert not server(_namespaced(_unchecked("spec.decode.nodeSelector.value", "a b"), "", ""))[0]
    assert server(_namespaced(_unchecked("spec.decode.nodeSelector.value", "a-b"), "", ""))[0]
