"""Our YAML reader and writer against kubectl itself: the same bytes must become the same JSON.

``kubectl label --local -f FILE -o json`` reads a manifest with kubectl's own decoder (sigs.k8s.io/yaml
over go-yaml v2, then Go's JSON encoder) and prints what it would send, with no server: the oracle for
what ``kubectl apply -f`` sends the apiserver. ``hisparse`` reads the same files (``render``,
``validate``, the dev cluster) and must see what the apiserver will see, so every plain scalar here is
read by both and compared value for value and type for type (JSON has one number type; an integer and
an integral float are told apart as kubectl prints them: ``16`` against ``16.0`` cannot occur, Go prints
integral floats without a fraction, so both sides' JSON texts are compared).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hisparse_devcluster import Tools
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hisparse_operator.yamlio import YamlInputError, dump_all, load_documents

# Spellings where YAML 1.1, YAML 1.2, go-yaml v2 and PyYAML disagree somewhere: booleans, nulls, bases,
# signs, underscores, exponents, sexagesimals, dates, special floats, overflow.
TRICKY = [
    "y", "Y", "n", "N", "yes", "Yes", "YES", "no", "No", "on", "On", "ON", "off", "Off", "OFF", "true", "True",
    "TRUE", "false", "False", "FALSE", "tRUE", "null", "Null", "NULL", "nUll", "~", "=", "<<",
    "0", "-0", "+0", "00", "08", "09", "010", "017", "0755", "0o17", "0O17", "0o8", "0x10", "0X10", "-0x10", "+0x10",
    "0xg", "0b101", "0B101", "-0b101", "0b2", "1_000", "1__0", "_1", "1_", "0x_10", "0b_1", "+5", "-5", "+-5",
    "4096.0", "9.6e1", "1e3", "1E3", "1e+3", "1e-3", "1.e3", ".5", "-.5", "+.5", "5.", "0.0", "-0.0", "1e400",
    "-1e400", "1e-400", ".nan", ".NaN", "1_000.5", "1,000", "1:30", "93:20", "190:20:30", "-1:30", "1:60",
    "2024-01-01", "2024-1-1", "2024-01-01T00:00:00Z", "12345678901234567890", "18446744073709551615",
    "18446744073709551616", "-9223372036854775808", "-9223372036854775809", "9223372036854775807",
    "0x10000000000000000", "0xFFFFFFFFFFFFFFFF", "1.5e19", "1e21", "1e20", "123456789.123456789",
    "1.0.0", "v1", "0e", "e3", "0x", "0o", "0b", "inf", "Infinity", "nan", "1e", "--1", "0.1e1", "3.0e-2",
    "1E100", "-1e39", "3.5e38", "1e-50",
]


@pytest.fixture(scope="module")
def kubectl(tools: Tools, tmp_path_factory: pytest.TempPathFactory):
    import subprocess

    work = tmp_path_factory.mktemp("yaml-oracle")

    def read(text: str) -> dict:
        path = work / "doc.yaml"
        path.write_text(text)
        res = subprocess.run([str(tools.kubectl), "label", "--local", "-f", str(path), "oracle=1", "-o", "json"],
                             capture_output=True, text=True, env={"KUBECONFIG": "/dev/null", "PATH": "/usr/bin:/bin"},
                             timeout=60)  # fmt: skip
        if res.returncode != 0:
            return {"error": res.stderr.strip()}
        # One JSON object per document, printed one after another.
        decoder, text, objects = json.JSONDecoder(), res.stdout, []
        while text.strip():
            out, end = decoder.raw_decode(text.lstrip())
            text = text.lstrip()[end:]
            labels = out["metadata"].get("labels") or {}
            labels.pop("oracle", None)
            if not labels:
                out["metadata"].pop("labels", None)
            objects.append(out)
        return objects[0] if len(objects) == 1 else {"items": objects}

    return read


def _doc(pairs: list[tuple[str, str]]) -> str:
    body = "".join(f"  {key}: {value}\n" for key, value in pairs)
    return f"apiVersion: example.com/v1\nkind: Oracle\nmetadata:\n  name: x\nspec:\n{body}"


def _ours(text: str) -> dict:
    try:
        [doc] = load_documents(text)
    except YamlInputError as exc:
        return {"error": str(exc)}
    return doc.data


def _canon(value):
    """A JSON value as the apiserver decodes it: an integer literal that fits int64 is an integer, every
    other number a float64 (kubectl prints 1.2345678901234567e19 as 12345678901234567000; ours holds the
    float itself)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return ("int", value)
    if isinstance(value, (int, float)):
        return ("float", float(value))
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    return [_canon(v) for v in value]


