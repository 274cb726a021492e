"""What is rendered for each supported llm-d release follows the one table in ``api/llmd.py``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from hisparse_operator.api import llmd
from hisparse_operator.render import render

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hisparse-deployment.yaml"


def _render(**routing: Any) -> list[dict[str, Any]]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["routing"].update(routing)
    return render(copy.deepcopy(doc))


def _epp_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-epp")]
    return yaml.safe_load(cm["data"]["epp-config.yaml"])


def _containers(objs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("name") == name and "image" in node:
                out.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(objs)
    return out


def test_table_covers_exactly_the_api_versions():
    assert set(llmd.RELEASES) == set(get_args(llmd.LlmdVersion))


@pytest.mark.parametrize("version", get_args(llmd.LlmdVersion))
def test_epp_config_is_the_releases(version: str):
    rel = llmd.release(version)
    objs = _render(llmdVersion=version, pdThresholdTokens=100)
    cfg = _epp_config(objs)
    assert cfg["apiVersion"] == rel.epp_config_api
    types = [p["type"] for p in cfg["plugins"]]
    assert rel.pd_profile_handler in types and rel.prefill_header_plugin in types
    assert not {"disagg-profile-handler", "prefix-based-pd-decider"} & set(types)
    (handler,) = [p for p in cfg["plugins"] if p["type"] == rel.pd_profile_handler]
    assert handler["parameters"]["threshold"] == 100 * llmd.CHARS_PER_TOKEN
    (prefix,) = [p for p in cfg["plugins"] if p["type"] == "prefix-cache-scorer"]
    # The handler converts prefix hits with the scorer's own block size.
    assert handler["parameters"]["hashBlockSize"] == prefix["parameters"]["blockSize"] == 64 * llmd.CHARS_PER_TOKEN
    assert ("prefixPluginType" in handler["parameters"]) == rel.pd_handler_prefix_type_param
    (epp,) = _containers(objs, "epp")
    assert epp["image"] == rel.epp_image
    kv_flag = f"--kv-cache-usage-percentage-metric={llmd.VLLM_KV_CACHE_USAGE_METRIC}"
    assert (kv_flag in epp["args"]) == (rel.epp_kv_cache_metric_default != llmd.VLLM_KV_CACHE_USAGE_METRIC)
    (role,) = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("-epp")]
    x_rules = [r for r in role["rules"] if r["apiGroups"] == ["inference.networking.x-k8s.io"]]
    assert x_rules[0]["resources"] == list(rel.epp_watched_x_resources)


def test_sidecar_args_follow_the_sidecar_release():
    objs = _render(sidecarVersion="v0.5.1")
    (sidecar,) = _containers(objs, "routing-proxy")
    assert sidecar["image"] == llmd.release("v0.5.1").sidecar_image
    assert "-connector=nixlv2" in sidecar["args"]
    # No served sidecar release can guard a v1 pool, so the guard is off and no sidecar RBAC is rendered.
    assert not [a for a in sidecar["args"] if a.startswith(("-pool-group", "-enable-ssrf"))]
    assert "env" not in sidecar  # no SSRF guard, no pool variables (and no empty list the apiserver drops)
    assert not [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("-sidecar")]


def test_explicit_images_win():
    objs = _render(eppImage="registry.example/epp@sha256:" + "a" * 64, sidecarImage="registry.example/sc:1")
    assert _containers(objs, "epp")[0]["image"].startswith("registry.example/epp@")
    assert _containers(objs, "routing-proxy")[0]["image"] == "registry.example/sc:1"


@pytest.mark.parametrize("version", llmd.SIDECARS_WITHOUT_V1_SSRF)
def test_ssrf_guard_that_cannot_read_a_v1_pool_is_refused(version: str):
    from hisparse_operator.render import InvalidSpec

    with pytest.raises((InvalidSpec, ValueError), match="ssrfProtection"):
        _render(sidecarVersion=version, ssrfProtection=True)


def test_epp_metrics_auth_follows_the_spec():
    """Unset: the EPP serves /metrics to the PodMonitor's plain scrape (GIE's runner defaults to auth on,
    so the flag is always rendered). Set: auth on, and the PodMonitor sends the named Secret's token."""
    def epp_and_monitor(monitoring: dict[str, Any] | None) -> tuple[list[str], dict[str, Any]]:
        doc = yaml.safe_load(EXAMPLE.read_text())
        if monitoring is not None:
            doc["spec"]["monitoring"] = monitoring
        objs = render(doc)
        (mon,) = [o for o in objs if o["kind"] == "PodMonitor" and o["metadata"]["name"].endswith("-epp")]
        return _containers(objs, "epp")[0]["args"], mon["spec"]["podMetricsEndpoints"][0]

    args, endpoint = epp_and_monitor(None)
    assert "--metrics-endpoint-auth=false" in args and "authorization" not in endpoint
    args, endpoint = epp_and_monitor({"eppMetricsAuth": {"tokenSecretName": "epp-metrics-reader"}})
    assert "--metrics-endpoint-auth=true" in args
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": "epp-metrics-reader", "key": "token"}}
    # Only the EPP's monitor carries it: vLLM's /metrics asks for nothing.
    objs = render({**yaml.safe_load(EXAMPLE.read_text())})
    assert all("authorization" not in o["spec"]["podMetricsEndpoints"][0] for o in objs if o["kind"] == "PodMonitor")
