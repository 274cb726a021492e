"""Production topology fields (``api/topology.py``): where each is rendered for a Deployment role and a
LeaderWorkerSet role, the Volcano variant, and every refusal with its field path (nothing rendered)."""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

import pytest
import yaml

from hisparse_operator.api import ClusterFacts, labels as L, validate
from hisparse_operator.render import InvalidSpec, render, revision
from opsupport import EXAMPLES, VALID_EXAMPLES

TOPOLOGY = EXAMPLES / "production-topology.yaml"


def _doc() -> dict[str, Any]:
    return yaml.safe_load(TOPOLOGY.read_text())


def volcano_variant() -> dict[str, Any]:
    """The example with Volcano instead of Kueue: a queue on both roles, Volcano's default scheduler name."""
    doc = _doc()
    for role, queue in (("prefill", "prefill-queue"), ("decode", "decode-queue")):
        doc["spec"][role]["gangScheduling"] = {"volcano": {"queue": queue}}
    return doc


def _workloads(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["labels"][L.ROLE]: o for o in objs
            if o["kind"] in ("Deployment", "LeaderWorkerSet") and L.ROLE in o["metadata"]["labels"]}


def _template(w: dict[str, Any]) -> dict[str, Any]:
    return w["spec"]["template"] if w["kind"] == "Deployment" else w["spec"]["leaderWorkerTemplate"]["workerTemplate"]


def test_the_example_has_a_deployment_role_and_an_lws_role():
    w = _workloads(render(_doc()))
    assert w["prefill"]["kind"] == "Deployment" and w["decode"]["kind"] == "LeaderWorkerSet"
    # One template for leader and workers: the topology fields reach every pod of a group.
    assert "leaderTemplate" not in w["decode"]["spec"]["leaderWorkerTemplate"]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_kueue_rdma_multus_dra_and_pod_metadata_land_where_their_projects_read_them(role):
    spec = _doc()["spec"][role]
    w = _workloads(render(_doc()))[role]
    template = _template(w)
    pod, vllm = template["spec"], template["spec"]["containers"][0]
    # Kueue reads the queue from the workload's own labels (LWS: one workload per group; Deployment: per pod).
    assert w["metadata"]["labels"][L.KUEUE_QUEUE_NAME] == spec["gangScheduling"]["kueue"]["queueName"]
    assert L.KUEUE_QUEUE_NAME not in template["metadata"]["labels"]
    assert "schedulerName" not in pod  # Kueue gates pods; the default scheduler places them
    assert pod["runtimeClassName"] == "nvidia"
    rdma = spec["rdma"]["resourceName"]
    assert vllm["resources"]["requests"][rdma] == vllm["resources"]["limits"][rdma] == "1"
    networks = json.loads(template["metadata"]["annotations"][L.MULTUS_NETWORKS])
    assert networks == spec["networks"]
    assert pod["resourceClaims"] == [{k: v for k, v in c.items() if k != "request"} for c in spec["resourceClaims"]]
    assert vllm["resources"]["claims"] == [{"name": c["name"], **({"request": c["request"]} if "request" in c else {})}
                                           for c in spec["resourceClaims"]]
    assert template["metadata"]["labels"]["team.example.com/cost-center"] == "inference"
    assert template["metadata"]["annotations"]["team.example.com/owner"] == "serving-oncall"


def test_volcano_schedules_lws_groups_through_the_podgroup_lws_creates():
    w = _workloads(render(volcano_variant()))
    decode, prefill = w["decode"], w["prefill"]
    # LWS copies the queue annotation of the LeaderWorkerSet into each group's PodGroup (minMember = size
    # under startupPolicy LeaderCreated); pods only need Volcano's scheduler.
    assert decode["metadata"]["annotations"][L.VOLCANO_QUEUE_NAME] == "decode-queue"
    assert decode["spec"]["startupPolicy"] == "LeaderCreated"
    assert _template(decode)["spec"]["schedulerName"] == "volcano"
    assert L.VOLCANO_QUEUE_NAME not in _template(decode)["metadata"]["annotations"]
    # A Deployment's pods carry the queue themselves (Volcano makes a PodGroup per pod).
    assert _template(prefill)["metadata"]["annotations"][L.VOLCANO_QUEUE_NAME] == "prefill-queue"
    assert _template(prefill)["spec"]["schedulerName"] == "volcano"
    assert L.VOLCANO_QUEUE_NAME not in (prefill["metadata"].get("annotations") or {})
    for o in w.values():
        assert L.KUEUE_QUEUE_NAME not in o["metadata"]["labels"]


