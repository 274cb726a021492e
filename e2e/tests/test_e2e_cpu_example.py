"""The CPU-sized example (``examples/cpu-tiny.yaml``) served for real on the real node: the CPU runtime
image built here from ``runtime/Dockerfile``, the operator reconciling it, prefill and decode pods whose
entrypoint ran preflight and supervises the runtime's CPU engine (a stand-in for vLLM, named so), a decode
pod Ready only after a real NIXL transfer from the prefill pod, and completions through the deployment's
Service that equal the tiny DSA model computed in this process.

Slow: a cold run builds the CPU runtime image (about 11 GB, see e2e/BENCHMARKS.md); the serving pods then
import vLLM for its parser on a 2-core machine before they serve. The tests run in file order on one node.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import OperatorProcess, apply_crds, eventually, exists, free_port, get_json
from e2e_realnode import SERVICE_LOAD, LlmdLoad, load_results, via_envoy_standin, wait_pods_ready
from hisparse_devcluster import Cluster, cpu_example
from hisparse_devcluster.realnode import NODE_NAME, RealNode
from hisparse_operator import names
from hisparse_operator.api import labels as L
from hisparse_operator.controller.webhook import CONFIGURATION as WEBHOOK_CONFIGURATION

pytestmark = [pytest.mark.slow, pytest.mark.host]

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"
DOC = cpu_example.example_doc()
NAME, NAMESPACE = DOC["metadata"]["name"], DOC["metadata"]["namespace"]
READY_TIMEOUT = 900.0
"""Model load here is importing vLLM's parser (torch and vLLM) in each serving pod on 2 shared cores."""
PROMPTS = [list(range(7, 47)), [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4] * 5]


@pytest.fixture(scope="module")
def prepared(cluster: Cluster, node: RealNode) -> Iterator[dict[str, str]]:
    refs = cpu_example.prepare(cluster, node)
    try:
        yield refs
    finally:  # after the operator fixture deleted the example: the cluster outlives this module's node
        cpu_example.remove(cluster)


def start_host_operator(cluster: Cluster, workdir: Path) -> OperatorProcess:
    """The CRD applied and the operator as a host process, serving its webhook on a free port."""
    apply_crds(cluster, CRD)
    op = OperatorProcess(cluster, workdir, env={"HISPARSE_WEBHOOK_PORT": str(free_port()),
                                                "HISPARSE_WEBHOOK_CERT_DIR": str(workdir / "certs")})
    op.spawn()
    op.wait_serving()
    eventually(lambda: exists(cluster, "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION),
               what="the operator's webhook configuration", timeout=30)
    return op


@pytest.fixture(scope="module")
def operator(cluster: Cluster, prepared: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    op = start_host_operator(cluster, tmp_path_factory.mktemp("operator"))
    try:
        yield op
    finally:
        cluster.kubectl("delete", "hsd", NAME, "-n", NAMESPACE, "--wait=true", "--timeout=120s", check=False)
        op.stop()


def _conditions(cluster: Cluster) -> dict[str, str]:
    obj = get_json(cluster, "hsd", NAME, "-n", NAMESPACE)
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions", [])}


CANARY_TIMEOUT = 1500.0
"""A candidate's two pods import vLLM's parser, the parity Job runs, and promotion starts new stable pods."""


def _status(cluster: Cluster) -> dict[str, Any]:
    return dict(get_json(cluster, "hsd", NAME, "-n", NAMESPACE).get("status") or {})


def _stable_uids(cluster: Cluster) -> dict[str, str]:
    pods = get_json(cluster, "pods", "-n", NAMESPACE, "-l", f"serving.hisparse.dev/deployment={NAME}")["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def _canary(cluster: Cluster) -> dict[str, Any]:
    return dict(_status(cluster).get("canary") or {})


def _stable_fleet(cluster: Cluster) -> str:
    """The base name the stable fleet's objects and pods carry (``<name>`` until a canary is promoted)."""
    return str(_status(cluster).get("stableFleet") or NAME)


def _candidate_pods(cluster: Cluster) -> list[dict[str, Any]]:
    """The serving pods of every fleet but the stable one (a candidate's, or a rolled-back one's still going)."""
    return get_json(cluster, "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={NAME},serving.hisparse.dev/role,"
                    f"serving.hisparse.dev/deployment!={_stable_fleet(cluster)}")["items"]


def _pods(cluster: Cluster, role: str) -> list[dict[str, Any]]:
    """The stable fleet's pods of ``role`` (a candidate's carry their own fleet's name)."""
    return get_json(cluster, "pods", "-n", NAMESPACE, "-l",
                    f"serving.hisparse.dev/role={role},serving.hisparse.dev/deployment={_stable_fleet(cluster)}")["items"]


@pytest.fixture(scope="module")
def deployed(cluster: Cluster, operator: OperatorProcess) -> dict[str, dict[str, Any]]:
    cluster.kubectl("apply", "-f", str(cpu_example.EXAMPLE))

    def ready() -> bool:
        assert operator.running(), operator.log()[-3000:]
        return _conditions(cluster).get("Ready") == "True"

    try:
        eventually(ready, what=f"{NAME} Ready", timeout=READY_TIMEOUT)
    except AssertionError:
        print(cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout)
        print(cluster.kubectl("describe", "pods", "-n", NAMESPACE, check=False).stdout[-6000:])
        raise
    return {role: _pods(cluster, role)[0] for role in ("prefill", "decode")}


EXEC_TIMEOUT = 300.0
"""A command in a serving pod: the pods request a quarter of a CPU, so beside the engine and a busy host an
import of vLLM and torch once took over 120 s."""


def _exec(cluster: Cluster, pod: str, *argv: str) -> str:
    return cluster.kubectl("exec", "-n", NAMESPACE, pod, "-c", "vllm", "--", *argv, timeout=EXEC_TIMEOUT).stdout


def test_serving_pods_run_on_the_real_node_from_the_local_image(cluster: Cluster, prepared: dict[str, str],
                                                                deployed: dict) -> None:
    # The kubelet may report either tag of the one image it ran: the manifest's :dev or the build's own.
    local = {DOC["spec"]["engine"]["image"], prepared["hisparse-runtime-cpu"]}
    for role, pod in deployed.items():
        assert pod["spec"]["nodeName"] == NODE_NAME, f"{role} pod landed on {pod['spec']['nodeName']}"
        vllm = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "vllm")
        assert vllm["ready"] and vllm["image"] in local, vllm
        assert vllm["restartCount"] == 0, f"{role}: the vLLM container restarted"
    wide = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").stdout
    print(wide)
    assert wide.count(NODE_NAME) >= 3  # prefill, decode, EPP


def test_the_runtime_image_runs_as_built(cluster: Cluster, deployed: dict) -> None:
    """What the image carries, checked in a running pod: its non-root user, the stand-in base's engine
    setting, vLLM 0.33.0's own parser (what it refuses, the CPU engine refuses with exit 2) and NIXL (two
    real agents over UCX, bytes checked)."""
    from hisparse_runtime.engine.versions import RUNTIME_UID

    pod = deployed["prefill"]["metadata"]["name"]
    assert _exec(cluster, pod, "id", "-u").strip() == str(RUNTIME_UID)
    assert "HISPARSE_SERVING_ENGINE=cpu" in _exec(cluster, pod, "env")
    refused = cluster.kubectl("exec", "-n", NAMESPACE, pod, "-c", "vllm", "--", "python3", "-m",
                              "hisparse_runtime.cpu_engine", "serve", "m", "--no-such-vllm-flag", check=False,
                              timeout=EXEC_TIMEOUT)
    assert refused.returncode == 2 and "--no-such-vllm-flag" in refused.stdout + refused.stderr, refused
    versions = _exec(cluster, pod, "python3", "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)")
    assert versions.split()[0] == "0.33.0", versions
    check = json.loads(_exec(cluster, pod, "hisparse-runtime", "nixl-check", "loopback", "--size-mib", "4"))
    assert check["ok"] and check["bytes_verified"] == 4 << 20, check


def test_preflight_ran_every_check_and_reports_the_cpu_engine(cluster: Cluster, deployed: dict) -> None:
    for role, pod in deployed.items():
        report = json.loads(_exec(cluster, pod["metadata"]["name"], "cat", "/tmp/hisparse/preflight.json"))
        checks = {c["name"]: c for c in report["checks"]}
        assert all(c["ok"] for c in checks.values()), (role, checks)
        assert "CPU engine" in checks["gpu"]["message"], checks["gpu"]
        # The rest ran for real against the pod: its model directory, shared memory, memory and side channel.
        assert "every engine rule holds" in checks["engine_rules"]["message"]
        assert {"model_config", "shm", "nixl_side_channel"} <= set(checks), sorted(checks)
        if role == "decode":
            assert {"memlock", "host_memory", "compiled_ops"} <= set(checks), sorted(checks)


def test_decode_was_ready_only_after_a_real_transfer(cluster: Cluster, deployed: dict) -> None:
    decode = deployed["decode"]["metadata"]["name"]
    proof = _exec(cluster, decode, "cat", "/tmp/hisparse/data-path-verified")
    prefill_ip = deployed["prefill"]["status"]["podIP"]
    assert prefill_ip in proof, proof


def _reference(workdir: Path, prompt: list[int], n: int) -> list[int]:
    """The same checkpoint's tokens, computed in this process (HiSparse path, as decode serves it)."""
    import torch
    from hisparse_kernels.tiny_dsa import TinyDSA
    from hisparse_runtime.cpu_engine import load_checkpoint

    torch.set_num_threads(1)
    ck = load_checkpoint(cpu_example.model_dir(workdir, NAMESPACE))
    return list(TinyDSA(ck.config, seed=ck.seed, device="cpu").generate(prompt, n, hisparse=True))


def test_completions_through_the_service_are_the_in_process_tokens(cluster: Cluster, deployed: dict) -> None:
    decode = deployed["decode"]["metadata"]["name"]
    url = f"http://{names.service_host(names.serving(NAME), NAMESPACE)}:8000/v1/completions"
    model = DOC["spec"]["model"]["servedModelName"]
    for prompt in PROMPTS:
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0,
                           "return_token_ids": True})
        script = ("import json, sys, urllib.request; r = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), "
                  "headers={'content-type': 'application/json'}); print(urllib.request.urlopen(r, timeout=120).read().decode())")
        out = json.loads(_exec(cluster, decode, "python3", "-c", script, url, body))
        choice = out["choices"][0]
        assert choice["token_ids"] == _reference(cluster.workdir, prompt, 12), (prompt, choice)
        assert choice["prompt_token_ids"] == prompt


