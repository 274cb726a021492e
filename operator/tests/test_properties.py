"""Property tests over the API: any manifest is either refused with field paths, or renders objects
that pass the Kubernetes schemas and whose argv vLLM 0.33's parser accepts. Nothing raises anything
else."""

from __future__ import annotations

import copy
import os
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hisparse_operator.api import role_settings, role_spec, validate
from hisparse_operator.render import InvalidSpec, render
from hisparse_runtime.engine import render_argv
from opsupport import EXAMPLES

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
BASES = [yaml.safe_load((EXAMPLES / n).read_text()) for n in ("deepseek-v32-single-node.yaml", "hisparse-deployment.yaml")]
DELETE = object()

ints = st.integers(min_value=-3, max_value=70000)
small = st.integers(min_value=-1, max_value=80)
FLAG_POOL = ["--max-num-seqs", "256", "-tp", "2", "--enable_dbo", "-pp", "--no-scheduler-reserve-full-isl",
             "--kv-transfer-config={}", "-cc.cudagraph_mode=FULL", "--max-num-batched-tokens=8192", "-1", "--enable-chunked-prefill"]
MUTATIONS: list[tuple[tuple[str, ...], st.SearchStrategy[Any]]] = [
    (("spec", "decode", "hisparse", "hostPoolGiB"), st.one_of(st.floats(-10, 5000, allow_nan=False), st.just("lots"))),
    (("spec", "decode", "hisparse", "deviceBufferSize"), st.one_of(ints, st.just(DELETE))),
    (("spec", "decode", "hisparse"), st.just(DELETE)),
    (("spec", "decode", "parallelism", "dataParallelSize"), small),
    (("spec", "decode", "parallelism", "dataParallelSizeLocal"), small),
    (("spec", "decode", "parallelism", "tensorParallelSize"), small),
    (("spec", "decode", "parallelism", "nodes"), small),
    (("spec", "decode", "parallelism", "gpusPerNode"), small),
    (("spec", "decode", "parallelism", "all2allBackend"), st.sampled_from(["naive", "nope", DELETE])),
    (("spec", "decode", "resources", "requests", "memory"), st.sampled_from(["100Gi", "2Ti", "900Gi", "abc", 12345, "1.5e3Gi", DELETE])),
    (("spec", "model", "indexTopk"), st.one_of(ints, st.just(DELETE))),
    (("spec", "model", "source"), st.sampled_from(["hf://a/b", "pvc://models/x", "s3://bucket/p", "http://x", "hf://"])),
    (("spec", "decode", "extraArgs"), st.lists(st.sampled_from(FLAG_POOL), max_size=5)),
    (("spec", "engine", "extraEnv"), st.dictionaries(st.sampled_from(["UCX_TLS", "FOO", "VLLM_USE_V2_MODEL_RUNNER"]), st.just("0"), max_size=2)),
    (("spec", "decode", "enableDbo"), st.booleans()),
    (("spec", "decode", "speculativeConfig"), st.sampled_from([{"method": "mtp"}, DELETE])),
    (("spec", "decode", "compilationConfig"), st.sampled_from([{"cudagraph_mode": "FULL"}, {"cudagraph_mode": "PIECEWISE"}, {"cudagraph_capture_sizes": [1, 2]}, DELETE])),
    (("spec", "kvTransfer"), st.fixed_dictionaries({"nixl": st.fixed_dictionaries({"sideChannelPort": ints, "linkCheckPort": ints})})),
    (("spec", "engine", "blockSize"), st.sampled_from([0, 16, 64, 100, 256])),
    (("spec", "engine", "maxModelLen"), ints),
    (("spec", "routedExperts"), st.fixed_dictionaries({"enabled": st.booleans()})),
    (("spec", "prefill"), st.just(DELETE)),
    (("spec", "rollout", "steps"), st.lists(st.fixed_dictionaries({"weight": st.integers(-5, 120)}), max_size=4)),
    (("metadata", "name"), st.text(alphabet="abc-Z9", min_size=0, max_size=50)),
    (("spec", "decode", "unknownField"), st.just(1)),
    (("spec", "decode", "replicas"), st.integers(-1, 600)),
]


def _apply(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


@st.composite
def manifests(draw) -> dict[str, Any]:
    doc = copy.deepcopy(draw(st.sampled_from(BASES)))
    for index in draw(st.lists(st.integers(0, len(MUTATIONS) - 1), max_size=4, unique=True)):
        path, values = MUTATIONS[index]
        _apply(doc, path, draw(values))
    return doc


@pytest.fixture(scope="module")
def vllm_parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    return parser


@pytest.mark.vllm
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=manifests())
def test_refused_with_field_paths_or_rendered_valid(doc, vllm_parser):
    d, errors = validate(doc)
    if errors:
        for e in errors:
            assert e.message and e.rule
            assert e.path.split(".")[0].split("[")[0] in {"spec", "metadata", "(root)", "apiVersion", "kind"}, e
        with pytest.raises(InvalidSpec):
            render(doc)
        return
    assert d is not None
    objects = render(doc)
    for obj in objects:
        if "." not in obj["apiVersion"].split("/")[0] or obj["apiVersion"].startswith(("apps/", "policy/", "rbac.")):
            kubernetes_validate.validate(obj, "1.35.0", strict=True)
    for role in ("prefill", "decode"):
        if role_spec(d, role) is None:
            continue
        s = role_settings(d, role)
        for worker in {0, s.parallelism.nodes - 1}:
            argv = render_argv(s, worker_index=worker, leader_address="leader")
            vllm_parser.parse_args(argv[1:])  # SystemExit(2) on anything vLLM does not accept


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(spec=json_values, name=json_values)
def test_arbitrary_json_never_crashes_validation(spec, name):
    _, errors = validate({"apiVersion": "serving.hisparse.dev/v1alpha1", "kind": "HiSparseDeployment",
                          "metadata": {"name": name}, "spec": spec})
    assert errors and all(e.path for e in errors)