def test_an_explicit_scheduler_name_wins_over_volcanos_default():
    doc = volcano_variant()
    doc["spec"]["decode"]["schedulerName"] = "volcano-gpu"
    assert _template(_workloads(render(doc))["decode"])["spec"]["schedulerName"] == "volcano-gpu"


def test_topology_fields_reshape_pods_so_they_are_a_new_revision():
    doc = _doc()
    before = revision(validate(doc)[0])
    doc["spec"]["decode"]["podLabels"]["team.example.com/cost-center"] = "research"
    assert revision(validate(doc)[0]) != before


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_owned_pod_labels_cover_every_label_the_operator_renders(path):
    """The refusal list in api/labels.py is the labels the operator sets: nothing rendered escapes it."""
    doc = yaml.safe_load(path.read_text())
    user = {k for r in ("prefill", "decode") for k in ((doc["spec"].get(r) or {}).get("podLabels") or {})}
    for w in _workloads(render(doc)).values():
        rendered = set(_template(w)["metadata"]["labels"]) - user
        assert rendered <= set(L.OWNED_POD_LABELS), rendered - set(L.OWNED_POD_LABELS)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(spec: dict[str, Any]) -> None:
        *head, last = path.split(".")
        node = spec
        for part in head:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return mutate


REFUSED = [
    ("owned-label", _set("decode.podLabels", {L.ROLE: "x"}), f"spec.decode.podLabels.{L.ROLE}", "remove it from podLabels"),
    ("llmd-label", _set("prefill.podLabels", {"llm-d.ai/role": "decode"}), "spec.prefill.podLabels.llm-d.ai/role",
     "remove it from podLabels"),
    ("lws-label", _set("decode.podLabels", {"leaderworkerset.sigs.k8s.io/group-index": "0"}),
     "spec.decode.podLabels.leaderworkerset.sigs.k8s.io/group-index", "LeaderWorkerSet"),
    ("kueue-label-on-pods", _set("decode.podLabels", {L.KUEUE_QUEUE_NAME: "q"}),
     f"spec.decode.podLabels.{L.KUEUE_QUEUE_NAME}", "use gangScheduling.kueue.queueName"),
    ("multus-annotation", _set("decode.podAnnotations", {L.MULTUS_NETWORKS: "rdma"}),
     f"spec.decode.podAnnotations.{L.MULTUS_NETWORKS}", "use networks"),
    ("volcano-queue-annotation", _set("prefill.podAnnotations", {L.VOLCANO_QUEUE_NAME: "q"}),
     f"spec.prefill.podAnnotations.{L.VOLCANO_QUEUE_NAME}", "use gangScheduling.volcano.queue"),
    ("label-value", _set("decode.podLabels", {"team.example.com/x": "has space"}),
     "spec.decode.podLabels.team.example.com/x", "not a valid label value"),
    ("runtime-class", _set("prefill.runtimeClassName", "NVIDIA_Runtime"), "spec.prefill.runtimeClassName",
     "use 'nvidia-runtime'"),
    ("scheduler-name", _set("decode.schedulerName", "Volcano Scheduler"), "spec.decode.schedulerName",
     "not a DNS-1123 subdomain"),
    ("volcano-on-default-scheduler", lambda s: s["decode"].update(gangScheduling={"volcano": {}},
                                                                   schedulerName="default-scheduler"),
     "spec.decode.schedulerName", "scheduled pod by pod"),
    ("two-gang-schedulers", _set("decode.gangScheduling.volcano", {}), "spec.decode.gangScheduling",
     "exactly one of kueue or volcano"),
    ("queue-name", _set("decode.gangScheduling.kueue.queueName", "Inference_Queue"),
     "spec.decode.gangScheduling.kueue.queueName", "not a DNS-1123 label"),
    ("rdma-count-zero", _set("decode.rdma.count", 0), "spec.decode.rdma.count", "at least 1"),
    ("rdma-native-resource", _set("decode.rdma.resourceName", "rdma"), "spec.decode.rdma.resourceName",
     "not an extended resource name"),
    ("rdma-kubernetes-io", _set("decode.rdma.resourceName", "kubernetes.io/rdma"), "spec.decode.rdma.resourceName",
     "not an extended resource name"),
    ("rdma-is-the-gpu", _set("decode.rdma.resourceName", "nvidia.com/gpu"), "spec.decode.rdma.resourceName",
     "parallelism.gpusPerNode already requests"),
    ("rdma-also-in-resources", _set("decode.resources.limits", {"memory": "1500Gi", "rdma/hca_shared_devices_a": 2}),
     "spec.decode.rdma", "remove it from resources"),
    ("network-name", _set("decode.networks.0.name", "Rail_0"), "spec.decode.networks[0].name",
     "not a DNS-1123 subdomain"),
    ("network-interface-too-long", _set("decode.networks.0.interface", "infiniband-rail-0"),
     "spec.decode.networks[0].interface", "more than the 15 allowed"),
    ("claim-both-sources", _set("decode.resourceClaims.0.resourceClaimName", "shared"), "spec.decode.resourceClaims[0]",
     "exactly one of resourceClaimName"),
    ("claim-no-source", _set("decode.resourceClaims.0", {"name": "nic"}), "spec.decode.resourceClaims[0]",
     "exactly one of resourceClaimName"),
    ("claim-names-repeat", lambda s: s["prefill"]["resourceClaims"].append({"name": "nic-telemetry",
                                                                             "resourceClaimName": "shared"}),
     "spec.prefill.resourceClaims", "rename one"),
    ("unknown-field", _set("decode.rdma.devices", 2), "spec.decode.rdma.devices", "unknown field"),
]


