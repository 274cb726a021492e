"""The model cache: what is rendered for each cache mode and source, the ``ModelReady`` planner, and the
reconciler holding serving workloads back until their revision's download Job has completed."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from opsupport import EXAMPLES
from test_reconcile_caches import NAME, NS, FakeKube, Operator, _node, _set_ready

from hisparse_operator.api import labels as L, validate
from hisparse_operator.controller import conditions as C
from hisparse_operator.controller.model import gate
from hisparse_operator.render import render
from hisparse_operator.controller.diff import needs_apply
from hisparse_operator.render.model import FETCH_CONTAINER, as_created, fetch_job_name, retained
from hisparse_runtime.engine import NODE_CACHE_PATH

SECRET = "hf-token"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def _doc(**model: Any) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / "deepseek-v32-single-node.yaml").read_text())
    doc["metadata"].update(namespace=NS, name=NAME, generation=1)
    m = doc["spec"]["model"]
    m["cache"] = {"mode": "SharedVolume"}
    m["credentials"] = {"secretName": SECRET}
    m.update(model)
    return doc


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _pod(objs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    w = next(o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet") and o["metadata"]["name"].endswith(role))
    return w["spec"]["template"]["spec"]


# --- render --------------------------------------------------------------------------------------


def test_shared_volume_renders_one_claim_and_a_job_and_pods_mount_it_read_only() -> None:
    objs = render(_doc())
    (pvc,) = _by_kind(objs, "PersistentVolumeClaim")
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": f"{2 * 642 * 11 // 10 + 1}Gi"}}}
    (job,) = _by_kind(objs, "Job")
    assert objs.index(job) < min(objs.index(o) for o in _by_kind(objs, "Deployment")), "the Job is applied first"
    fetch = job["spec"]["template"]["spec"]["containers"][0]
    assert fetch["args"][-1] == "/model-cache/hf/deepseek-ai/DeepSeek-V3.2/3c1f0a9e2d4b6a8c0e1f3a5b7c9d1e2f4a6b8c0d"
    token = next(e for e in fetch["env"] if e["name"] == "HF_TOKEN")
    assert token == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "HF_TOKEN"}}}
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["onExitCodes"]["values"] == [2, 3] and rules[0]["action"] == "FailJob"
    for role in ("prefill", "decode"):
        w = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(role))
        assert w["metadata"]["annotations"][L.MODEL_FETCH] == job["metadata"]["name"]
        pod = w["spec"]["template"]["spec"]
        vllm = pod["containers"][0]
        assert {"name": "model-cache", "mountPath": "/model-cache", "readOnly": True} in vllm["volumeMounts"]
        assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": pvc["metadata"]["name"], "readOnly": True}} in pod["volumes"]
        assert "HF_TOKEN" not in str(pod), "serving pods never see the token: the Job downloads"
        assert "ephemeral-storage" not in vllm["resources"]["requests"]


def test_node_local_fetches_in_an_init_container_and_requests_the_disk() -> None:
    objs = render(_doc(cache={"mode": "NodeLocal"}))
    assert not _by_kind(objs, "PersistentVolumeClaim") and not _by_kind(objs, "Job")
    pod = _pod(objs, "decode")
    assert pod["initContainers"][0]["name"] == FETCH_CONTAINER
    assert {"name": "model-cache", "emptyDir": {"sizeLimit": "707Gi"}} in pod["volumes"]
    assert pod["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "747Gi"  # cache + /tmp + home


def test_an_explicit_ephemeral_storage_request_wins() -> None:
    doc = _doc(cache={"mode": "NodeLocal"})
    doc["spec"]["decode"]["resources"]["requests"]["ephemeral-storage"] = "1Ti"
    assert _pod(render(doc), "decode")["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "1Ti"


def test_s3_streams_with_its_keys_and_service_account_and_pvc_mounts_as_is() -> None:
    doc = _doc(source="s3://models/deepseek-v3.2", credentials={"secretName": "s3-keys", "serviceAccountName": "reader"})
    for key in ("revision", "sizeGiB", "cache"):
        doc["spec"]["model"].pop(key)
    objs = render(doc)
    assert not _by_kind(objs, "Job") and not _by_kind(objs, "PersistentVolumeClaim")
    pod = _pod(objs, "decode")
    env = {e["name"]: e.get("valueFrom") for e in pod["containers"][0]["env"]}
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "s3-keys", "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_SESSION_TOKEN"] == {"secretKeyRef": {"name": "s3-keys", "key": "AWS_SESSION_TOKEN", "optional": True}}
    assert pod["serviceAccountName"] == "reader" and pod["automountServiceAccountToken"] is False
    pvc = _doc(source="pvc://weights/dsv32")
    for key in ("revision", "sizeGiB", "credentials"):
        pvc["spec"]["model"].pop(key)
    pod = _pod(render(pvc), "decode")
    assert not pod.get("initContainers") or all(c["name"] != FETCH_CONTAINER for c in pod["initContainers"])
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod["volumes"]


def test_the_revision_makes_a_new_job_pod_revision_and_kv_hash_and_credentials_only_a_new_job() -> None:
    a, _ = validate(_doc())
    b, _ = validate(_doc(revision="0" * 40))
    c, _ = validate(_doc(credentials={"secretName": "other"}))
    assert a and b and c
    assert len({fetch_job_name(a), fetch_job_name(b), fetch_job_name(c)}) == 3
    labels = [next(o for o in render(x) if o["kind"] == "Deployment")["spec"]["template"]["metadata"]["labels"] for x in (a, b, c)]
    assert labels[0][L.KV_COMPAT] != labels[1][L.KV_COMPAT], "the revision is part of the KV-compatibility hash"
    assert labels[0][L.KV_COMPAT] == labels[2][L.KV_COMPAT], "credentials do not change the bytes"
    assert labels[0][L.REVISION] != labels[1][L.REVISION]


def test_a_hub_endpoint_reaches_only_the_download_and_changes_no_bytes() -> None:
    mirror = "https://hf-mirror.internal.example/hub"
    a, _ = validate(_doc())
    b, _ = validate(_doc(endpoint=mirror))
    assert a and b
    (job,) = _by_kind(render(b), "Job")
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HF_ENDPOINT"] == mirror
    assert "HF_ENDPOINT" not in {e["name"] for e in _by_kind(render(a), "Job")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert fetch_job_name(a) != fetch_job_name(b), "another hub is another download"
    labels = [next(o for o in render(x) if o["kind"] == "Deployment")["spec"]["template"]["metadata"]["labels"] for x in (a, b)]
    assert labels[0][L.KV_COMPAT] == labels[1][L.KV_COMPAT], "the revision pins the bytes, wherever they come from"
    node_local = render(_doc(endpoint=mirror, cache={"mode": "NodeLocal"}))
    init = _pod(node_local, "decode")["initContainers"][0]
    assert {"name": "HF_ENDPOINT", "value": mirror} in init["env"]


def test_a_hub_endpoint_is_refused_for_a_source_it_cannot_serve() -> None:
    doc = _doc(endpoint="http://hub:8080", source="pvc://weights")
    del doc["spec"]["model"]["cache"], doc["spec"]["model"]["credentials"]
    d, errors = validate(doc)
    assert d is None and any("spec.model.endpoint" in str(e) and "hf://" in str(e) for e in errors), errors
    bad, errors = validate(_doc(endpoint="hub:8080"))
    assert bad is None and any("spec.model.endpoint" in str(e) for e in errors), errors


def test_the_download_job_runs_where_support_pods_are_placed() -> None:
    placement = {"nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}]}
    (job,) = _by_kind(render(_doc() | {"spec": {**_doc()["spec"], "supportPods": placement}}), "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == placement["nodeSelector"] and pod["tolerations"] == placement["tolerations"]
    (plain,) = _by_kind(render(_doc()), "Job")
    assert "nodeSelector" not in plain["spec"]["template"]["spec"]


# --- the ModelReady planner ----------------------------------------------------------------------


def _job(*conditions: tuple[str, str]) -> dict[str, Any]:
    return {"kind": "Job", "metadata": {"name": "j"}, "status": {"conditions": [
        {"type": t, "status": "True", "reason": r} for t, r in conditions]}}


def _fetch_pod(created: str, *, phase: str = "Running", waiting: dict[str, str] | None = None,
               terminated: dict[str, Any] | None = None, unscheduled: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if waiting:
        state["waiting"] = waiting
    if terminated:
        state["terminated"] = terminated
    status: dict[str, Any] = {"phase": phase, "containerStatuses": [{"name": FETCH_CONTAINER, "state": state}]}
    if unscheduled:
        status = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "message": unscheduled}]}
    return {"metadata": {"name": f"p-{created}", "creationTimestamp": created}, "status": status}


D, _ = validate(_doc())
REFUSED = "CredentialsRefused: the hub refused the credentials for deepseek-ai/DeepSeek-V3.2 (HTTP 401, HF_TOKEN is set)"


@pytest.mark.parametrize(("job", "pods", "ready", "reason", "needle"), [
    (None, [], False, C.MODEL_DOWNLOADING, "creating the download Job"),
    (_job(), [_fetch_pod("1")], False, C.MODEL_DOWNLOADING, "is filling the model cache"),
    (_job(), [_fetch_pod("1", unscheduled="0/3 nodes: pod has unbound immediate PersistentVolumeClaims")], False,
     C.MODEL_DOWNLOADING, "unbound immediate PersistentVolumeClaims"),
    (_job(), [_fetch_pod("1", phase="Pending", waiting={"reason": "CreateContainerConfigError",
                                                        "message": 'secret "hf-token" not found'})],
     False, C.CREDENTIALS_MISSING, f'secret "hf-token" not found. Create the Secret {SECRET} in namespace {NS}'),
    (_job(), [_fetch_pod("1", phase="Failed", terminated={"exitCode": 4, "message": "DownloadFailed: reset\n"}),
              _fetch_pod("2")], False, C.MODEL_DOWNLOADING, "attempt 2 of 4; the last one failed: DownloadFailed: reset"),
    (_job(("Failed", "PodFailurePolicy")), [_fetch_pod("1", phase="Failed", terminated={"exitCode": 2, "message": REFUSED})],
     False, C.CREDENTIALS_REFUSED, REFUSED),
    (_job(("Failed", "BackoffLimitExceeded")), [_fetch_pod("1", phase="Failed", terminated={"exitCode": 5, "message": "CacheFull: x"})],
     False, "CacheFull", "failed (BackoffLimitExceeded): CacheFull: x"),
    (_job(("Failed", "PodFailurePolicy")), [_fetch_pod("1", phase="Failed", terminated={
        "exitCode": 3, "message": "ModelNotFound: revision 'v9' of deepseek-ai/DeepSeek-V3.2 does not exist"})],
     False, "ModelNotFound", "revision 'v9'"),
    (_job(("Failed", "BackoffLimitExceeded")), [_fetch_pod("1", phase="Failed", terminated={"exitCode": 137, "reason": "OOMKilled"})],
     False, C.DOWNLOAD_FAILED, "OOMKilled"),
    (_job(("Complete", "")), [], True, C.MODEL_CACHED, "is in the model cache"),
], ids=["no-job", "running", "unschedulable", "secret-missing", "retrying", "refused", "failed", "not-found", "killed",
        "complete"])
def test_model_ready_names_the_reason(job, pods, ready, reason, needle) -> None:
    assert D is not None
    g = gate(D, job, pods)
    assert (g.ready, g.reason) == (ready, reason), g
    assert needle in g.message, g.message


def _serving_pod(created: str, container: str, *, init: bool, state: dict[str, Any],
                 last: dict[str, Any] | None = None) -> dict[str, Any]:
    status = {"name": container, "state": state, **({"lastState": last} if last else {})}
    key = "initContainerStatuses" if init else "containerStatuses"
    return {"metadata": {"name": f"dsv32-decode-{created}", "creationTimestamp": created},
            "status": {"phase": "Pending", key: [status]}}


NODE_LOCAL, _ = validate(_doc(cache={"mode": "NodeLocal"}))
S3_DOC = _doc(source="s3://models/deepseek-v3.2", credentials={"secretName": "s3-keys"})
for _key in ("revision", "sizeGiB", "cache"):
    S3_DOC["spec"]["model"].pop(_key)
S3, _ = validate(S3_DOC)
MISSING = {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "s3-keys" not found'}}


def test_a_node_cache_the_pod_cannot_write_is_the_reason_with_the_fix() -> None:
    d, _ = validate(_doc(cache={"mode": "NodeCache"}))
    assert d is not None
    line = ("CacheNotWritable: cannot write /model-cache/ns/dsv32 as UID 10001 (Permission denied): with cache.mode "
            "NodeCache, make spec.model.cache.nodePath on this node a directory owned by (or writable for) UID 10001")
    pod = _serving_pod("1", FETCH_CONTAINER, init=True, state={"waiting": {"reason": "CrashLoopBackOff"}},
                       last={"terminated": {"exitCode": 6, "message": line}})
    g = gate(d, None, [], [pod])
    assert (g.ready, g.reason) == (False, "CacheNotWritable") and "spec.model.cache.nodePath" in g.message, g
    idle = gate(d, None, [], [])
    assert idle.ready and "unless its node holds it already" in idle.message and NODE_CACHE_PATH in idle.message


@pytest.mark.parametrize(("which", "pods", "ready", "reason", "needle"), [
    ("node-local", [], True, C.MODEL_FETCHED_BY_PODS, "none is downloading now"),
    ("node-local", [_serving_pod("1", FETCH_CONTAINER, init=True, state={"running": {}})], False, C.MODEL_DOWNLOADING,
     "1 of 1 serving pods are downloading"),
    ("node-local", [_serving_pod("1", FETCH_CONTAINER, init=True, state={"waiting": {"reason": "CrashLoopBackOff"}},
                                 last={"terminated": {"exitCode": 2, "message": REFUSED}})],
     False, C.CREDENTIALS_REFUSED, "serving pod dsv32-decode-1 failed to download"),
    ("node-local", [_serving_pod("1", FETCH_CONTAINER, init=True, state=MISSING)], False, C.CREDENTIALS_MISSING,
     'serving pod dsv32-decode-1 cannot start: secret "s3-keys" not found'),
    ("s3", [_serving_pod("1", "vllm", init=False, state=MISSING)], False, C.CREDENTIALS_MISSING,
     f"Create the Secret s3-keys in namespace {NS}"),
    ("s3", [_serving_pod("1", "vllm", init=False, state={"running": {}})], True, C.MODEL_READ_IN_PLACE, "streamed"),
], ids=["idle", "downloading", "refused", "secret-missing", "s3-secret-missing", "s3-running"])
def test_pods_that_fetch_or_stream_the_model_report_through_model_ready(which, pods, ready, reason, needle) -> None:
    d = NODE_LOCAL if which == "node-local" else S3
    assert d is not None
    g = gate(d, None, [], pods)
    assert (g.ready, g.reason) == (ready, reason), g
    assert needle in g.message, g.message


def test_a_pvc_source_gates_nothing() -> None:
    doc = _doc(source="pvc://weights/dsv32")
    for key in ("revision", "sizeGiB", "credentials"):
        doc["spec"]["model"].pop(key)
    d, errors = validate(doc)
    assert d is not None, errors
    g = gate(d, None, [], None)
    assert g.ready and g.reason == C.MODEL_READ_IN_PLACE


# --- the reconciler ------------------------------------------------------------------------------


def _op(doc: dict[str, Any]) -> Operator:
    kube = FakeKube()
    kube._store(doc)
    o = Operator(kube)
    o.nodes.put(_node("gpu-1"))
    o.watch()
    return o


def _workloads(kube: FakeKube) -> dict[str, dict[str, Any]]:
    return {n: o for (k, _, n), o in kube.objects.items() if k == "Deployment" and o["metadata"]["labels"].get(L.ROLE)}


def _condition(op: Operator, type_: str) -> dict[str, Any]:
    return next(c for c in op.status()["conditions"] if c["type"] == type_)


def test_serving_workloads_wait_for_the_cache_and_a_missing_secret_is_the_reason() -> None:
    op = _op(_doc())
    out = op.reconcile()
    assert sorted(out.withheld) == [f"Deployment/{NAME}-decode", f"Deployment/{NAME}-prefill"]
    assert out.requeue_after == 15.0, "pods are not watched: the download is looked at again soon"
    kinds = {k for (k, _, _) in op.kube.objects}
    assert {"PersistentVolumeClaim", "Job"} <= kinds
    assert _workloads(op.kube) == {}, "no serving pod before the cache is filled"
    assert _condition(op, "ModelReady")["reason"] == C.MODEL_DOWNLOADING
    ready = _condition(op, "Ready")
    assert ready["status"] == "False" and "ModelReady" in ready["message"]

    job = next(o for (k, _, _), o in op.kube.objects.items() if k == "Job")
    name = job["metadata"]["name"]
    op.kube._store({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{name}-abcde", "namespace": NS, "labels": {JOB_NAME_LABEL: name}, "creationTimestamp": "2026-12-02T00:00:00Z"},
        "status": {"phase": "Pending", "containerStatuses": [{"name": FETCH_CONTAINER, "state": {"waiting": {
            "reason": "CreateContainerConfigError", "message": f'secret "{SECRET}" not found'}}}]}})
    op.watch()
    op.reconcile()
    cond = _condition(op, "ModelReady")
    assert (cond["status"], cond["reason"]) == ("False", C.CREDENTIALS_MISSING), cond
    assert f'secret "{SECRET}" not found' in cond["message"] and cond["observedGeneration"] == 1
    assert _workloads(op.kube) == {}

    op.kube._store({**op.kube.objects[("Job", NS, name)], "status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    op.watch()
    op.reconcile()
    assert _condition(op, "ModelReady")["reason"] == C.MODEL_CACHED
    assert set(_workloads(op.kube)) == {f"{NAME}-prefill", f"{NAME}-decode"}


def _cached() -> tuple[Operator, str]:
    """An operator whose deployment's first download Job has completed and been reconciled; and that Job."""
    op = _op(_doc())
    op.reconcile()
    (job,) = [n for (k, _, n) in op.kube.objects if k == "Job"]
    op.kube._store({**op.kube.objects[("Job", NS, job)], "status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    op.watch()
    op.reconcile()
    return op, job


def test_a_new_revision_leaves_the_running_workloads_alone_until_its_cache_is_filled() -> None:
    op, old_job = _cached()
    before = copy.deepcopy(_workloads(op.kube))
    assert before

    body = op.kube.objects[(L.KIND, NS, NAME)]
    body["spec"]["model"]["revision"] = "f" * 40
    body["metadata"]["generation"] = 2
    op.kube._store(body)
    op.watch()
    op.reconcile()
    jobs = {n for (k, _, n) in op.kube.objects if k == "Job"}
    assert len(jobs - {old_job}) == 1, jobs
    after = _workloads(op.kube)
    assert {n: w["spec"] for n, w in after.items()} == {n: w["spec"] for n, w in before.items()}, \
        "the running pods keep serving the cached revision"
    assert _condition(op, "ModelReady")["reason"] == C.MODEL_DOWNLOADING


@pytest.mark.parametrize("strategy", ["Canary", "Recreate"])
def test_a_new_revision_whose_download_fails_leaves_the_stable_revision_ready(strategy: str) -> None:
    """Like a Deployment whose new ReplicaSet cannot start: Ready stays True on the pods that serve,
    ModelReady names the fetcher's reason, Progressing says the new revision waits, and the stable revision
    stays the stable one."""
    op, old_job = _cached()
    for name in [n for (k, _, n) in op.kube.objects if k == "Deployment"]:
        _set_ready(op.kube, "Deployment", name, 1)
    op.watch()
    op.reconcile()
    assert _condition(op, "Ready")["status"] == "True", _condition(op, "Ready")
    stable = op.status()["stableRevision"]

    body = op.kube.objects[(L.KIND, NS, NAME)]
    body["spec"]["model"]["revision"] = "f" * 40
    body["metadata"]["generation"] = 2
    body["spec"]["rollout"] = {"strategy": strategy}
    op.kube._store(body)
    op.watch()
    op.reconcile()
    (new_job,) = {n for (k, _, n) in op.kube.objects if k == "Job"} - {old_job}
    op.kube._store({**op.kube.objects[("Job", NS, new_job)],
                    "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}})
    op.kube._store({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{new_job}-x", "namespace": NS, "creationTimestamp": "2026-12-02T00:00:00Z",
        "labels": {JOB_NAME_LABEL: new_job}}, "status": {"phase": "Failed", "containerStatuses": [{
            "name": FETCH_CONTAINER, "state": {"terminated": {"exitCode": 3, "message": "ModelNotFound: no revision fff"}}}]}})
    op.watch()
    op.reconcile()
    model = _condition(op, "ModelReady")
    assert (model["status"], model["reason"]) == ("False", "ModelNotFound"), model
    assert _condition(op, "Ready")["status"] == "True", _condition(op, "Ready")
    assert _condition(op, "Progressing")["status"] == "True", _condition(op, "Progressing")
    if strategy == "Recreate":  # (a canary says it in its own words: waiting for the candidate)
        assert "waits for its model" in _condition(op, "Progressing")["message"], _condition(op, "Progressing")
    assert op.status()["stableRevision"] == stable


# --- render -> download -> preflight, with the real client and a loopback hub --------------------


def test_the_rendered_job_fills_a_cache_that_the_rendered_pods_preflight_accepts(tmp_path) -> None:
    """The Job's own argv and env (the Secret's key resolved as the kubelet would) download a locally made
    tiny DSA checkpoint from a loopback hub into the rendered cache path; the serving pod's settings, read
    back from the rendered ConfigMap, then pass preflight's cache and sparse-fact checks on it. A second
    revision in the spec is refused by the same preflight until its own Job has run."""
    import json
    import os
    import subprocess
    import sys

    from hisparse_runtime.cpu_engine.checkpoint import write_checkpoint
    from hisparse_runtime.engine import MODEL_CACHE_PATH, RoleSettings
    from hisparse_runtime.preflight import PreflightContext, checks
    from hisparse_runtime.testing.hub_server import HubRepo, HubServer

    repo, commit, token = "hisparse-test/tiny-dsa", "a" * 40, "hf_loopback_only"
    ckpt = write_checkpoint(tmp_path / "hub" / commit, seed=1)
    config = json.loads((ckpt / "config.json").read_text())
    model = {"source": f"hf://{repo}", "revision": commit, "sizeGiB": 1, "servedModelName": "tiny",
             "indexTopk": config["index_topk"], "indexTopkFreq": config["index_topk_freq"]}
    if config.get("indexer_types"):
        model["indexerTypes"] = config["indexer_types"]
    doc = _doc()
    doc["spec"]["model"] = {**model, "cache": {"mode": "SharedVolume"}, "credentials": {"secretName": SECRET}}
    objs = render(doc)
    (job,) = _by_kind(objs, "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    secrets = {SECRET: {"HF_TOKEN": token}}
    env = {e["name"]: e["value"] if "value" in e else secrets[e["valueFrom"]["secretKeyRef"]["name"]][e["valueFrom"]["secretKeyRef"]["key"]]
           for e in container["env"]}
    cache = tmp_path / "cache"
    argv = [a.replace(MODEL_CACHE_PATH, str(cache)) for a in container["args"]]
    env["HF_HOME"] = str(tmp_path / "hf-home")
    with HubServer({repo: HubRepo(commits={commit: ckpt})}, token=token) as hub:
        run = subprocess.run([sys.executable, "-m", "hisparse_runtime", *argv, "--termination-log", str(tmp_path / "log")],
                             env={**os.environ, **env, "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1"},
                             capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr

    data = next(o for o in objs if o["kind"] == "ConfigMap")["data"]
    settings = RoleSettings.model_validate_json(data["decode.json"])
    assert settings.model.vllm_model_arg == f"{MODEL_CACHE_PATH}/hf/{repo}/{commit}"
    where = cache / settings.model.vllm_model_arg.removeprefix(f"{MODEL_CACHE_PATH}/")
    ctx = PreflightContext(settings=settings, env={}, model_dir=where)
    for check in (checks.model_cache, checks.model_config):
        outcome = check(ctx)
        assert outcome is not None and outcome.ok, outcome
    newer = settings.model_copy(update={"model": settings.model.model_copy(update={"revision": "b" * 40})})
    refused = checks.model_cache(PreflightContext(settings=newer, env={}, model_dir=where))
    assert refused is not None and not refused.ok and "does not match the spec" in refused.message


def test_a_candidate_s_download_job_is_the_one_the_promoted_stable_renders() -> None:
    """A new image gets its own Job, created by the candidate; once promoted, the stable fleet renders the
    Job of the same name, and its template (immutable) must be the same, or every reconcile fails on it
    and the promotion never finishes (the real node showed it: stable scaled to 0, stuck in Promoting)."""
    from hisparse_operator.api import HiSparseDeployment
    from hisparse_operator.render import Canary, render_validated

    stable = _doc()
    new = copy.deepcopy(stable)
    new["spec"].setdefault("engine", {})["image"] = HiSparseDeployment.model_validate(stable).spec.engine.image + "-candidate"
    during = render_validated(HiSparseDeployment.model_validate(stable),
                              Canary(candidate=HiSparseDeployment.model_validate(new), weight=0, parity=True))
    after = render(new)
    jobs_during = {j["metadata"]["name"]: j for j in _by_kind(during, "Job")}
    jobs_after = {j["metadata"]["name"]: j for j in _by_kind(after, "Job")}
    (promoted,) = set(jobs_after) - {fetch_job_name(HiSparseDeployment.model_validate(stable))}
    assert promoted in jobs_during, "the candidate renders the download Job of its own model"
    # The candidate's Job prunes (keeping the stable's revision); the promoted stable renders it without
    # that, and the executor keeps what the live Job was created with: nothing to write, nothing refused.
    live = jobs_during[promoted]
    assert retained(live) is not None and retained(jobs_after[promoted]) is None
    assert as_created(jobs_after[promoted], live)["spec"]["template"] == live["spec"]["template"]
    # Only the Job's labels change on promotion (its fleet's): the spec sent is the live one.
    assert not needs_apply(as_created(jobs_after[promoted], live), {**live, "metadata": jobs_after[promoted]["metadata"]})
    rest = {k: v for k, v in jobs_after[promoted]["spec"].items() if k != "template"}
    assert rest == {k: v for k, v in live["spec"].items() if k != "template"}


def test_a_canary_s_own_download_job_keeps_the_stable_revision_and_removes_the_rest() -> None:
    """The shared claim is sized for two revisions: the candidate's Job (a new revision) removes every
    other revision once it has filled its own, but the stable fleet's. A candidate with the stable's model
    shares the stable's Job, which prunes nothing; so does a deployment without a canary."""
    from hisparse_operator.api import HiSparseDeployment
    from hisparse_operator.render import Canary, render_validated

    stable = HiSparseDeployment.model_validate(_doc())
    new = HiSparseDeployment.model_validate(_doc(revision="b" * 40))
    during = render_validated(stable, Canary(candidate=new, weight=0, parity=True))
    jobs = {j["metadata"]["name"]: j for j in _by_kind(during, "Job") if j["metadata"]["name"] != "dsv32-parity"}
    own, theirs = jobs[fetch_job_name(new)], jobs[fetch_job_name(stable)]
    args = own["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--prune-under") + 1] == "/model-cache"
    assert retained(own) == [new.spec.model.cache_dir, stable.spec.model.cache_dir]
    assert retained(theirs) is None and retained(_by_kind(render(_doc()), "Job")[0]) is None
    other = _doc()
    other["spec"]["prefill"]["resources"]["requests"]["cpu"] = "48"
    same = render_validated(stable, Canary(candidate=HiSparseDeployment.model_validate(other), weight=0, parity=True))
    assert [retained(j) for j in _by_kind(same, "Job") if j["metadata"]["name"] == fetch_job_name(stable)] == [None]
    message = gate(new, {**own, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}, []).message
    assert f"removed every other revision but {new.spec.model.cache_dir} and {stable.spec.model.cache_dir}" in message


def test_node_cache_mounts_the_node_s_directory_and_only_the_deployment_s_part_of_it() -> None:
    objs = render(_doc(cache={"mode": "NodeCache", "nodePath": "/mnt/nvme/models"}))
    assert not _by_kind(objs, "PersistentVolumeClaim") and not _by_kind(objs, "Job")
    for role in ("prefill", "decode"):
        pod = _pod(objs, role)
        assert {"name": "model-cache", "hostPath": {"path": "/mnt/nvme/models", "type": "DirectoryOrCreate"}} in pod["volumes"]
        fetch = pod["initContainers"][0]
        assert fetch["name"] == FETCH_CONTAINER
        assert fetch["args"][fetch["args"].index("--dest") + 1] == (
            f"/model-cache/{NS}/{NAME}/hf/deepseek-ai/DeepSeek-V3.2/3c1f0a9e2d4b6a8c0e1f3a5b7c9d1e2f4a6b8c0d")
        vllm = pod["containers"][0]
        mount = next(m for m in vllm["volumeMounts"] if m["name"] == "model-cache")
        assert mount == {"name": "model-cache", "mountPath": "/model-cache", "readOnly": True, "subPath": f"{NS}/{NAME}"}
        assert "ephemeral-storage" not in vllm["resources"]["requests"], "the node's directory is not ephemeral storage"
    default = render(_doc(cache={"mode": "NodeCache"}))
    assert {"name": "model-cache", "hostPath": {"path": NODE_CACHE_PATH, "type": "DirectoryOrCreate"}} in _pod(default, "decode")["volumes"]


def test_node_local_is_read_as_pod_ephemeral() -> None:
    """The earlier name stays accepted (stored resources keep it) and renders the same pods."""
    old, new = render(_doc(cache={"mode": "NodeLocal"})), render(_doc(cache={"mode": "PodEphemeral"}))
    for role in ("prefill", "decode"):
        assert _pod(old, role)["volumes"] == _pod(new, role)["volumes"]
        assert _pod(old, role)["initContainers"] == _pod(new, role)["initContainers"]
        assert _pod(old, role)["containers"][0]["resources"] == _pod(new, role)["containers"][0]["resources"]


@pytest.mark.parametrize(("cache", "path", "needle"), [
    ({"mode": "SharedVolume", "nodePath": "/var/lib/models"}, "spec.model.cache.nodePath", "directory of cache.mode NodeCache"),
    ({"mode": "NodeCache", "nodePath": "/models"}, "spec.model.cache.nodePath", ""),
    ({"mode": "NodeCache", "nodePath": "/var/../etc"}, "spec.model.cache.nodePath", ""),
    ({"mode": "NodeCache", "nodePath": "relative/path"}, "spec.model.cache.nodePath", ""),
    ({"mode": "NodeCache", "storageClassName": "cephfs"}, "spec.model.cache.mode", "NodeCache"),
], ids=["other-mode", "one-segment", "dot-dot", "relative", "storage-class"])
def test_a_node_path_that_cannot_be_used_is_refused_with_its_field(cache, path, needle) -> None:
    d, errors = validate(_doc(cache=cache))
    assert d is None and any(e.path == path and needle in e.message for e in errors), errors


def test_a_node_cache_filled_by_one_pod_serves_the_next_without_the_hub(tmp_path) -> None:
    """``NodeCache`` from the rendered pod: the init container's own argv (its view of the node's directory)
    downloads from a loopback hub; the vLLM container's view (the deployment's subdirectory, as its
    ``subPath`` mounts it) passes preflight; a pod recreated on that node fetches nothing from the hub, and
    another deployment naming the same node path gets a directory of its own."""
    import json
    import os
    import subprocess
    import sys

    from hisparse_runtime.cpu_engine.checkpoint import write_checkpoint
    from hisparse_runtime.engine import MODEL_CACHE_PATH, RoleSettings
    from hisparse_runtime.preflight import PreflightContext, checks
    from hisparse_runtime.testing.hub_server import HubRepo, HubServer

    repo, commit = "hisparse-test/tiny-dsa", "c" * 40
    ckpt = write_checkpoint(tmp_path / "hub" / commit, seed=2)
    config = json.loads((ckpt / "config.json").read_text())
    node = tmp_path / "node"  # the node's directory (cache.nodePath)

    def rendered(name: str) -> list[dict[str, Any]]:
        doc = _doc()
        doc["metadata"]["name"] = name
        doc["spec"]["model"] = {"source": f"hf://{repo}", "revision": commit, "sizeGiB": 1, "servedModelName": "tiny",
                                "indexTopk": config["index_topk"], "indexTopkFreq": config["index_topk_freq"],
                                "cache": {"mode": "NodeCache"},
                                **({"indexerTypes": config["indexer_types"]} if config.get("indexer_types") else {})}
        return render(doc)

    def init_container(objs: list[dict[str, Any]], hub: HubServer) -> subprocess.CompletedProcess[str]:
        fetch = _pod(objs, "decode")["initContainers"][0]
        env = {e["name"]: e["value"] for e in fetch["env"] if "value" in e}
        argv = [a.replace(MODEL_CACHE_PATH, str(node)) for a in fetch["args"]]
        return subprocess.run([sys.executable, "-m", "hisparse_runtime", *argv, "--termination-log", str(tmp_path / "log")],
                              env={**os.environ, **env, "HF_HOME": str(tmp_path / "hf-home"), "HF_ENDPOINT": hub.endpoint,
                                   "HF_HUB_DISABLE_XET": "1"}, capture_output=True, text=True, timeout=120)

    objs = rendered(NAME)
    with HubServer({repo: HubRepo(commits={commit: ckpt}, refs={"main": commit})}) as hub:
        first = init_container(objs, hub)
        assert first.returncode == 0 and "downloaded" in first.stdout, first.stderr
        assert hub.file_requests(), "the first pod on the node downloaded nothing"
        hub.requests.clear()
        again = init_container(objs, hub)  # the pod recreated on the same node
        assert again.returncode == 0 and "already cached" in again.stdout, again.stderr
        assert hub.requests == [], "a pod on a node that holds the revision reached the hub"
        other = init_container(rendered("another"), hub)
        assert other.returncode == 0 and "downloaded" in other.stdout and hub.file_requests()
    assert sorted(p.name for p in (node / NS).iterdir()) == ["another", NAME]

    pod = _pod(objs, "decode")
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model-cache")
    seen_by_vllm = node / mount["subPath"]  # what the kubelet mounts at /model-cache, read-only
    data = next(o for o in objs if o["kind"] == "ConfigMap")["data"]
    settings = RoleSettings.model_validate_json(data["decode.json"])
    where = seen_by_vllm / settings.model.vllm_model_arg.removeprefix(f"{mount['mountPath']}/")
    for check in (checks.model_cache, checks.model_config):
        outcome = check(PreflightContext(settings=settings, env={}, model_dir=where))
        assert outcome is not None and outcome.ok, outcome


def test_the_pods_download_never_asks_the_scheduler_for_more_than_the_role_does() -> None:
    """An init container's requests count when they are larger than the containers' sum: the download's stay
    within vLLM's, so a small role (the CPU example's quarter core) is scheduled where it fits."""
    doc = yaml.safe_load((EXAMPLES / "cpu-tiny.yaml").read_text())
    doc["spec"]["model"]["cache"] = {"mode": "NodeCache"}
    assert doc["spec"]["decode"]["resources"]["requests"] == {"cpu": "250m", "memory": "3Gi"}
    doc["spec"]["prefill"]["resources"]["requests"] = {"cpu": "4", "memory": "1Gi"}
    objs = render(doc)
    assert _pod(objs, "decode")["initContainers"][0]["resources"]["requests"] == {"cpu": "250m", "memory": "2Gi"}
    assert _pod(objs, "prefill")["initContainers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