# ---- through llm-d: the real EPP and sidecar in the pods, the Envoy stand-in in the node's network ----------

def _via_envoy_standin(cluster: Cluster, node: RealNode, prompt: str, max_tokens: int) -> dict[str, Any]:
    return via_envoy_standin(cluster, node, NAMESPACE, DOC["spec"]["model"]["servedModelName"], prompt, max_tokens,
                             pool=names.inference_pool(NAME))


def _nixl_pulls(cluster: Cluster, decode: str) -> float:
    text = _exec(cluster, decode, "python3", "-c", "import urllib.request; print(urllib.request.urlopen("
                 "'http://127.0.0.1:8200/metrics', timeout=10).read().decode())")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:nixl_bytes_transferred_count"))


def test_llmd_disaggregates_a_long_prompt_and_not_a_short_one(cluster: Cluster, node: RealNode, deployed: dict) -> None:
    from hisparse_operator.api import llmd

    decode, prefill = deployed["decode"], deployed["prefill"]
    threshold = llmd.threshold_chars(DOC["spec"]["routing"]["pdThresholdTokens"])
    pulls = _nixl_pulls(cluster, decode["metadata"]["name"])
    long = _via_envoy_standin(cluster, node, "the quick brown fox " * (threshold // 20 + 8), 6)
    assert long["status"] == 200, long
    assert long["destination"] == f"{decode['status']['podIP']}:8000", long
    assert long["headers"].get("x-prefiller-host-port") == f"{prefill['status']['podIP']}:8000", long["headers"]
    choice = long["body"]["choices"][0]
    assert choice["token_ids"] == _reference(cluster.workdir, choice["prompt_token_ids"], 6)
    assert _nixl_pulls(cluster, decode["metadata"]["name"]) == pulls + 1, "decode did not pull the prompt's KV"

    short = _via_envoy_standin(cluster, node, "short prompt", 4)
    assert short["status"] == 200 and "x-prefiller-host-port" not in short["headers"], short
    choice = short["body"]["choices"][0]
    assert choice["token_ids"] == _reference(cluster.workdir, choice["prompt_token_ids"], 4)
    assert _nixl_pulls(cluster, decode["metadata"]["name"]) == pulls + 1, "a short prompt must prefill on decode"


OTHER_KV_BUILD = "0" * 16
"""A KV-compatibility hash no rendered pod carries."""


# On the loaded 2-core node, beside two CPU engines, a stray's sandbox alone once took 72 s and its
# container as long again; a 180 s wait once timed out.
STRAY_READY_S = 300
STRAY_CPU = "250m"
"""A stray requests CPU as the serving pods do: with no request it is BestEffort (2 CPU shares against the
serving pods' 256), starved whenever the node is busy; two strays once missed 300 s so."""


def _stray(role: dict[str, Any], name: str) -> dict[str, Any]:
    """A pod on the real node with a serving pod's labels but another KV-compatibility hash: a Python HTTP
    server from the runtime image on the serving port, which logs every request it gets."""
    labels = {**role["metadata"]["labels"], L.KV_COMPAT: OTHER_KV_BUILD}
    labels.pop("pod-template-hash", None)
    vllm = next(c for c in role["spec"]["containers"] if c["name"] == "vllm")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {"nodeSelector": role["spec"].get("nodeSelector", {}),
                     "tolerations": role["spec"].get("tolerations", []),
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "stray", "image": vllm["image"], "imagePullPolicy": "Never",
                                     "command": ["python3", "-m", "http.server", "8000"],
                                     "resources": {"requests": {"cpu": STRAY_CPU, "memory": "64Mi"}},
                                     "ports": [{"containerPort": 8000}],
                                     "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}]}}


def test_llmd_never_picks_a_pod_of_another_kv_build(cluster: Cluster, node: RealNode, deployed: dict) -> None:
    """Stray prefill and decode pods that match everything but the KV hash, Ready on the real node: the EPP
    pod, watching the rendered InferencePool, sends them nothing, long prompts or short."""
    from hisparse_operator.api import llmd

    strays = {"prefill": "stray-prefill", "decode": "stray-decode"}
    cluster.apply([_stray(deployed[role], name) for role, name in strays.items()])
    try:
        wait_pods_ready(cluster, NAMESPACE, list(strays.values()), timeout=STRAY_READY_S)
        ips = {get_json(cluster, "pod", n, "-n", NAMESPACE)["status"]["podIP"] for n in strays.values()}
        time.sleep(5)  # the EPP's pod informer has seen them (it lists pods by the pool's selector)
        threshold = llmd.threshold_chars(DOC["spec"]["routing"]["pdThresholdTokens"])
        picked = set()
        for i in range(6):
            prompt = f"request {i}: " + ("the quick brown fox " * (threshold // 20 + 8) if i % 2 else "short")
            res = _via_envoy_standin(cluster, node, prompt, 2)
            assert res["status"] == 200, res
            picked |= {res["destination"].rsplit(":", 1)[0],
                       res["headers"].get("x-prefiller-host-port", "").rsplit(":", 1)[0]}
        assert deployed["prefill"]["status"]["podIP"] in picked, picked  # the long prompts were disaggregated
        assert not picked & ips, picked
        for name in strays.values():
            log = cluster.kubectl("logs", "-n", NAMESPACE, name).stdout  # http.server logs each request
            assert "POST" not in log and "GET" not in log, log[-2000:]
    finally:
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, *strays.values(), "--wait=false", check=False)


def _decode_ready_since(cluster: Cluster, name: str) -> str | None:
    """The decode pod's Ready condition's last transition while it is True, else None."""
    pod = get_json(cluster, "pod", name, "-n", NAMESPACE)
    cond = next((c for c in pod["status"].get("conditions", []) if c["type"] == "Ready"), {})
    return cond.get("lastTransitionTime") if cond.get("status") == "True" else None


def test_a_broken_prefill_pod_does_not_take_decode_out_of_service(cluster: Cluster, deployed: dict) -> None:
    """A second pod behind the prefill Service, Ready but broken (an HTTP server on the serving port, no
    NIXL publisher): the prefill Service resolves to both, and decode's data-path proof, forced again and
    again, passes through the real prefill pod every time; decode never leaves Ready and serves."""
    from hisparse_runtime.engine.parity import RUNTIME_COMMAND

    decode = deployed["decode"]["metadata"]["name"]
    prefill_ip = deployed["prefill"]["status"]["podIP"]
    since = _decode_ready_since(cluster, decode)
    assert since is not None, "decode is not Ready before the test"
    cluster.apply([_stray(deployed["prefill"], "broken-prefill")])
    try:
        wait_pods_ready(cluster, NAMESPACE, ["broken-prefill"], timeout=STRAY_READY_S)
        broken_ip = get_json(cluster, "pod", "broken-prefill", "-n", NAMESPACE)["status"]["podIP"]
        host = names.service_host(names.nixl_service(NAME, "prefill"), NAMESPACE)
        resolve = "import socket, sys; print(sorted({i[4][0] for i in socket.getaddrinfo(sys.argv[1], None)}))"
        eventually(lambda: broken_ip in _exec(cluster, decode, "python3", "-c", resolve, host),
                   what="the broken pod behind the prefill Service", timeout=60)
        assert prefill_ip in _exec(cluster, decode, "python3", "-c", resolve, host)
        # The probe the kubelet runs, forced to prove the path again each time (it re-proves every 10 min).
        failed_first = 0
        for _ in range(6):
            _exec(cluster, decode, "rm", "-f", "/tmp/hisparse/data-path-verified")
            out = _exec(cluster, decode, RUNTIME_COMMAND, "probe", "ready", "--role", "decode", "--timeout", "20")
            proof = json.loads(_exec(cluster, decode, "cat", "/tmp/hisparse/data-path-verified"))
            assert proof["prefill"] == prefill_ip, (out, proof)
            failed_first += any(f.startswith(f"{broken_ip}:") for f in proof.get("prefill_failed", []))
        print(f"the broken pod was tried first in {failed_first} of 6 proofs")
        # The kubelet's own probes in the meantime (every 5 s, 6 failures to leave): decode stayed Ready.
        _exec(cluster, decode, "rm", "-f", "/tmp/hisparse/data-path-verified")
        time.sleep(35)
        assert _decode_ready_since(cluster, decode) == since, "decode left Ready while a prefill pod was broken"
        assert prefill_ip in _exec(cluster, decode, "cat", "/tmp/hisparse/data-path-verified")
        test_completions_through_the_service_are_the_in_process_tokens(cluster, deployed)
    finally:
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, "broken-prefill", "--wait=false", check=False)


# ---- the model as production gets it: downloaded once into the shared cache, from the hub stand-in -------

def _condition(cluster: Cluster, type_: str) -> dict[str, Any]:
    obj = get_json(cluster, "hsd", NAME, "-n", NAMESPACE)
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def _hub_file_gets(cluster: Cluster) -> list[str]:
    """The files the hub stand-in served (its log has one ``<METHOD> <path>`` line per request)."""
    log = cluster.kubectl("logs", "-n", NAMESPACE, f"deployment/{cpu_example.HUB_NAME}").stdout
    return [ln.split(" ", 1)[1] for ln in log.splitlines() if ln.startswith("GET ") and "/resolve/" in ln]


def test_the_model_was_downloaded_once_into_the_shared_cache(cluster: Cluster, deployed: dict) -> None:
    from hisparse_runtime.engine import MODEL_CACHE_PATH, MODEL_MARKER_FILE

    model = DOC["spec"]["model"]
    ready = _condition(cluster, "ModelReady")
    assert ready.get("status") == "True" and ready.get("reason") == "Cached", ready
    jobs = get_json(cluster, "jobs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=model-fetch")["items"]
    assert len(jobs) == 1 and jobs[0]["status"].get("succeeded") == 1, [j["status"] for j in jobs]
    # Every file of the commit came from the hub exactly once, and the marker names that commit.
    host = cpu_example.model_dir(cluster.workdir, NAMESPACE)
    commit = cpu_example.hub_commit(host)
    files = sorted(p.relative_to(host).as_posix() for p in host.rglob("*") if p.is_file())
    repo = model["source"].removeprefix("hf://")
    assert sorted(_hub_file_gets(cluster)) == sorted(f"/{repo}/resolve/{commit}/{f}" for f in files)
    cache_dir = f"{MODEL_CACHE_PATH}/hf/{repo}/{model['revision']}"
    pod = deployed["decode"]["metadata"]["name"]
    marker = json.loads(_exec(cluster, pod, "cat", f"{cache_dir}/{MODEL_MARKER_FILE}"))
    assert marker["commit"] == commit and sorted(marker["files"]) == files, marker
    # The serving pods mount the claim read-only, and the engine they run was started on that directory.
    for role, p in deployed.items():
        vllm = next(c for c in p["spec"]["containers"] if c["name"] == "vllm")
        mount = next(m for m in vllm["volumeMounts"] if m["mountPath"] == MODEL_CACHE_PATH)
        assert mount.get("readOnly") is True, (role, mount)
        argvs = _exec(cluster, p["metadata"]["name"], "sh", "-c", "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done")
        assert any("cpu_engine" in a and f" {cache_dir} " in f" {a} " for a in argvs.splitlines()), (role, argvs)


def test_a_revision_the_hub_lacks_is_model_ready_false_and_stable_keeps_serving(cluster: Cluster,
                                                                                  deployed: dict) -> None:
    """It changes the spec (and puts it back): after every test that reads the pods of ``deployed``."""
    stable = {role: p["metadata"]["uid"] for role, p in deployed.items()}
    gets = len(_hub_file_gets(cluster))
    revision = DOC["spec"]["model"]["revision"]
    cluster.kubectl("patch", "hsd", NAME, "-n", NAMESPACE, "--type=merge",
                    "-p", json.dumps({"spec": {"model": {"revision": "no-such-revision"}}}))

    def refused() -> dict[str, Any] | None:
        c = _condition(cluster, "ModelReady")
        return c if c.get("status") == "False" and c.get("reason") == "ModelNotFound" else None

    cond = eventually(refused, what="ModelReady False with ModelNotFound", timeout=300)
    assert "no-such-revision" in cond["message"], cond
    # The stable revision serves on: Ready stays True, as a Deployment whose new ReplicaSet cannot start.
    assert _conditions(cluster).get("Ready") == "True", _condition(cluster, "Ready")
    assert {role: _pods(cluster, role)[0]["metadata"]["uid"] for role in stable} == stable
    assert len(_hub_file_gets(cluster)) == gets, "a revision the hub lacks fetched files"
    cluster.kubectl("patch", "hsd", NAME, "-n", NAMESPACE, "--type=merge",
                    "-p", json.dumps({"spec": {"model": {"revision": revision}}}))
    eventually(lambda: _condition(cluster, "ModelReady").get("status") == "True"
               and _conditions(cluster).get("Ready") == "True", what="ModelReady and Ready again", timeout=300)
    assert {role: _pods(cluster, role)[0]["metadata"]["uid"] for role in stable} == stable


NODE_CACHED = f"{NAME}-node-cache"


def test_a_node_cache_is_filled_once_on_the_node_and_a_recreated_pod_loads_from_it(cluster: Cluster,
                                                                                   deployed: dict) -> None:
    """``cache.mode: NodeCache`` on the real node: a second deployment of the example, naming a
    directory prepared as the model-artifacts guide says (owned by the runtime's UID). Its prefill and decode
    pods start at once on the one node and fill one directory: each file of the commit comes from the hub once.
    Its decode pod deleted, the replacement's ``fetch-model`` says ``already cached``, the hub sees no request,
    and the new pod serves the checkpoint's tokens. The deployment is deleted at the end; the directory stays."""
    import os
    import re
    import shutil

    from hisparse_runtime.engine import MODEL_MARKER_FILE
    from hisparse_runtime.engine.model import NODE_PATH_PATTERN
    from hisparse_runtime.engine.versions import RUNTIME_UID

    node_dir = cluster.workdir / "node-model-cache"
    assert re.match(NODE_PATH_PATTERN, str(node_dir)), node_dir
    shutil.rmtree(node_dir, ignore_errors=True)
    node_dir.mkdir(mode=0o750)
    os.chown(node_dir, RUNTIME_UID, RUNTIME_UID)  # the node setup: install -d -o 10001 -g 10001
    doc = json.loads(json.dumps(DOC))
    doc["metadata"]["name"] = NODE_CACHED
    doc["spec"]["model"]["cache"] = {"mode": "NodeCache", "nodePath": str(node_dir)}
    doc["spec"].pop("rollout", None)
    before = len(_hub_file_gets(cluster))
    selector = f"{L.DEPLOYMENT}={NODE_CACHED}"

    def fleet(role: str) -> list[dict[str, Any]]:
        return [p for p in get_json(cluster, "pods", "-n", NAMESPACE, "-l", f"{selector},{L.ROLE}={role}")["items"]
                if not p["metadata"].get("deletionTimestamp")]

    def state() -> dict[str, Any]:
        return dict(get_json(cluster, "hsd", NODE_CACHED, "-n", NAMESPACE).get("status") or {})

    def ready() -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True" for c in state().get("conditions", []))

    cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    try:
        eventually(ready, what=f"{NODE_CACHED} Ready", timeout=READY_TIMEOUT)
        repo, revision = doc["spec"]["model"]["source"].removeprefix("hf://"), doc["spec"]["model"]["revision"]
        filled = node_dir / NAMESPACE / NODE_CACHED / "hf" / repo / revision
        hub = cpu_example.model_dir(cluster.workdir, NAMESPACE)
        files = sorted(p.relative_to(hub).as_posix() for p in hub.rglob("*") if p.is_file())
        commit = cpu_example.hub_commit(hub)
        first = _hub_file_gets(cluster)[before:]
        assert files and sorted(first) == sorted(f"/{repo}/resolve/{commit}/{f}" for f in files), (first, files)
        assert sorted(p.relative_to(filled).as_posix() for p in filled.rglob("*") if p.is_file()
                      and not p.relative_to(filled).as_posix().startswith(".cache/")) == sorted([*files, MODEL_MARKER_FILE])
        model_ready = next(c for c in state()["conditions"] if c["type"] == "ModelReady")
        assert (model_ready["status"], model_ready["reason"]) == ("True", "FetchedByPods"), model_ready
        assert str(node_dir) in model_ready["message"], model_ready
        logs = {role: cluster.kubectl("logs", "-n", NAMESPACE, fleet(role)[0]["metadata"]["name"], "-c", "fetch-model").stdout
                for role in ("prefill", "decode")}
        # One pod filled the directory; the other, started beside it, waited its turn and found the files.
        verbs = sorted("downloaded" if "downloaded" in out else "already cached" if "already cached" in out else out
                       for out in logs.values())
        assert verbs == ["already cached", "downloaded"], logs

        (victim,) = fleet("decode")
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, victim["metadata"]["name"], "--wait=true", "--timeout=180s")
        eventually(lambda: len(fleet("decode")) == 1 and fleet("decode")[0]["metadata"]["uid"] != victim["metadata"]["uid"],
                   what="a replacement decode pod", timeout=120)
        (again,) = fleet("decode")
        wait_pods_ready(cluster, NAMESPACE, [again["metadata"]["name"]], timeout=READY_TIMEOUT)
        fetched = cluster.kubectl("logs", "-n", NAMESPACE, again["metadata"]["name"], "-c", "fetch-model").stdout
        assert "already cached" in fetched and "downloaded" not in fetched, fetched
        assert _hub_file_gets(cluster)[before:] == first, "the recreated pod reached the hub"
        url = f"http://{names.service_host(names.serving(NODE_CACHED), NAMESPACE)}:8000/v1/completions"
        body = json.dumps({"model": doc["spec"]["model"]["servedModelName"], "prompt": PROMPTS[0], "max_tokens": 12,
                           "temperature": 0, "return_token_ids": True})
        script = ("import sys, urllib.request; r = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), "
                  "headers={'content-type': 'application/json'}); print(urllib.request.urlopen(r, timeout=120).read().decode())")
        choice = json.loads(_exec(cluster, again["metadata"]["name"], "python3", "-c", script, url, body))["choices"][0]
        assert choice["token_ids"] == _reference(cluster.workdir, PROMPTS[0], 12), choice
        print(f"node cache: {len(first)} files from the hub for two pods; the recreated decode pod loaded from the node")
    finally:
        cluster.kubectl("delete", "hsd", NODE_CACHED, "-n", NAMESPACE, "--wait=true", "--timeout=180s", check=False)
        eventually(lambda: not get_json(cluster, "pods", "-n", NAMESPACE, "-l", selector)["items"],
                   what=f"{NODE_CACHED}'s pods gone", timeout=240)
    assert (node_dir / NAMESPACE / NODE_CACHED).is_dir(), "the node's cache went with the deployment"
    shutil.rmtree(node_dir)


def _long_prompt() -> str:
    """A prompt over the P/D threshold: llm-d prefills it on a prefill pod and decode pulls its KV."""
    from hisparse_operator.api import llmd

    return "the quick brown fox " * (llmd.threshold_chars(DOC["spec"]["routing"]["pdThresholdTokens"]) // 20 + 8)


def _delete_under_llmd_load(cluster: Cluster, node: RealNode, pod: dict[str, Any],
                            timeout: float) -> tuple[list[dict[str, Any]], float, float, float]:
    """``pod`` deleted 5 s into a bounded load through llm-d (:class:`LlmdLoad`, short prompts and P/D ones), the
    load going on until 3 s after it is gone: the load's results, when it was deleted and gone (monotonic), and
    when it was deleted (wall clock)."""
    name = pod["metadata"]["name"]
    with LlmdLoad(cluster, node, NAMESPACE, DOC["spec"]["model"]["servedModelName"], _long_prompt(),
                  pool=names.inference_pool(NAME)) as load:
        time.sleep(5)
        deleted, deleted_at = time.monotonic(), time.time()
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, name, "--wait=false")
        eventually(lambda: not exists(cluster, "pod", "-n", NAMESPACE, name), what=f"{name} gone", timeout=timeout)
        gone = time.monotonic()
        time.sleep(3)
    return load.results, deleted, deleted_at, gone


def _is_ready(p: dict[str, Any]) -> bool:
    return not p["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))


def _epp_pods(cluster: Cluster) -> list[dict[str, Any]]:
    """The stable fleet's EPP pods."""
    return get_json(cluster, "pods", "-n", NAMESPACE, "-l",
                    f"{L.APP_COMPONENT}=epp,{L.DEPLOYMENT}={_stable_fleet(cluster)}")["items"]


def test_an_epp_pod_deleted_under_load_fails_no_request(cluster: Cluster, node: RealNode, deployed: dict) -> None:
    """EPP high availability: the default replicas (two, active-active) are both Ready behind the EPP Service
    the InferencePool names, one may be disrupted at a time (the PodDisruptionBudget allows one), and a bounded
    load through llm-d as a gateway sends it (the Envoy stand-in dials that Service; kube-proxy picks an EPP
    pod for each connection; short prompts and P/D ones) sees not one failed request while one EPP pod is
    deleted: it keeps taking streams through its preStop sleep while kube-proxy drops it, then finishes the
    streams it holds. It leaves two EPP pods Ready."""
    from hisparse_operator.api.spec import RoutingSpec

    fleet = _stable_fleet(cluster)
    replicas = DOC["spec"]["routing"].get("eppReplicas", RoutingSpec.model_fields["epp_replicas"].default)
    assert replicas == 2, f"the CPU example runs {replicas} EPP replicas: this test is about two"
    eventually(lambda: len([p for p in _epp_pods(cluster) if _is_ready(p)]) == replicas,
               what=f"{replicas} EPP pods Ready", timeout=300)
    eventually(lambda: (get_json(cluster, "pdb", names.pdb(fleet, "epp"), "-n", NAMESPACE).get("status") or {})
               .get("disruptionsAllowed") == 1, what="the EPP's PodDisruptionBudget allowing one disruption", timeout=60)
    victim = _epp_pods(cluster)[0]
    epp = next(c for c in victim["spec"]["containers"] if c["name"] == "epp")
    sleep = epp["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert victim["spec"]["terminationGracePeriodSeconds"] > sleep, victim["spec"]
    assert "--ha-enable-leader-election" not in " ".join(epp["args"]), epp["args"]

    results, deleted, _, gone = _delete_under_llmd_load(cluster, node, victim, timeout=sleep + 120)
    during = [r for r in results if deleted <= r["at"] <= gone]
    assert len(results) >= 10 and len(during) >= 3, (len(results), len(during), gone - deleted)
    failed = [f"{r['at'] - deleted:+.1f}s: {r['error'] or r}" for r in LlmdLoad.failed(results)]
    assert not failed, ("\n".join(failed) + "\n" + cluster.kubectl(
        "get", "pods", "-n", NAMESPACE, "-l", f"{L.APP_COMPONENT}=epp", "-o", "wide", check=False).stdout
        + cluster.kubectl("logs", "-n", NAMESPACE, "-l", f"{L.APP_COMPONENT}=epp", "--prefix", "--tail=30",
                          check=False).stdout[-6000:])
    print(f"EPP pod gone after {gone - deleted:.1f}s (preStop {sleep}s): {len(results)} completions through llm-d, "
          f"{len(during)} while it terminated, none failed")
    eventually(lambda: len([p for p in _epp_pods(cluster) if _is_ready(p)]) == replicas,
               what="a replacement EPP pod Ready", timeout=300)


CLIENT_POD = "e2e-serving-client"


def _client_pod(role: dict[str, Any], url: str, body: dict[str, Any]) -> dict[str, Any]:
    """A client of ``<name>-serving`` on the real node, from the runtime image (a serving pod ``role``'s), as an
    application in the cluster calls it: completions back to back until deleted, one JSON line each."""
    vllm = next(c for c in role["spec"]["containers"] if c["name"] == "vllm")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": CLIENT_POD, "namespace": NAMESPACE},
            "spec": {"nodeSelector": role["spec"].get("nodeSelector", {}),
                     "tolerations": role["spec"].get("tolerations", []), "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "client", "image": vllm["image"], "imagePullPolicy": "Never",
                                     "command": ["python3", "-c", SERVICE_LOAD, url, json.dumps(body), "0"],
                                     "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}]}}


def test_a_same_token_candidate_under_client_load_is_promoted_without_a_failed_request(
        cluster: Cluster, node: RealNode, deployed: dict) -> None:
    """A canary as production runs it, with its fleet serving: the same build under another tag rolled out while a
    bounded client load runs through llm-d (the Envoy stand-in, following the InferencePool ``<name>`` to its EPP
    as a gateway does; short prompts and P/D ones) and through ``<name>-serving`` (a client pod). The parity Job
    compares real tokens of both fleets while they serve that load and passes with no divergence; the route
    shares traffic at the step's weight; promotion re-points the entry points at the candidate's fleet, whose
    pods are then the stable ones (not one recreated), and not one client request fails."""
    from hisparse_devcluster.route_watch import RouteWatcher

    stable, stable_fleet = _status(cluster)["stableRevision"], _stable_fleet(cluster)
    image = DOC["spec"]["engine"]["image"]
    candidate_image = image.rsplit(":", 1)[0] + ":same-tokens"
    node.ctr("images", "tag", "--force", image, candidate_image)
    model = DOC["spec"]["model"]["servedModelName"]
    long_prompt = _long_prompt()
    url = f"http://{names.service_host(names.serving(NAME), NAMESPACE)}:8000/v1/completions"
    cluster.apply([_client_pod(_pods(cluster, "decode")[0], url, {"model": model, "prompt": PROMPTS[0], "max_tokens": 4,
                                                                  "temperature": 0, "return_token_ids": True})])
    candidate_uids: dict[str, str] = {}
    phases: list[tuple[float, str]] = []  # (seconds since the patch, status.canary.phase) at each change
    try:
        eventually(lambda: (get_json(cluster, "pod", CLIENT_POD, "-n", NAMESPACE).get("status") or {}).get("phase")
                   == "Running", what="the client pod running", timeout=STRAY_READY_S)
        with RouteWatcher(cluster, NAMESPACE) as watch, \
                LlmdLoad(cluster, node, NAMESPACE, model, long_prompt, pool=names.inference_pool(NAME)) as load:
            started = time.time()
            cluster.kubectl("patch", "hsd", NAME, "-n", NAMESPACE, "--type=merge", "-p",
                            json.dumps({"spec": {"engine": {"image": candidate_image}}}))

            def promoted() -> bool:
                st = _status(cluster)
                phase = (st.get("canary") or {}).get("phase")
                if phase and (not phases or phases[-1][1] != phase):
                    phases.append((time.time() - started, phase))
                assert phase != "RolledBack", st
                for p in _candidate_pods(cluster):
                    candidate_uids[p["metadata"]["name"]] = p["metadata"]["uid"]
                return st.get("stableRevision") not in (None, stable) and not st.get("canaryRevision")

            try:
                eventually(promoted, what="the candidate promoted", timeout=CANARY_TIMEOUT)
                eventually(lambda: _conditions(cluster).get("Ready") == "True", what="Ready after promotion", timeout=300)
            except AssertionError:
                print(f"phases: {phases}")
                print(json.dumps(_status(cluster), indent=1))
                print(cluster.kubectl("get", "pods,jobs", "-n", NAMESPACE, "-o", "wide", check=False).stdout)
                raise
            time.sleep(5)  # the load goes on past the promotion, onto the promoted fleet
        served = load_results(cluster.kubectl("logs", "-n", NAMESPACE, CLIENT_POD).stdout)
    finally:
        cluster.kubectl("delete", "pod", CLIENT_POD, "-n", NAMESPACE, "--wait=false", check=False)

    st = _status(cluster)
    parity = st["parity"]
    assert parity["passed"] and parity["diverged"] == 0, parity
    assert parity["prompts"] >= DOC["spec"]["rollout"]["parity"]["prompts"], parity
    assert not watch.violations, watch.violations
    steps = [s["weight"] for s in DOC["spec"]["rollout"]["steps"] if "weight" in s]
    shared = {w.get(pool) for _, w in watch.weights for pool in w if pool != stable_fleet and 0 < w.get(pool, 0) < 100}
    # Shared at a step's weight or below it (capped by the candidate's share of ready capacity), never above.
    assert shared and max(shared) <= max(w for w in steps if w < 100), f"candidate weights {shared}, steps {steps}"
    # Promotion re-pointed the entry points: the stable fleet's pods are the candidate's, not new ones.
    assert _stable_fleet(cluster) != stable_fleet
    final = {p["metadata"]["name"]: p["metadata"]["uid"] for role in ("prefill", "decode") for p in _pods(cluster, role)}
    assert final and all(candidate_uids.get(n) == uid for n, uid in final.items()), (final, candidate_uids)
    for name in final:
        pod = get_json(cluster, "pod", name, "-n", NAMESPACE)
        assert next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")["image"] == candidate_image
    # Not one client request failed, through either entry point, and both carried load through the rollout.
    through_llmd = load.results
    assert not LlmdLoad.failed(through_llmd), LlmdLoad.failed(through_llmd)[:10]
    during = [r for r in served if r["at"] >= started]
    failed = [r for r in during if r.get("status") != 200]
    assert len(during) >= 10 and len(through_llmd) >= 10, (len(during), len(through_llmd))
    assert not failed, failed[:10]
    epps = {r["epp"] for r in through_llmd}
    print(f"promoted in {time.time() - started:.0f}s: parity {parity['prompts']} prompts, 0 diverged; weights "
          f"{sorted(shared)}; {len(through_llmd)} completions through llm-d ({len(epps)} EPP Services), "
          f"{len(during)} through {names.serving(NAME)}, none failed; phases (s since the patch): "
          + ", ".join(f"{p} {t:.0f}" for t, p in phases))


def _ready_pods(cluster: Cluster, role: str) -> list[dict[str, Any]]:
    return [p for p in _pods(cluster, role) if _is_ready(p)]


def test_a_decode_pod_deleted_under_load_fails_no_request_and_its_replacement_loads_from_the_cache(
        cluster: Cluster, node: RealNode, deployed: dict) -> None:
    """Graceful removal, as a node drain or a rollout removes a pod: decode scaled to two replicas, a bounded
    client load through llm-d (the Envoy stand-in, the EPP, the sidecar; short prompts and P/D ones) and through
    the deployment's Service, and a long request in flight on the decode pod that is then deleted. Not one
    request fails: the pod keeps serving through its preStop sleep while the EPP and kube-proxy drop it, then
    drains what it holds. Its replacement (and the added replica) load from the cache the Job filled, with not
    one more request to the hub and no second download Job. It leaves two decode replicas: the last test."""
    from hisparse_operator.api.spec import RoleSpec

    gets = _hub_file_gets(cluster)
    assert gets, "the hub stand-in logged no download: nothing to compare"
    (victim,) = _pods(cluster, "decode")
    grace = victim["spec"]["terminationGracePeriodSeconds"]
    vllm = next(c for c in victim["spec"]["containers"] if c["name"] == "vllm")
    sleep = vllm["lifecycle"]["preStop"]["sleep"]["seconds"]
    default = RoleSpec.model_fields["pre_stop_sleep_seconds"].default
    assert sleep == DOC["spec"]["decode"].get("preStopSleepSeconds", default) and grace > sleep, (sleep, grace)
    cluster.kubectl("patch", "hsd", NAME, "-n", NAMESPACE, "--type=merge", "-p", '{"spec":{"decode":{"replicas":2}}}')
    eventually(lambda: len(_ready_pods(cluster, "decode")) == 2 and _conditions(cluster).get("Ready") == "True",
               what="two decode pods Ready", timeout=600)
    assert _hub_file_gets(cluster) == gets, "the added decode replica fetched from the hub"

    model = DOC["spec"]["model"]["servedModelName"]
    prefill = _pods(cluster, "prefill")[0]["metadata"]["name"]

    def load_from_prefill_pod(url: str, body: dict[str, Any], seconds: float) -> subprocess.Popen[str]:
        return subprocess.Popen([str(cluster.kubectl_path), f"--kubeconfig={cluster.kubeconfig}", "exec", "-n", NAMESPACE,
                                 prefill, "-c", "vllm", "--", "python3", "-c", SERVICE_LOAD, url,
                                 json.dumps({"model": model, "temperature": 0, "return_token_ids": True, **body}),
                                 str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    seconds = sleep + 25
    service = load_from_prefill_pod(f"http://{names.service_host(names.serving(NAME), NAMESPACE)}:8000/v1/completions",
                                    {"prompt": PROMPTS[0], "max_tokens": 4}, seconds)
    # Long requests straight to the victim, back to back: whichever is in flight at SIGTERM must finish.
    long_tokens = DOC["spec"]["engine"]["maxModelLen"] - len(PROMPTS[1]) - 1
    direct = load_from_prefill_pod(f"http://{victim['status']['podIP']}:8000/v1/completions",
                                   {"prompt": PROMPTS[1], "max_tokens": long_tokens}, seconds)
    through_llmd, deleted, deleted_at, gone = _delete_under_llmd_load(cluster, node, victim, timeout=grace + 60)
    results = {}
    for what, proc in (("service", service), ("direct", direct)):
        out, err = proc.communicate(timeout=seconds + 180)
        assert proc.returncode == 0, (what, err[-2000:])
        results[what] = load_results(out)

    sigterm = deleted_at + sleep  # the kubelet runs the preStop sleep as soon as it sees the deletion
    before = [r for r in results["direct"] if r["at"] < sigterm - 1]
    spanning = [r for r in before if r["end"] > sigterm + 0.5]
    assert before and not [r for r in before if r["status"] != 200 or r["tokens"] != long_tokens], \
        f"a request the deleted pod took before SIGTERM failed or was cut short: {before}"
    assert spanning, f"no long request was in flight at SIGTERM (each took too little time?): {results['direct']}"
    during = [r for r in through_llmd if deleted <= r["at"] <= gone]
    assert len(through_llmd) >= 10 and len(during) >= 3, (len(through_llmd), len(during), gone - deleted)
    assert len(results["service"]) >= 10, results["service"]
    assert not LlmdLoad.failed(through_llmd), LlmdLoad.failed(through_llmd)
    failed = [r for r in results["service"] if r["status"] != 200]
    assert not failed, failed
    # The EPP stopped picking the deleted pod well before its SIGTERM: the sleep covers the propagation.
    to_victim = [r["at"] - deleted for r in through_llmd
                 if (r["destination"] or "").split(":")[0] == victim["status"]["podIP"]]
    after = [s for s in to_victim if s >= 0]
    assert not after or max(after) < sleep - 1, f"the EPP still picked the deleted pod {max(after):.1f}s after deletion"
    print(f"deleted pod gone after {gone - deleted:.1f}s (preStop {sleep}s, grace {grace}s); "
          f"{len(through_llmd)} completions through llm-d ({len(during)} while it terminated), "
          f"{len(results['service'])} through the Service, none failed; {len(spanning)} long request(s) of "
          f"{long_tokens} tokens in flight at SIGTERM finished; the EPP picked it {len(to_victim)} times, "
          + (f"the last {max(after):.1f}s after its deletion" if after else "never after its deletion"))

    eventually(lambda: len(_ready_pods(cluster, "decode")) == 2, what="a replacement decode pod Ready", timeout=600)
    assert _hub_file_gets(cluster) == gets
    revision = DOC["spec"]["model"]["revision"]
    jobs = [j for j in get_json(cluster, "jobs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=model-fetch")["items"]
            if revision in j["spec"]["template"]["spec"]["containers"][0]["args"]]
    assert len(jobs) == 1 and jobs[0]["status"].get("succeeded") == 1, [j["metadata"]["name"] for j in jobs]

# ---- last: the NetworkPolicies enforced (kube-router), for the rest of the module -----------------------

NEIGHBOUR = "e2e-neighbour"


def _connects(cluster: Cluster, pod: str, host: str, port: int) -> bool:
    """Whether the decode pod's vLLM container opens a TCP connection to ``host:port`` within 3 s."""
    out = _exec(cluster, pod, "python3", "-c", "import socket, sys\n"
                "try:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close(); print('rc=0')\n"
                "except OSError as e:\n    print('rc=1', e)", host, str(port))
    assert "rc=" in out, out
    return "rc=0" in out


def test_with_the_network_policies_enforced_p_d_serves_and_nothing_else_connects(
        cluster: Cluster, node: RealNode, deployed: dict, tmp_path: Path) -> None:
    """The policies the operator rendered, enforced by kube-router on the real node. Ingress: a pod of the same
    namespace that is not the gateway's connects to the model hub (no policy there) but not to decode's serving
    port or the EPP. Egress (``networkPolicy.egress`` turned on): a decode pod that reached the hub before no
    longer does, while it still resolves names and reaches its prefill pod. Under both, a long prompt goes
    through llm-d (the Envoy stand-in, the EPP, decode's sidecar, prefill, a NIXL pull of its KV) and comes back
    with the checkpoint's tokens, and a decode pod started under them proves a transfer before it is Ready (its
    readiness resolves prefill's Service and pulls KV from a prefill pod)."""
    from e2e_realnode import BUSYBOX_IMAGE, busybox_archive, busybox_pod, sh

    from hisparse_devcluster.realnode.plan import COREDNS_PORT
    from hisparse_operator.api import llmd
    from hisparse_operator.render.routing import EPP_GRPC_PORT
    from hisparse_runtime.engine import SERVICE_PORT

    assert node.import_image(busybox_archive(tmp_path / "busybox.tar")) == [BUSYBOX_IMAGE]
    node.enforce_network_policies()
    policies = get_json(cluster, "networkpolicies", "-n", NAMESPACE, "-l", f"{L.APP_INSTANCE}={NAME}")["items"]
    assert any(p["metadata"]["name"].endswith("-deny-ingress") for p in policies), [p["metadata"]["name"] for p in policies]
    cluster.apply([busybox_pod(NEIGHBOUR, NAMESPACE, "exec /bin/busybox sleep 3600")])
    try:
        wait_pods_ready(cluster, NAMESPACE, [NEIGHBOUR], timeout=120)
        decode, prefill = _ready_pods(cluster, "decode")[0], _ready_pods(cluster, "prefill")[0]
        threshold = llmd.threshold_chars(DOC["spec"]["routing"]["pdThresholdTokens"])

        def p_d_completion() -> dict[str, Any]:
            # A prompt no earlier test sent: the EPP disaggregates only what decode's prefix cache lacks, and
            # the module's earlier tests sent the same long prompt many times.
            prompt = f"policies {time.time_ns()} " + "the quick brown fox " * (threshold // 20 + 8)
            res = _via_envoy_standin(cluster, node, prompt, 6)
            assert res["status"] == 200 and res["headers"].get("x-prefiller-host-port"), res
            choice = res["body"]["choices"][0]
            assert choice["token_ids"] == _reference(cluster.workdir, choice["prompt_token_ids"], 6), choice
            return res

        # kube-router syncs the policies into the node's iptables within its sync period: until then a refusal
        # below would not be the policy's. The neighbour's connection is the witness of enforcement. The hub
        # stand-in's pod address, not its Service's: on a loaded node a connection through its ClusterIP once
        # went unanswered within 3 s with the hub Ready and no policy selecting either pod.
        hub_pod = get_json(cluster, "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={cpu_example.HUB_NAME}",
                           "--field-selector=status.phase=Running")["items"][0]
        hub_ip = hub_pod["status"]["podIP"]

        def refused(host: str, port: int) -> bool:
            # busybox nc: 1 when the connection is refused or not answered within 3 s; 0, or killed by the
            # timeout while the server holds it open, once connected. The probe inside is bounded at 8 s; the
            # exec stream that carries it (apiserver -> kubelet -> containerd) has once hung past a minute on
            # a loaded node, so a hung stream is retried, never read as an answer.
            script = f"/bin/busybox timeout 8 /bin/busybox nc -w 3 {host} {port} </dev/null >/dev/null 2>&1; echo rc=$?"
            for attempt in range(3):
                try:
                    out = sh(cluster, NAMESPACE, NEIGHBOUR, script, timeout=30)
                except subprocess.TimeoutExpired:
                    if attempt == 2:
                        raise
                    continue
                assert "rc=" in out, out
                return out.strip().endswith("rc=1")
            raise AssertionError("unreachable")

        eventually(lambda: refused(decode["status"]["podIP"], SERVICE_PORT), what="decode's serving port refused to "
                   "the neighbour once kube-router enforces the policies", timeout=120)
        epp = _epp_pods(cluster)[0]["status"]["podIP"]
        assert refused(epp, EPP_GRPC_PORT), "the EPP reached from a pod that is not the gateway's"
        eventually(lambda: not refused(hub_ip, cpu_example.HUB_PORT), timeout=60,
                   what="the neighbour connected to the hub stand-in (else it reaches nothing, and the refusals above "
                   "prove no policy)")

        # Egress: the hub answers decode until the serving pods' egress is restricted, then no longer does.
        victim = decode["metadata"]["name"]
        eventually(lambda: _connects(cluster, victim, hub_ip, cpu_example.HUB_PORT), timeout=60,
                   what="decode connected to the hub stand-in before its egress is restricted")
        # The dev cluster's CoreDNS listens on COREDNS_PORT in its pod (the Service maps 53 to it): a policy
        # matches the pod's port, so that is the port to allow, as the field's documentation says.
        cluster.kubectl("patch", "hsd", NAME, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(
            {"spec": {"networkPolicy": {"egress": {"enabled": True, "dnsPorts": [COREDNS_PORT]}}}}))
        eventually(lambda: exists(cluster, "networkpolicy", f"{_stable_fleet(cluster)}-decode-egress", "-n", NAMESPACE),
                   what="the decode egress policy rendered", timeout=60)
        eventually(lambda: not _connects(cluster, victim, hub_ip, cpu_example.HUB_PORT),
                   what="the hub refused to decode once kube-router enforces its egress policy", timeout=120)
        assert not _connects(cluster, victim, f"{cpu_example.HUB_NAME}.{NAMESPACE}.svc", cpu_example.HUB_PORT), (
            "decode reaches the hub through its Service")
        prefill_port = next(p["containerPort"] for c in prefill["spec"]["containers"] if c["name"] == "vllm"
                            for p in c["ports"] if p["name"] == "vllm")
        assert _connects(cluster, victim, prefill["status"]["podIP"], prefill_port), (
            "decode cannot reach its own prefill pod under its egress policy")
        nixl = names.service_host(names.nixl_service(_stable_fleet(cluster), "prefill"), NAMESPACE)
        resolved = _exec(cluster, victim, "python3", "-c", "import socket, sys; print(sorted({a[4][0] for a in "
                         "socket.getaddrinfo(sys.argv[1], None)}))", nixl)
        assert prefill["status"]["podIP"] in resolved, (nixl, resolved)

        before = _nixl_pulls(cluster, victim)
        first = p_d_completion()
        # The pull may have gone to either decode replica: count both.
        pulls = sum(_nixl_pulls(cluster, p["metadata"]["name"]) for p in _ready_pods(cluster, "decode"))
        assert pulls > before, (pulls, before, first["destination"])

        # A decode pod that starts under the policies: Ready only after its own NIXL proof against prefill.
        old = {p["metadata"]["uid"] for p in _ready_pods(cluster, "decode")}
        cluster.kubectl("delete", "pod", decode["metadata"]["name"], "-n", NAMESPACE, "--wait=false")
        eventually(lambda: len([p for p in _ready_pods(cluster, "decode") if p["metadata"]["uid"] not in old]) == 1,
                   what="a decode pod started under the policies Ready (its KV transfer proven)", timeout=600)
        new = next(p for p in _ready_pods(cluster, "decode") if p["metadata"]["uid"] not in old)
        proof = json.loads(_exec(cluster, new["metadata"]["name"], "cat", "/tmp/hisparse/data-path-verified"))
        assert proof["prefill"] == prefill["status"]["podIP"], proof
        p_d_completion()
    finally:
        cluster.kubectl("delete", "pod", NEIGHBOUR, "-n", NAMESPACE, "--wait=false", check=False)
        cluster.kubectl("patch", "hsd", NAME, "-n", NAMESPACE, "--type=merge", "-p",
                        json.dumps({"spec": {"networkPolicy": {"egress": None}}}), check=False)