@pytest.mark.parametrize(("mutate", "path", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_bad_topology_is_refused_at_its_field_and_nothing_is_rendered(mutate, path, message):
    doc = _doc()
    mutate(doc["spec"])
    _, errors = validate(doc)
    hits = [e for e in errors if e.path == path]
    assert hits, [str(e) for e in errors]
    assert any(message in e.message for e in hits), [str(e) for e in hits]
    with pytest.raises(InvalidSpec):
        render(doc)


def _node(name: str, devices: dict[str, str], gpus: int = 8) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"memory": "2000Gi", "nvidia.com/gpu": str(gpus), **devices}}}


def test_an_rdma_resource_no_node_offers_is_refused_with_node_facts():
    facts = ClusterFacts.from_nodes([_node(f"gpu-{i}", {"rdma/rdma_shared_device_a": "1k"}) for i in range(8)])
    _, errors = validate(_doc(), facts)
    by_path = {e.path: e for e in errors}
    assert set(by_path) == {"spec.prefill.rdma.resourceName", "spec.decode.rdma.resourceName"}, [str(e) for e in errors]
    message = by_path["spec.decode.rdma.resourceName"].message
    assert "'rdma/hca_shared_devices_a'" in message and "rdma/rdma_shared_device_a" in message
    assert "Pending" in message and "nothing is applied" in message
    with pytest.raises(InvalidSpec):
        render(_doc(), facts)


def test_an_rdma_resource_offered_on_the_roles_nodes_passes():
    facts = ClusterFacts.from_nodes([_node(f"gpu-{i}", {"rdma/hca_shared_devices_a": "1k"}) for i in range(8)])
    assert validate(_doc(), facts)[1] == []
    # Offered only on nodes the role cannot use (no GPUs to spare there) is the same as not offered.
    facts = ClusterFacts.from_nodes([_node("gpu-0", {}), _node("cpu-0", {"rdma/hca_shared_devices_a": "8"}, gpus=0)])
    refused = {e.path for e in validate(_doc(), facts)[1] if e.rule == "topology:rdma-not-offered"}
    assert refused == {"spec.prefill.rdma.resourceName", "spec.decode.rdma.resourceName"}


def test_without_a_gpu_fleet_the_rdma_check_waits():
    """No node has GPUs yet (a fleet scaled from zero): nothing is known, nothing is refused."""
    facts = ClusterFacts.from_nodes([_node("cpu-0", {}, gpus=0)])
    assert validate(_doc(), facts)[1] == []


def test_the_engine_settings_carry_the_rdma_count_only_when_set():
    from hisparse_operator.api import role_settings

    d, _ = validate(_doc())
    assert role_settings(d, "decode").to_json_dict()["rdmaDevices"] == 1
    plain, _ = validate(yaml.safe_load((EXAMPLES / "hisparse-deployment.yaml").read_text()))
    assert "rdmaDevices" not in role_settings(plain, "decode").to_json_dict()


def test_default_render_has_no_topology_fields():
    doc = copy.deepcopy(yaml.safe_load((EXAMPLES / "hisparse-deployment.yaml").read_text()))
    for w in _workloads(render(doc)).values():
        pod = _template(w)["spec"]
        assert not {"runtimeClassName", "schedulerName", "resourceClaims"} & set(pod)
        assert "annotations" not in _template(w)["metadata"]
        assert L.KUEUE_QUEUE_NAME not in w["metadata"]["labels"]
