"""The CLI's YAML input: bounded (alias bombs, depth, size), strict (duplicate keys, duplicate
documents, non-JSON tags) and never a traceback, whatever the bytes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hisparse_operator import cli
from hisparse_operator.api import validate
from hisparse_operator.render import InvalidSpec, render
from hisparse_operator.yamlio import MAX_ALIASES, MAX_BYTES, MAX_DEPTH, YamlInputError, load_documents
from opsupport import EXAMPLES, REPO

CLI = [sys.executable, "-m", "hisparse_operator.cli"]
BOMB = "\n".join(
    ["a: &a [" + ",".join(['"lol"'] * 9) + "]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]" for i in range(8)]
) + "\n"
"""Nine levels of nine aliases: 9^9 (387 million) strings once expanded, from 400 bytes."""


_MEASURE = """
import json, resource, subprocess, sys, time
start = time.monotonic()
r = subprocess.run(sys.argv[1:], stdin=sys.stdin, capture_output=True, text=True)
sys.stdout.write(json.dumps((r.returncode, r.stdout, r.stderr, time.monotonic() - start,
                       resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)))
"""


def _run(args: list[str], stdin: str) -> tuple[int, str, str, float, int]:
    """The CLI in a fresh process under a fresh parent (so the peak RSS is the CLI's alone): return code,
    stdout, stderr, wall seconds and peak RSS in KiB."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, *CLI, *args], input=stdin, capture_output=True, text=True,
                         cwd=REPO, timeout=60, check=True)
    code, stdout, stderr, seconds, peak = json.loads(out.stdout)
    return code, stdout, stderr, seconds, peak


def test_alias_bomb_is_refused_fast_with_bounded_memory():
    started = time.monotonic()
    with pytest.raises(YamlInputError, match="once aliases are expanded"):
        load_documents(BOMB)
    assert time.monotonic() - started < 1.0, "the loader must refuse before expanding"
    for command in ("validate", "render"):
        code, stdout, stderr, seconds, peak_kib = _run([command, "-"], BOMB)
        assert code == 2 and "once aliases are expanded" in stderr and stdout == ""
        assert "Traceback" not in stderr
        # The interpreter with the CLI's imports is about 60-100 MiB; an expanded bomb is gigabytes.
        assert peak_kib < 300 * 1024, f"{command} peaked at {peak_kib // 1024} MiB"
        assert seconds < 10, seconds  # includes interpreter start and imports on a loaded 2-core machine


def test_alias_bomb_loader_time_and_memory_in_process():
    import tracemalloc

    tracemalloc.start()
    started = time.monotonic()
    with pytest.raises(YamlInputError):
        load_documents(BOMB)
    elapsed = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 1.0 and peak < 16 * 1024 * 1024, (elapsed, peak)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a: 1\nb: 2\na: 3\n", 'key "a" already set in map'),
        ("a: 1\n'a': 2\n", 'key "a" already set in map'),
        ("1: x\n'1': y\n", 'key "1" already set in map'),
        ("a: &x [*x]\n", "recursive alias"),
        ("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n", "nesting deeper"),
        ("".join(f"k{i}: &a{i} x\n" for i in range(MAX_ALIASES + 1)) + "".join(f"r{i}: *a{i}\n" for i in range(MAX_ALIASES + 1)),
         "alias references"),
        ("a: !!binary aGVsbG8=\n", "no JSON form"),
        ("a: !!set {x, y}\n", "no JSON form"),
        ("a: !custom 1\n", "no JSON form"),
        ("a: .inf\n", "not a JSON number"),
        ("a: [unclosed\n", "not valid YAML"),
        ("{a: 1, a: 2}\n", "already set in map"),
        ("0x10: a\n16: b\n", "'0x10' is read as \"16\""),  # one JSON key for kubectl
        ("1.0: a\n1: b\n", 'key "1"'),
        ("y: a\n'true': b\n", 'key "true"'),
        ("null: a\n", "null mapping key has no JSON form"),  # sigs.k8s.io/yaml: unsupported map key
        ("a: !!int x\n", "cannot decode !!str `x` as a !!int"),
    ],
)
def test_refused_streams(text, reason):
    with pytest.raises(YamlInputError, match=reason):
        load_documents(text)


def test_duplicate_key_message_names_both_lines_and_the_document():
    text = "apiVersion: v1\nkind: X\nmetadata:\n  name: a\nspec:\n  replicas: 1\n  replicas: 4\n"
    with pytest.raises(YamlInputError) as refused:
        load_documents("---\n" + text)
    assert str(refused.value).startswith("document 1: line 8: key \"replicas\" already set in map (at line 7)"), str(refused.value)


