"""A role's GPU family: pinned by its placement for the render, checked against node facts at admission."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from hisparse_operator.api import ClusterFacts, role_settings, validate
from hisparse_operator.api.facts import pinned_architecture
from hisparse_operator.api.spec import DecodeSpec

from opsupport import EXAMPLES


def _node(name: str, product: str, memory: str = "2000Gi") -> dict[str, Any]:
    """A Node as the apiserver returns it, labelled the way GPU feature discovery labels GPU nodes."""
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "spec": {},
        "status": {"allocatable": {"memory": memory, "nvidia.com/gpu": "8", "cpu": "192"}},
    }


def _glm(pinned: str | None) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / "glm5-blackwell.yaml").read_text())
    for role in ("prefill", "decode"):
        spec = doc["spec"][role]
        spec.pop("tolerations", None)
        if pinned is None:
            spec.pop("nodeSelector")
        else:
            spec["nodeSelector"] = {"nvidia.com/gpu.product": pinned}
    return doc


@pytest.mark.parametrize(
    ("placement", "arch"),
    [
        (dict(node_selector={"nvidia.com/gpu.product": "NVIDIA-B200"}), "blackwell"),
        (dict(node_selector={"nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"}), "hopper"),
        (dict(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-B200", "NVIDIA-GB200"]}]}]}}}),
         "blackwell"),
        (dict(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200", "NVIDIA-B200"]}]}]}}}),
         None),  # two families: not pinned
        (dict(node_selector={"kubernetes.io/arch": "amd64"}), None),
    ],
)
def test_pinned_architecture(placement, arch):
    assert pinned_architecture(DecodeSpec(**placement)) == arch


def test_pinned_blackwell_renders_its_backend_and_passes_against_blackwell_nodes():
    facts = ClusterFacts.from_nodes([_node(f"b200-{i}", "NVIDIA-B200") for i in range(3)])
    d, errors = validate(_glm("NVIDIA-B200"), facts)
    assert errors == [] and d is not None
    assert role_settings(d, "decode").gpu_architecture == "blackwell"


def test_unpinned_glm_that_can_land_on_blackwell_is_refused_with_node_facts():
    facts = ClusterFacts.from_nodes([_node("h200-0", "NVIDIA-H200"), _node("b200-0", "NVIDIA-B200"), _node("b200-1", "NVIDIA-B200")])
    _, errors = validate(_glm(None), facts)
    hits = [e for e in errors if e.path == "spec.decode.nodeSelector"]
    assert hits and "blackwell nodes (b200-0, b200-1)" in hits[0].message and "nvidia.com/gpu.product" in hits[0].message
    # A named backend without the pin still lacks the scale-format variable the render sets for pinned roles.
    named = _glm(None)
    named["spec"]["decode"]["moeBackend"] = "triton"
    [hit] = [e for e in validate(named, facts)[1] if e.path == "spec.decode.nodeSelector"]
    assert "needs VLLM_USE_DEEP_GEMM_E8M0=0" in hit.message
    named["spec"]["decode"]["extraEnv"] = {"VLLM_USE_DEEP_GEMM_E8M0": "0"}
    assert not [e for e in validate(named, facts)[1] if e.path.startswith("spec.decode")]
    assert any(e.path == "spec.prefill.nodeSelector" for e in errors)
    # Without facts, nothing is known about the nodes: the render leaves the backend to vLLM and the
    # pod's preflight refuses a Blackwell GPU (runtime/tests/test_preflight.py).
    assert validate(_glm(None))[1] == []
    # On Hopper-only nodes the model needs no named backend.
    assert validate(_glm(None), ClusterFacts.from_nodes([_node("h200-0", "NVIDIA-H200")]))[1] == []


def test_explicit_backend_for_another_family_is_refused_on_the_nodes_it_would_land_on():
    doc = _glm(None)
    doc["spec"]["decode"]["moeBackend"] = "flashinfer_trtllm"
    doc["spec"]["prefill"]["moeBackend"] = "flashinfer_trtllm"
    facts = ClusterFacts.from_nodes([_node("h200-0", "NVIDIA-H200"), _node("b200-0", "NVIDIA-B200")])
    _, errors = validate(doc, facts)
    [hit] = [e for e in errors if e.path == "spec.decode.moeBackend"]
    assert hit.message.startswith("decode role: on hopper nodes (h200-0): moeBackend 'flashinfer_trtllm' runs only on blackwell")


def test_prefill_offload_is_sized_against_the_nodes_too():
    doc = yaml.safe_load((EXAMPLES / "deepseek-v32-prefill-cpu-offload.yaml").read_text())
    facts = ClusterFacts.from_nodes([_node("h200-0", "NVIDIA-H200", memory="450Gi"), _node("h200-1", "NVIDIA-H200", memory="1000Gi")])
    _, errors = validate(doc, facts)
    assert [e.path for e in errors] == [], errors  # h200-1 holds 400 + 64 GiB; decode's 832 GiB fits h200-1 too
    small = ClusterFacts.from_nodes([_node("h200-0", "NVIDIA-H200", memory="450Gi")])
    _, errors = validate(doc, small)
    [hit] = [e for e in errors if e.path == "spec.prefill.cpuOffload.sizeGiB"]
    assert "each prefill pod needs 464 GiB of host memory" in hit.message and "lower cpuOffload.sizeGiB" in hit.message


@pytest.mark.parametrize(("taint", "counts"), [
    ({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}, True),  # a kubelet starting
    ({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}, True),
    ({"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}, True),
    ({"key": "dedicated", "value": "training", "effect": "NoSchedule"}, False),  # an admin's own taint
    ({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}, False),  # a cordon
])
def test_a_node_condition_taint_does_not_hide_the_node_from_the_fit_checks(taint: dict[str, str], counts: bool) -> None:
    """The node lifecycle controller taints a node while it is NotReady or under pressure: the host-pool fit
    check still counts it (its pods wait for it as the scheduler makes them), where an admin's taint or a
    cordon takes it out."""
    node = _node("b200-0", "NVIDIA-B200")
    node["spec"]["taints"] = [taint]
    if taint["key"] == "node.kubernetes.io/unschedulable":
        node["spec"]["unschedulable"] = True
    decode = DecodeSpec.model_validate(_glm("NVIDIA-B200")["spec"]["decode"])
    fits = ClusterFacts.from_nodes([node]).allocatable_gib_for(decode, 8)
    assert fits is not None and (("b200-0" in fits) == counts), fits
