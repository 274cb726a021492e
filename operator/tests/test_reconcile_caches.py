"""The reconciler's caches (no cluster): a validation and render is reused only while the resource and the
node facts are the same, drift is still restored, and the watch-fed bodies never bring back a deletion."""

from __future__ import annotations

import copy
import importlib
import itertools
from typing import Any

import pytest
import yaml
from opsupport import EXAMPLES

from hisparse_operator.api import labels as L
from hisparse_operator.controller.cache import ChildCache, NodeFactsCache, RenderCache, fingerprint

R = importlib.import_module("hisparse_operator.controller.reconcile")  # the package exports the function
NS, NAME = "ns", "dsv32"


class FakeKube:
    """Objects by (kind, namespace, name), a resourceVersion counter, and every request counted."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.rv = itertools.count(1)
        self.calls: list[str] = []
        self.logs: dict[tuple[str, str], str] = {}
        """(namespace, pod) -> its container's log; a pod without one answers as a kubelet-less node does."""

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        meta.setdefault("uid", self.objects.get(key, {}).get("metadata", {}).get("uid") or f"uid-{meta['name']}")
        meta["resourceVersion"] = str(next(self.rv))
        self.objects[key] = obj
        return copy.deepcopy(obj)

    def has_kind(self, api_version: str, kind: str) -> bool:
        return True

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get {kind}")
        obj = self.objects.get((kind, namespace or "", name))
        return copy.deepcopy(obj) if obj else None

    def list(self, api_version: str, kind: str, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        want = dict(term.split("=", 1) for term in selector.split(",") if term)
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items() if k == kind and ns == (namespace or "")
                and all((o["metadata"].get("labels") or {}).get(key) == value for key, value in want.items())]

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(f"apply {obj['kind']}")
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        if obj["kind"] == "ControllerRevision" and key in self.objects and self.objects[key]["data"] != obj["data"]:
            raise ValueError("ControllerRevision.data: field is immutable")  # as the apiserver refuses it
        live = copy.deepcopy(self.objects.get(key) or {})
        live.update(copy.deepcopy(obj))
        return self._store(live)

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        self.calls.append(f"delete {kind}")
        self.objects.pop((kind, namespace or "", name), None)

    def patch_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("status")
        live = self.objects[(L.KIND, body["metadata"]["namespace"], body["metadata"]["name"])]
        return self._store({**live, "status": status})

    def pod_log(self, namespace: str, pod: str, container: str, *, limit_bytes: int, tail_lines: int) -> str:
        self.calls.append("log")
        if (namespace, pod) not in self.logs:
            raise RuntimeError(f"no kubelet serves the log of pod {pod}")
        return "\n".join(self.logs[(namespace, pod)].splitlines()[-tail_lines:])[:limit_bytes]

    def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.calls.append("event")


def _manifest(host_pool_gib: int = 96) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / "deepseek-v32-single-node.yaml").read_text())
    doc["metadata"].update(namespace=NS, generation=1)
    doc["spec"]["decode"]["hisparse"]["hostPoolGiB"] = host_pool_gib
    return doc


def _node(name: str, memory: str = "2000Gi", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": {},
            "status": {"allocatable": {"memory": memory, "nvidia.com/gpu": "8"}, **status}}


class Operator:
    """The caches as the kopf handlers keep them, fed from the fake apiserver instead of watches."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube, self.children, self.deployments = kube, ChildCache(), ChildCache()
        self.renders, self.nodes = RenderCache(), NodeFactsCache()

    def watch(self) -> None:
        """Deliver the current state of every object, as the watches would."""
        for (kind, _, _), obj in self.kube.objects.items():
            (self.deployments if kind == L.KIND else self.children).put(copy.deepcopy(obj))

    def reconcile(self) -> R.Outcome:
        return R.reconcile(self.kube, NS, NAME, self.nodes.snapshot(), self.children,
                           deployments=self.deployments, renders=self.renders)

    def status(self) -> dict[str, Any]:
        return self.kube.objects[(L.KIND, NS, NAME)]["status"]


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the reconciler's calls of validate (each one is followed by a render when valid)."""
    calls: list[int] = []
    real = R.validate

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(R, "validate", counting)
    return calls


@pytest.fixture
def op() -> Operator:
    kube = FakeKube()
    kube._store(_manifest())
    o = Operator(kube)
    o.nodes.put(_node("gpu-1"))
    o.watch()
    return o