def test_too_large_is_refused_before_parsing():
    with pytest.raises(YamlInputError, match="byte limit"):
        load_documents(b"a: " + b"x" * MAX_BYTES)


def test_json_forms_as_kubectl_reads_them():
    [doc] = load_documents("d: 2024-01-01\n1: one\ntrue: yes\nn: ~\nm: {<<: {a: 1}, b: 2}\n")
    assert doc.data == {"d": "2024-01-01", "1": "one", "true": True, "false": None, "m": {"a": 1, "b": 2}}
    # An explicit key may override a merged one (YAML merge semantics), which is not a duplicate.
    [doc] = load_documents("base: &b {a: 1}\nm: {<<: *b, a: 2}\n")
    assert doc.data["m"] == {"a": 2}


def test_two_documents_naming_one_object_are_refused_naming_both():
    text = (EXAMPLES / "deepseek-v32-single-node.yaml").read_text()
    with pytest.raises(YamlInputError) as refused:
        load_documents(text + "---\n" + text)
    message = str(refused.value)
    assert message.startswith("document 2 (HiSparseDeployment default/dsv32)") and "also document 1" in message
    # Another namespace is another object.
    assert len(load_documents(text + "---\n" + text.replace("namespace: default", "namespace: other"))) == 2


def test_every_cli_error_names_its_document(tmp_path):
    text = (EXAMPLES / "deepseek-v32-single-node.yaml").read_text()
    bad = text.replace("name: dsv32", "name: second").replace("enableExpertParallel: true", 'enableExpertParallel: "yes"')
    path = tmp_path / "two.yaml"
    path.write_text(text + "---\n" + bad)
    result = subprocess.run([*CLI, "validate", str(path)], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert "document 2 (HiSparseDeployment default/second): spec.decode.parallelism.enableExpertParallel:" in line
    assert 'got "yes" (a string)' in line


# --- fuzz: arbitrary documents through the CLI's code paths -------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)
_BASE = yaml.safe_load((EXAMPLES / "deepseek-v32-single-node.yaml").read_text())
_PATHS = [("spec", "decode"), ("spec", "prefill"), ("spec", "model"), ("spec", "engine"), ("spec", "kvTransfer"),
          ("spec", "decode", "parallelism"), ("spec", "decode", "hisparse"), ("metadata",), ("spec",), ()]


@st.composite
def documents(draw) -> str:
    """YAML or JSON text: a mutated example (so deep fields are reached) or arbitrary structure."""
    if draw(st.booleans()):
        doc = json.loads(json.dumps(_BASE))
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(_PATHS))
            target = doc
            for key in path:
                target = target.get(key) if isinstance(target, dict) else None
            if isinstance(target, dict):
                target[draw(st.sampled_from([*target.keys(), "x"]) if target else st.just("x"))] = draw(json_values)
    else:
        doc = draw(json_values)
    if draw(st.booleans()):
        return json.dumps(doc)
    text = yaml.safe_dump(doc)
    noise = draw(st.sampled_from(["", "---\n", "&a\n", "*a\n", ": :\n", "- [\n", "\t", "%YAML 1.1\n", "!!python/object:os.system x\n"]))
    return noise + text if draw(st.booleans()) else text + noise