def _compare(kubectl, values: list[str]) -> None:
    pairs = [(f"k{i}", v) for i, v in enumerate(values)]
    theirs, ours = kubectl(_doc(pairs)), _ours(_doc(pairs))
    if "error" in theirs or "error" in ours:
        # One bad scalar fails the whole document: find which, one document each.
        wrong = {}
        for key, value in pairs:
            t, o = kubectl(_doc([(key, value)])), _ours(_doc([(key, value)]))
            if ("error" in t) != ("error" in o) or ("error" not in t and _canon(t["spec"]) != _canon(o["spec"])):
                wrong[value] = (t.get("error") or t["spec"][key], o.get("error") or o["spec"][key])
        assert not wrong, f"plain scalars read differently (kubectl, ours): {wrong}"
        return
    wrong = {value: (theirs["spec"].get(key), ours["spec"].get(key)) for key, value in pairs
             if _canon(theirs["spec"].get(key)) != _canon(ours["spec"].get(key))}  # fmt: skip
    assert not wrong, f"plain scalars read differently (kubectl, ours): {wrong}"


def test_tricky_plain_scalars_read_as_kubectl_reads_them(kubectl) -> None:
    _compare(kubectl, TRICKY)


def test_tricky_keys_read_as_kubectl_reads_them(kubectl) -> None:
    """Map keys become JSON object keys: kubectl turns a non-string key into its Go spelling."""
    keys = [k for k in TRICKY if k not in ("~", "<<", "=")]
    wrong = {}
    for key in keys:
        text = f"apiVersion: example.com/v1\nkind: Oracle\nmetadata:\n  name: x\nspec:\n  {key}: v\n"
        theirs, ours = kubectl(text), _ours(text)
        if "error" in theirs or "error" in ours:
            if ("error" in theirs) != ("error" in ours):
                wrong[key] = (theirs.get("error") or theirs["spec"], ours.get("error") or ours["spec"])
        elif list(theirs["spec"]) != list(ours["spec"]):
            wrong[key] = (list(theirs["spec"]), list(ours["spec"]))
    assert not wrong, f"keys read differently (kubectl, ours): {wrong}"


_SCALAR = st.text(alphabet=string.digits + "+-._:eExXoObB" + "yntrufalsNOY~", min_size=1, max_size=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_SCALAR, min_size=20, max_size=60))
def test_generated_plain_scalars_read_as_kubectl_reads_them(kubectl, values: list[str]) -> None:
    # Only scalars that stay plain scalars in a block map value (no indicator that makes YAML structure).
    plain = [v for v in values if not v.startswith(("-", ":", "~~", "? ")) and ": " not in v and not v.endswith(":")]
    if plain:
        _compare(kubectl, plain)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(alphabet=string.printable.replace("\x0b", "").replace("\x0c", "") + "éß", max_size=12),
                min_size=1, max_size=30))
def test_strings_we_write_are_read_back_by_kubectl_as_the_same_strings(kubectl, values: list[str]) -> None:
    doc = {"apiVersion": "example.com/v1", "kind": "Oracle", "metadata": {"name": "x"},
           "spec": {f"k{i}": v for i, v in enumerate(values)}}  # fmt: skip
    theirs = kubectl(dump_all([doc]))
    assert "error" not in theirs, theirs
    assert theirs["spec"] == doc["spec"]


def test_the_oracle_can_disagree(kubectl) -> None:
    """Negative control: PyYAML's YAML 1.1 reading differs from kubectl's on these, so the comparison
    above is not vacuous."""
    import yaml

    pyyaml = yaml.safe_load(_doc([("a", "93:20"), ("b", "0o17")]))["spec"]
    theirs = kubectl(_doc([("a", "93:20"), ("b", "0o17")]))["spec"]
    assert json.dumps(pyyaml) != json.dumps(theirs), (pyyaml, theirs)


def test_oracle_reads_our_examples_as_we_do(kubectl) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples"
    for path in sorted(examples.glob("*.yaml")):
        text = path.read_text()
        docs = load_documents(text)
        if len(docs) != 1:
            continue
        theirs = kubectl(text)
        assert "error" not in theirs, (path.name, theirs)
        ours = dict(docs[0].data)
        assert json.dumps(theirs, sort_keys=True) == json.dumps(ours, sort_keys=True), path.name


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="0123456789abcdef", min_size=10, max_size=10), st.text(alphabet="0123456789eE.+-_", min_size=1, max_size=12))
def test_rendered_objects_read_back_by_kubectl_unchanged(kubectl, revision: str, label: str) -> None:
    """``hisparse render | kubectl apply -f -``: whatever hash a revision label gets, and whatever a label value
    looks like, kubectl reads our YAML back as the objects we rendered."""
    from hisparse_operator.render import render

    examples = Path(__file__).resolve().parents[2] / "examples"
    import yaml

    doc = yaml.safe_load((examples / "cpu-tiny.yaml").read_text())
    doc["metadata"].setdefault("labels", {})["team"] = "x" + label.replace("+", "").replace("_", "") + "x"
    objects = render(doc)
    for obj in objects:
        obj["metadata"].setdefault("labels", {})["serving.hisparse.dev/revision"] = revision  # every hash a revision can have
    theirs = kubectl(dump_all(objects))
    assert "error" not in theirs, theirs
    assert len(theirs["items"]) == len(objects)
    for got, obj in zip(theirs["items"], objects):
        assert _canon(got) == _canon(obj), (obj["kind"], obj["metadata"]["name"])