def _set_ready(kube: FakeKube, kind: str, name: str, ready: int) -> None:
    obj = kube.objects[(kind, NS, name)]
    obj["metadata"]["generation"] = 1
    kube._store({**obj, "status": {"observedGeneration": 1, "replicas": ready, "readyReplicas": ready,
                                   "updatedReplicas": ready, "availableReplicas": ready}})


def test_a_child_status_update_reuses_the_render_and_still_updates_status(op: Operator, validations: list[int]) -> None:
    first = op.reconcile()
    assert first.applied and len(validations) == 1
    op.watch()
    for name in (f"{NAME}-prefill", f"{NAME}-decode", f"{NAME}-epp"):
        _set_ready(op.kube, "Deployment", name, 1)
    op.watch()
    op.kube.calls.clear()
    second = op.reconcile()
    assert len(validations) == 1  # nothing the render reads changed
    assert not second.applied and second.status_written
    assert not any(c.startswith("get") for c in op.kube.calls)  # the body and the children came from the caches
    ready = {c["type"]: c["status"] for c in op.status()["conditions"]}
    assert ready["PrefillReady"] == ready["DecodeReady"] == "True"


def test_a_new_generation_is_validated_and_rendered_again(op: Operator, validations: list[int]) -> None:
    op.reconcile()
    op.watch()
    hsd = op.kube.objects[(L.KIND, NS, NAME)]
    hsd["spec"]["decode"]["replicas"] = 2
    hsd["metadata"]["generation"] = 2
    op.kube._store(hsd)
    op.watch()
    out = op.reconcile()
    assert len(validations) == 2
    assert "Deployment/dsv32-decode" in out.applied
    assert op.kube.objects[("Deployment", NS, f"{NAME}-decode")]["spec"]["replicas"] == 2


def test_a_spec_change_without_a_new_generation_is_rendered_again(op: Operator, validations: list[int]) -> None:
    op.reconcile()
    hsd = op.kube.objects[(L.KIND, NS, NAME)]
    hsd["spec"]["decode"]["replicas"] = 3  # the fingerprint covers the spec itself, not only the generation
    op.kube._store(hsd)
    op.watch()
    op.reconcile()
    assert len(validations) == 2
    assert op.kube.objects[("Deployment", NS, f"{NAME}-decode")]["spec"]["replicas"] == 3


def test_changed_node_facts_are_validated_again(op: Operator, validations: list[int]) -> None:
    op.reconcile()
    assert {c["type"]: c["status"] for c in op.status()["conditions"]}["ConfigValid"] == "True"
    snapshot = op.nodes.snapshot()
    # A heartbeat (status conditions only) changes no fact: same snapshot, no new validation.
    assert not op.nodes.put(_node("gpu-1", conditions=[{"type": "Ready", "status": "True"}]))
    assert op.nodes.snapshot() is snapshot
    op.watch()
    op.reconcile()
    assert len(validations) == 1
    # The only node shrinks below the host pool the decode pod needs: the cached verdict must not stand.
    assert op.nodes.put(_node("gpu-1", memory="64Gi"))
    assert op.nodes.snapshot() is not snapshot
    op.watch()
    out = op.reconcile()
    assert len(validations) == 2 and out.result == "invalid"
    conds = {c["type"]: c for c in op.status()["conditions"]}
    assert conds["ConfigValid"]["status"] == "False" and "host memory" in conds["ConfigValid"]["message"]


def test_a_deleted_child_is_restored_from_the_cached_render(op: Operator, validations: list[int]) -> None:
    op.reconcile()
    op.watch()
    key = ("Deployment", NS, f"{NAME}-decode")
    uid = op.kube.objects[key]["metadata"]["uid"]
    op.kube.objects.pop(key)
    op.children.drop(*key, uid)  # the watch's DELETED event
    out = op.reconcile()
    assert len(validations) == 1
    assert "Deployment/dsv32-decode" in out.applied and key in op.kube.objects


def test_a_drifted_child_is_restored_from_the_cached_render(op: Operator, validations: list[int]) -> None:
    op.reconcile()
    key = ("Deployment", NS, f"{NAME}-decode")
    drifted = op.kube.objects[key]
    drifted["spec"]["replicas"] = 5
    op.kube._store(drifted)
    op.watch()
    out = op.reconcile()
    assert len(validations) == 1
    assert "Deployment/dsv32-decode" in out.applied and op.kube.objects[key]["spec"]["replicas"] == 1