def _cli_paths(text: str) -> None:
    """What ``hisparse validate`` and ``render`` do with a stream, without a process per example."""
    try:
        docs = load_documents(text)
    except YamlInputError as exc:
        assert str(exc)
        return
    for doc in docs:
        if not isinstance(doc.data, dict):
            continue
        _, errors = validate(doc.data)
        assert all(e.path and e.message for e in errors)
        try:
            render(doc.data)
        except InvalidSpec as exc:
            assert exc.errors


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=documents())
def test_no_traceback_for_any_document(text):
    _cli_paths(text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_no_traceback_for_any_bytes(data):
    try:
        load_documents(data)
    except YamlInputError:
        pass


def test_cli_commands_read_through_the_loader():
    """The fuzz above exercises the CLI's own reader: `validate` and `render` call it."""
    import inspect

    assert "load_documents" in inspect.getsource(cli._load_documents)
    result = subprocess.run([*CLI, "validate", "-"], input="a: 1\na: 2\n", capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 2 and "already set in map" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["12e4567890", "1e5", "0123456789", "1.5", "-7", ".5"])
def test_strings_kubectl_would_read_as_numbers_are_quoted(value: str) -> None:
    """A revision or KV hash label can look like a number to a YAML reader (``12e4567890`` has float syntax,
    though it overflows Go's ParseFloat and go-yaml keeps it a string): the CLI's output quotes it."""
    from hisparse_operator.yamlio import dump_all

    text = dump_all([{"metadata": {"labels": {"hash": value}}}])
    assert f"hash: '{value}'" in text, text
    assert yaml.safe_load(text)["metadata"]["labels"]["hash"] == value


# --- plain scalars as kubectl 1.35 reads them (sigs.k8s.io/yaml's go-yaml v2, then Go's JSON encoder) ----------

@pytest.mark.parametrize(
    ("text", "sent"),
    [
        ("93:20", "93:20"),  # go-yaml v2 has no sexagesimal numbers (PyYAML: 5600)
        ("=", "="),  # no YAML 1.1 value tag either
        ("y", True), ("Y", True), ("n", False), ("yes", True), ("on", True), ("off", False), ("NO", False),
        ("4096.0", 4096), ("9.6e1", 96), ("1e3", 1000), ("08", 8),  # floats; integral ones are sent as integers
        ("0.5", 0.5), (".5", 0.5), ("1e400", "1e400"),  # Go's ParseFloat fails on overflow: a string
        ("0x10", 16), ("0o17", 15), ("0755", 493), ("1_000", 1000), ("+5", 5), ("-0x10", -16), ("0b101", 5),
        ("12345678901234567890", 1.2345678901234567e19),  # uint64: kubectl re-encodes it as a float64
        ("0x10000000000000000", "0x10000000000000000"), ("<<", "<<"),  # beyond 64 bits; a merge key as a value
        ("1.0.0", "1.0.0"), ("2024-01-01", "2024-01-01"), ("~", None), ("", None), ("abc", "abc"),
    ],
)
def test_plain_scalars_resolve_as_kubectl_sends_them(text: str, sent) -> None:
    [doc] = load_documents(f"v: {text}\n")
    assert doc.data["v"] == sent and type(doc.data["v"]) is type(sent), doc.data


def test_integral_floats_are_accepted_where_the_crd_types_an_integer():
    """kubectl sends ``4096.0`` as 4096, which the apiserver takes for an integer field."""
    text = (EXAMPLES / "deepseek-v32-single-node.yaml").read_text()
    assert "indexTopk: 2048" in text
    [doc] = load_documents(text.replace("indexTopk: 2048", "indexTopk: 2.048e3"))
    _, errors = validate(doc.data)
    assert errors == [] and doc.data["spec"]["model"]["indexTopk"] == 2048


def test_an_unquoted_y_in_a_string_field_is_refused_with_quote_it():
    text = (EXAMPLES / "deepseek-v32-single-node.yaml").read_text()
    [doc] = load_documents(text.replace("  decode:\n    replicas: 1\n", "  decode:\n    replicas: 1\n    extraEnv:\n      VLLM_LOGGING_LEVEL: y\n"))
    _, errors = validate(doc.data, spelled=doc.spelled)
    [error] = [e for e in errors if e.path == "spec.decode.extraEnv.VLLM_LOGGING_LEVEL"]
    assert "got true (a boolean)" in error.message and 'quote it: "y"' in error.message, error.message


# --- the writer: every string stays a string for a YAML 1.1 reader (kubectl's and PyYAML's) --------------------

_YAML11_LOOKALIKES = st.one_of(
    st.from_regex(r"\A[0-9]{1,8}[eE][0-9]{1,3}\Z"),  # revision-hash-like: 1234567e12
    st.from_regex(r"\A[-+]?[0-9]{0,6}\.?[0-9]{0,6}([eE][-+]?[0-9]{1,3})?\Z"),
    st.from_regex(r"\A[0-9]{1,3}(:[0-5]?[0-9]){1,3}\Z"),  # sexagesimal
    st.from_regex(r"\A0[xXoObB]?[0-9a-fA-F_]{1,8}\Z"),  # hex, octal, binary
    st.sampled_from(["y", "Y", "n", "N", "yes", "No", "on", "OFF", "true", "False", "~", "null", "NULL", "=", "<<",
                     ".inf", "-.Inf", ".nan", "2024-01-01", ""]),
    st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?\Z"),  # label values, revision hashes
)


@settings(max_examples=400, deadline=None)
@given(value=_YAML11_LOOKALIKES)
def test_dumped_strings_read_back_as_the_same_strings(value: str) -> None:
    from hisparse_operator.yamlio import dump_all

    text = dump_all([{"metadata": {"labels": {"hash": value}}}])
    assert yaml.load(text, Loader=yaml.SafeLoader)["metadata"]["labels"]["hash"] == value, text  # YAML 1.1 (PyYAML)
    [doc] = load_documents(text)  # YAML 1.1 as kubectl's go-yaml v2 resolves it
    assert doc.data["metadata"]["labels"]["hash"] == value, text


# --- Kubernetes' name, label, env-name and quantity rules (engine/kube.py): each suggested fix passes -----------

@pytest.mark.parametrize(
    ("check", "value"),
    [
        ("dns1123_label_problem", "Team_A"), ("dns1123_label_problem", "-x-"), ("dns1035_label_problem", "1dsv"),
        ("dns1035_label_problem", "My.Model"), ("label_value_problem", "NVIDIA H200"), ("label_value_problem", "x" * 70),
        ("qualified_name_problem", "gpu type"), ("qualified_name_problem", "Example.COM/gpu"), ("env_var_name_problem", "A=B"),
        ("quantity_problem", "64GB"),
    ],
)
def test_kube_rule_refuses_and_its_fix_is_accepted(check, value):
    import re as _re

    from hisparse_runtime.engine import kube

    problem = getattr(kube, check)(value)
    assert problem and repr(value) in problem
    fix = _re.search(r"use '?([^';]+)'?$", problem).group(1)
    assert getattr(kube, check)(fix) is None, (problem, fix)


def test_exact_fit_of_the_host_pool_is_accepted():
    """1.5 GiB pool + 3.06 GiB headroom in a 4.56Gi request: in binary floating point 1.5 + 3.06 is
    4.5600000000000005 and the fit was refused; the rule compares decimals."""
    doc = yaml.safe_load((EXAMPLES / "deepseek-v32-single-node.yaml").read_text())
    dec = doc["spec"]["decode"]
    dec.update(parallelism={"gpusPerNode": 1}, hisparse={"hostPoolGiB": 1.5}, hostMemoryHeadroomGiB=3.06)
    dec["resources"]["requests"]["memory"] = "4.56Gi"
    assert validate(doc)[1] == []
    dec["resources"]["requests"]["memory"] = "4.55Gi"
    assert [e.path for e in validate(doc)[1]] == ["spec.decode.resources.requests.memory"]


@settings(max_examples=300, deadline=None)
@given(repo=st.from_regex(r"\A[A-Za-z0-9_.-]{1,12}/[A-Za-z0-9_.-]{1,12}\Z"))
def test_hf_repo_rule_agrees_with_huggingface_hub_on_ascii(repo):
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from hisparse_runtime.engine.model import hf_repo_problem

    try:
        validate_repo_id(repo)
        hub_ok = True
    except HFValidationError:
        hub_ok = False
    assert (hf_repo_problem(repo) is None) == hub_ok, repo


_REVISION_EDGES = ["main", "v1.0", "refs/pr/1", "a..b", "a/.b", ".a", "a.", "a.lock", "a.lock/b", "a//b", "/a", "a/",
                   "@", "a@{1}", "@b", "a+b", "a_b-c", "x" * 200, "a/b.lock", "0" * 39, "0" * 40, "A" * 40]


@settings(max_examples=400, deadline=None)
@given(revision=st.sampled_from(_REVISION_EDGES) | st.text(alphabet="ab09._/+-@{", min_size=1, max_size=14)
       | st.text(alphabet="ab ~^:?*[\\$;|&`'\"()<>", min_size=1, max_size=6))
def test_revision_rule_agrees_with_git_check_ref_format(revision):
    """Within the characters a revision may hold (shell-inert ones), a revision is accepted exactly when it is a
    commit sha or git accepts it as a ref name; outside them it is refused even where git would take it."""
    from hisparse_runtime.engine.model import REVISION_PATTERN, revision_problem

    if revision.startswith("-"):
        return  # the CRD's own rule refuses it, with its own message (examples/invalid/revision-read-as-option.yaml)
    git_ok = subprocess.run(["git", "check-ref-format", "--allow-onelevel", revision], capture_output=True,
                            check=False).returncode == 0
    ours_ok = revision_problem(revision) is None
    if re.match(REVISION_PATTERN, revision):
        assert ours_ok == git_ok, (revision, git_ok)
    else:
        assert not ours_ok, revision
