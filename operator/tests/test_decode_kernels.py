"""``spec.decode.hisparse.kernels``: which kernels serve decode's HiSparse ops.

The default renders nothing new (no pod, golden file or revision changes on an operator upgrade);
``hisparse`` reshapes the decode pod only, so it is a new revision and goes through the canary's parity
gate; no environment route may set the variable the field renders.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from opsupport import EXAMPLES

from hisparse_operator.api import validate
from hisparse_operator.render import revision
from hisparse_operator.render.shaping import pod_shaping
from hisparse_runtime.engine import env as E

EXAMPLE = "hisparse-deployment.yaml"


def _doc(kernels: str | None = None) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / EXAMPLE).read_text())
    if kernels is not None:
        doc["spec"]["decode"]["hisparse"]["kernels"] = kernels
    return doc


def _deployment(doc: dict[str, Any]) -> Any:
    d, errors = validate(doc, None)
    assert not errors and d is not None, [str(e) for e in errors]
    return d


def _vllm_env(workload: dict[str, Any]) -> dict[str, Any]:
    spec = workload["spec"]
    template = spec["template"] if "template" in spec else spec["leaderWorkerTemplate"]["workerTemplate"]
    [vllm] = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
    return {e["name"]: e.get("value") for e in vllm["env"]}


def test_the_example_uses_hisparse_decode() -> None:
    assert "hisparse" in _doc()["spec"]["decode"], "the test needs an example with HiSparse decode"


def test_the_default_changes_no_pod_and_no_revision() -> None:
    unset, explicit = _deployment(_doc()), _deployment(_doc("vllm"))
    assert pod_shaping(explicit) == pod_shaping(unset)
    assert revision(explicit) == revision(unset)
    shaping = pod_shaping(unset)
    assert E.HISPARSE_DECODE_KERNELS not in _vllm_env(shaping["decode"])
    assert '"kernels"' not in shaping["engineConfig"]["decode.json"], "the default is left out of the engine ConfigMap"


def test_the_projects_kernels_are_a_new_decode_revision_and_prefill_is_unchanged() -> None:
    stock, ours = _deployment(_doc()), _deployment(_doc("hisparse"))
    before, after = pod_shaping(stock), pod_shaping(ours)
    assert _vllm_env(after["decode"])[E.HISPARSE_DECODE_KERNELS] == "hisparse"
    assert after["decode"] != before["decode"]
    assert after["prefill"] == before["prefill"], "prefill's pods are not reshaped"
    assert E.HISPARSE_DECODE_KERNELS not in _vllm_env(after["prefill"])
    assert after["engineConfig"]["prefill.json"] == before["engineConfig"]["prefill.json"]
    # The revision the canary compares is derived from these objects: switching kernels is a gated rollout.
    assert revision(ours) != revision(stock)
    assert revision(_deployment(_doc("hisparse"))) == revision(ours), "the revision is stable for one setting"


@pytest.mark.parametrize(
    ("route", "path"),
    [
        (("decode", "extraEnv"), "spec.decode.extraEnv.HISPARSE_DECODE_KERNELS"),
        (("engine", "extraEnv"), "spec.engine.extraEnv.HISPARSE_DECODE_KERNELS"),
        (("prefill", "extraEnv"), "spec.prefill.extraEnv.HISPARSE_DECODE_KERNELS"),
    ],
)
@pytest.mark.parametrize("value", ["hisparse", "vllm"])
def test_no_environment_route_sets_the_variable_the_field_renders(route: tuple[str, str], path: str, value: str) -> None:
    doc = copy.deepcopy(_doc())
    doc["spec"].setdefault(route[0], {}).setdefault(route[1], {})[E.HISPARSE_DECODE_KERNELS] = value
    _, errors = validate(doc, None)
    hits = [e for e in errors if e.path == path]
    assert hits, [str(e) for e in errors]
    assert all("use spec.decode.hisparse.kernels" in e.message for e in hits), [str(e) for e in hits]
