"""Graceful removal of a serving pod: a preStop sleep while the EPP and kube-proxy drop it, then vLLM's own
drain (``--shutdown-timeout``, rendered), all inside ``terminationGracePeriodSeconds``. The real-node proof
under client load is ``e2e/tests/test_e2e_cpu_example.py``."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from hisparse_operator.api import HiSparseDeployment
from hisparse_operator.api import labels as L
from hisparse_operator.api.roles import role_settings
from hisparse_operator.api.spec import RoleSpec
from hisparse_operator.render import InvalidSpec, render
from hisparse_runtime.engine import render_argv, termination_grace_seconds
from hisparse_runtime.engine import flags as F
from hisparse_runtime.engine.hisparse import DRAIN_SECONDS
from opsupport import EXAMPLES

FLAGSHIP = EXAMPLES / "hisparse-deployment.yaml"
DEFAULT_SLEEP = RoleSpec.model_fields["pre_stop_sleep_seconds"].default


def _doc() -> dict[str, Any]:
    return yaml.safe_load(FLAGSHIP.read_text())


def _serving_templates(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each role's pod spec (a LeaderWorkerSet's one template serves leader and workers)."""
    out = {}
    for o in objs:
        role = o["metadata"].get("labels", {}).get(L.ROLE)
        if role and o["kind"] == "Deployment":
            out[role] = o["spec"]["template"]["spec"]
        elif role and o["kind"] == "LeaderWorkerSet":
            out[role] = o["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    return out


def _vllm(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == "vllm")


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_deleted_pod_sleeps_then_drains_inside_its_grace_period(role):
    doc = _doc()
    pod = _serving_templates(render(doc))[role]
    settings = role_settings(HiSparseDeployment.model_validate(doc), role)
    assert DEFAULT_SLEEP > 0
    assert _vllm(pod)["lifecycle"] == {"preStop": {"sleep": {"seconds": DEFAULT_SLEEP}}}
    # The sleep comes out of the grace period: drain and unpinning keep all of theirs.
    assert pod["terminationGracePeriodSeconds"] == DEFAULT_SLEEP + termination_grace_seconds(settings)
    assert termination_grace_seconds(settings) >= DRAIN_SECONDS
    argv = render_argv(settings, worker_index=0, leader_address="leader.invalid")
    assert argv[argv.index(F.SHUTDOWN_TIMEOUT) + 1] == str(DRAIN_SECONDS)


def test_a_role_s_own_sleep_and_zero_for_none():
    doc = _doc()
    doc["spec"]["prefill"]["preStopSleepSeconds"] = 0
    doc["spec"]["decode"]["preStopSleepSeconds"] = 45
    pods = _serving_templates(render(doc))
    d = HiSparseDeployment.model_validate(doc)
    assert "lifecycle" not in _vllm(pods["prefill"])
    assert pods["prefill"]["terminationGracePeriodSeconds"] == termination_grace_seconds(role_settings(d, "prefill"))
    assert _vllm(pods["decode"])["lifecycle"]["preStop"]["sleep"]["seconds"] == 45
    assert pods["decode"]["terminationGracePeriodSeconds"] == 45 + termination_grace_seconds(role_settings(d, "decode"))


@pytest.mark.parametrize("value", [-1, 601])
def test_a_sleep_out_of_range_is_refused_with_its_field(value):
    doc = _doc()
    doc["spec"]["decode"]["preStopSleepSeconds"] = value
    with pytest.raises((ValidationError, InvalidSpec)) as err:
        HiSparseDeployment.model_validate(doc)
    assert "preStopSleepSeconds" in str(err.value) or "pre_stop_sleep_seconds" in str(err.value)


@pytest.mark.parametrize("spelling", [["--shutdown-timeout", "5"], ["--shutdown-timeout=0"], ["--shutdown_timeout", "0"]])
def test_extra_args_cannot_shorten_the_drain(spelling):
    """vLLM's drain is sized into the grace period: an extra argument that sets it (any spelling) is refused,
    naming the fixed value, and nothing is rendered."""
    doc = _doc()
    doc["spec"]["decode"]["extraArgs"] = spelling
    with pytest.raises(InvalidSpec) as err:
        render(doc)
    assert "spec.decode.extraArgs" in str(err.value) and f"{DRAIN_SECONDS} s" in str(err.value), str(err.value)