def test_the_cached_render_is_not_changed_by_a_reconcile(op: Operator) -> None:
    op.reconcile()
    (entry,) = op.renders._entries.values()
    before = entry.rendered
    op.watch()
    op.reconcile()
    assert op.renders._entries[(NS, NAME)] is entry and entry.rendered == before


def test_the_fingerprint_ignores_only_what_every_write_changes() -> None:
    a = _manifest()
    b = copy.deepcopy(a)
    b["metadata"].update(resourceVersion="99", managedFields=[{"manager": "x"}])
    b["status"] = {"conditions": []}
    assert fingerprint(a) == fingerprint(b)
    for change in (lambda m: m["metadata"].update(uid="other"), lambda m: m["metadata"].update(generation=2),
                   lambda m: m["metadata"].setdefault("labels", {}).update(x="y"),
                   lambda m: m["spec"]["decode"].update(replicas=2)):
        c = copy.deepcopy(a)
        change(c)
        assert fingerprint(c) != fingerprint(a)


def test_a_body_read_before_a_deletion_does_not_bring_it_back() -> None:
    cache = ChildCache()
    body = {"kind": "Deployment", "metadata": {"name": "d-decode", "namespace": "ns", "uid": "u1",
                                               "resourceVersion": "5", "labels": {L.DEPLOYMENT: "d"}}}
    cache.drop("Deployment", "ns", "d-decode", "u1")  # the watch delivered the deletion first
    cache.put(copy.deepcopy(body))  # then a reconcile put what its GET had returned before it
    assert cache.get("Deployment", "ns", "d-decode") is None and cache.owned_by("ns", "d") == []
    recreated = copy.deepcopy(body)
    recreated["metadata"].update(uid="u2", resourceVersion="9")
    cache.put(recreated)  # a new object of the same name is cached as usual
    assert cache.get("Deployment", "ns", "d-decode")["metadata"]["uid"] == "u2"


def test_the_status_write_is_what_the_next_reconcile_compares_against(op: Operator) -> None:
    """A reconcile before the watch delivers the operator's own status write must not write (and announce)
    the same status again."""
    op.reconcile()
    op.kube.calls.clear()
    out = op.reconcile()  # no watch delivery in between
    assert not out.status_written and "event" not in op.kube.calls


def test_children_are_read_before_writing_unless_the_resource_never_had_status(op: Operator) -> None:
    op.reconcile()  # first reconcile: no status yet, nothing to read back
    assert not any(c.startswith("get") for c in op.kube.calls)
    # Every rendered object, and the ControllerRevision keeping this revision's spec for a later canary.
    assert sum(c.startswith("apply") for c in op.kube.calls) == len(op.renders._entries[(NS, NAME)].desired) + 1
    assert op.kube.calls.count("apply ControllerRevision") == 1
    # A restarted operator (empty caches) that finds a status confirms each child before any write.
    restarted = Operator(op.kube)
    restarted.nodes.put(_node("gpu-1"))
    op.kube.calls.clear()
    restarted.reconcile()
    assert not any(c.startswith("apply") for c in op.kube.calls)
    assert any(c == "get Deployment" for c in op.kube.calls)


def test_a_snapshot_s_rendering_is_made_once_when_it_is_written_not_at_every_reconcile(
        op: Operator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot keeps its revision's rendered pods (a full render): made for the ControllerRevision the
    first reconcile writes; once the watch has delivered it, later reconciles make none."""
    from hisparse_operator.render import pinned

    calls: list[str] = []
    real = pinned.rendering

    def counting(d: Any) -> Any:
        calls.append(d.name)
        return real(d)

    monkeypatch.setattr(pinned, "rendering", counting)
    op.reconcile()
    assert calls == [NAME] and op.kube.calls.count("apply ControllerRevision") == 1
    written = next(o for (k, _, _), o in op.kube.objects.items() if k == "ControllerRevision")
    assert {o["kind"] for o in written["data"]["rendering"]} == {"Deployment", "ConfigMap"}
    op.watch()
    assert op.children.has("ControllerRevision", NS, written["metadata"]["name"])
    for _ in range(2):
        op.reconcile()
    assert calls == [NAME]
