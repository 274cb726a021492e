"""llm-d's own EPP and routing sidecar, built from their Go modules, routing with what we render.

The real EPP (``cmd/epp`` of llm-d-inference-scheduler at ``routing.llmdVersion``) runs as a host
process with the rendered EndpointPickerConfig and flags, watching the rendered InferencePool on the
local control plane; the real sidecar (``cmd/pd-sidecar`` at ``routing.sidecarVersion``) runs with
the rendered arguments (connector nixlv2, SSRF guard on) in front of a decode engine. Pods are KWOK
pods of the rendered labels on a node whose pod CIDR the test's network namespaces serve
(:mod:`llmd_net`): each pod IP answers with a real HTTP server speaking vLLM's ``/metrics`` and
``/v1/completions`` (the completions test server, which records what it is sent).

Requests enter through ``envoy-standin`` (e2e/tools/llmd/cmd/envoy-standin), the STAND-IN FOR ENVOY:
no Envoy can be installed here, so a Go client speaks Envoy's ext_proc protocol to the EPP, then
sends the request to the endpoint the EPP picked with the headers the EPP set. It is the one
stand-in on this path.
"""

from __future__ import annotations

import copy
import json
import os
import random
import string
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from e2e_helpers import eventually, free_port, get_json
from hisparse_devcluster import Cluster, GpuNodeSpec, Tools, monitoring_exprs, nodes
from hisparse_operator.api import labels as L, llmd
from hisparse_operator.render import render
from hisparse_operator.render.routing import EPP_CONFIG_FILE, EPP_GRPC_PORT, EPP_METRICS_PORT
from hisparse_runtime.engine import SERVICE_PORT
from hisparse_runtime.testing.completions_server import CompletionsServer
from llmd_net import PodNet, in_netns, pod_net

pytestmark = pytest.mark.host

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "e2e" / "tools" / "build.sh"
EXAMPLE = REPO / "examples" / "hisparse-deployment.yaml"

POD_CIDR = "10.255.77.0/24"
"""The test node's pod CIDR: KWOK gives its pods these IPs, which exist only inside the test's
network namespaces."""

THRESHOLD_TOKENS = 64
"""``routing.pdThresholdTokens`` of the rendered deployment (small, so prompts stay short)."""

GUARDED_PORT = 8001
"""Where the decode pod's second sidecar, the one with its SSRF guard on, listens."""

OTHER_BUILD = "0" * 16
"""A KV-compatibility hash no rendered pod carries: pods with it must never be picked."""


def _bins(*only: str) -> dict[str, Path]:
    out = subprocess.run(["bash", str(BUILD), "--print-env"], capture_output=True, text=True, check=True)
    env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    want = {
        "epp": Path(env["HISPARSE_LLMD_BIN"]) / "epp",
        "envoy-standin": Path(env["HISPARSE_LLMD_BIN"]) / "envoy-standin",
        "pd-sidecar": Path(env["HISPARSE_LLMD_SIDECAR_BIN"]) / "pd-sidecar",
    }
    want = {k: v for k, v in want.items() if not only or k in only}
    missing = [str(p) for p in want.values() if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"llm-d binaries missing: {missing}; build them with e2e/tools/build.sh llmd llmd_sidecar",
                    pytrace=False)
    return want


def _manifest(namespace: str) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["routing"]["pdThresholdTokens"] = THRESHOLD_TOKENS
    return doc


def _pod_labels(objs: list[dict[str, Any]], role: str) -> dict[str, str]:
    """The labels of the rendered pod template of ``role`` (whatever workload kind carries it)."""
    found: list[dict[str, str]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            labels = node.get("metadata", {}).get("labels", {}) if "spec" in node and "metadata" in node else {}
            if labels.get(L.LLMD_ROLE) == role and "containers" in node.get("spec", {}):
                found.append(labels)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for o in objs:
        if o["kind"] in ("Deployment", "LeaderWorkerSet", "StatefulSet"):
            walk(o["spec"])
    assert found, f"no rendered pod template has {L.LLMD_ROLE}={role}"
    return found[0]


def _one(objs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(hits) == 1, f"expected one rendered {kind}*{name_suffix}, got {[o['metadata']['name'] for o in hits]}"
    return hits[0]


def _container(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
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
    assert out, f"no rendered container {name}"
    return out[0]


def _pod(name: str, namespace: str, labels: dict[str, str], node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "engine", "image": "hisparse.invalid/kwok-pod",
                            "ports": [{"containerPort": SERVICE_PORT}]}],
        },
    }


def _prompt(chars: int, seed: int) -> str:
    rnd = random.Random(seed)
    return "".join(rnd.choice(string.ascii_lowercase + " ") for _ in range(chars))


def _send(req: urllib.request.Request, *, timeout: float) -> tuple[int, str]:
    """(status, body) of ``req`` with no proxy; (0, the error) when nothing answers yet."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError) as e:  # not listening yet
        return 0, str(e)


@dataclass
class Stack:
    net: PodNet
    namespace: str
    model: str
    bins: dict[str, Path]
    ips: dict[str, str]
    servers: dict[str, CompletionsServer]
    logs: Path
    cluster: Cluster
    epp_argv: list[str]
    """The EPP as started: the rendered flags, with host paths for its config file and kubeconfig."""

    def via_envoy_standin(self, prompt: str, max_tokens: int = 4) -> dict[str, Any]:
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        argv = self.net.exec_argv(self.net.pods, [
            str(self.bins["envoy-standin"]), f"-epp=127.0.0.1:{EPP_GRPC_PORT}", f"-allow-cidr={POD_CIDR}",
            "-path=/v1/completions", "-timeout=30s",
        ])
        r = subprocess.run(argv, input=body, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"envoy-standin failed: {r.stderr}\nEPP log tail:\n{self.log_tail('epp')}"
        return json.loads(r.stdout)

    def direct_to_decode(self, prompt: str, prefiller: str, port: int = SERVICE_PORT) -> tuple[int, str]:
        """A request straight to the decode pod's sidecar on ``port`` (no EPP), naming ``prefiller``."""
        url = f"http://{self.ips['decode']}:{port}/v1/completions"
        data = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": 2}).encode()
        req = urllib.request.Request(url, data=data, headers={
            "Content-Type": "application/json", "x-prefiller-host-port": prefiller})
        return in_netns(self.net.pods, lambda: _send(req, timeout=20))

    def log_tail(self, name: str, n: int = 40) -> str:
        p = self.logs / f"{name}.log"
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else "(no log)"


def _generate(tag: int):
    return lambda prompt, n: [(sum(prompt) * 31 + tag + i) % 997 for i in range(n)]


@pytest.fixture(scope="module")
def llmd_cluster(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane of this module's own (no LeaderWorkerSet manager: bare pods are enough)."""
    c = Cluster.start(tmp_path_factory.mktemp("devcluster-llmd"), tools=tools)
    try:
        yield c
    finally:
        c.stop()
        left = c.leftover_processes()
        assert not left, f"processes survived teardown: {left}"


@pytest.fixture(scope="module")
def stack(llmd_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cluster = llmd_cluster
    bins = _bins()
    logs = tmp_path_factory.mktemp("llmd")
    namespace = "llmd-e2e"
    cluster.kubectl("create", "namespace", namespace)
    manifest = _manifest(namespace)
    objs = render(copy.deepcopy(manifest))
    model = manifest["spec"]["model"]["servedModelName"]

    # A KWOK node whose pods get IPs from POD_CIDR.
    node = nodes.gpu_node_manifest("llmd-node", GpuNodeSpec(), zone="zone-llmd", rack="rack-llmd")
    node["spec"]["podCIDR"] = POD_CIDR
    node["spec"]["podCIDRs"] = [POD_CIDR]
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(node))

    prefill_labels, decode_labels = _pod_labels(objs, "prefill"), _pod_labels(objs, "decode")
    pods = {
        "prefill": _pod("prefill-0", namespace, prefill_labels, "llmd-node"),
        "decode": _pod("decode-0", namespace, decode_labels, "llmd-node"),
        "other-prefill": _pod("other-build-prefill-0", namespace, {**prefill_labels, L.KV_COMPAT: OTHER_BUILD},
                              "llmd-node"),
        "other-decode": _pod("other-build-decode-0", namespace, {**decode_labels, L.KV_COMPAT: OTHER_BUILD},
                             "llmd-node"),
    }
    pool = _one(objs, "InferencePool")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([pool, *pods.values()]))

    def pod_ips() -> dict[str, str] | None:
        out: dict[str, str] = {}
        for key, p in pods.items():
            st = get_json(cluster, "pod", "-n", namespace, p["metadata"]["name"]).get("status", {})
            if not st.get("podIP"):
                return None
            if st["podIP"] in out.values():
                # KWOK's allocator has been seen handing one IP to two pods created in one apply; each pod
                # here must own its address (the test puts them on interfaces), so the later pod is made
                # again and gets another.
                cluster.kubectl("delete", "pod", "-n", namespace, p["metadata"]["name"], "--grace-period=0",
                                "--force", "--wait=true")
                cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(p))
                return None
            out[key] = st["podIP"]
        return out

    ips = eventually(pod_ips, what="KWOK pod IPs", timeout=90)
    assert all(ip.startswith("10.255.77.") for ip in ips.values()), ips
    api_port = int(cluster.server.rsplit(":", 1)[1])

    procs: list[subprocess.Popen[bytes]] = []
    servers: dict[str, CompletionsServer] = {}
    decode = _container(objs, "routing-proxy")
    vllm_port = int(next(a for a in decode["args"] if a.startswith("-vllm-port=")).split("=", 1)[1])
    with pod_net("l1") as net:
        net.up([ips["prefill"], ips["other-prefill"], ips["other-decode"]], [ips["decode"]], 24, api_port)
        try:
            for i, key in enumerate(("prefill", "other-prefill", "other-decode")):
                servers[key] = in_netns(net.pods, lambda ip=ips[key], i=i: CompletionsServer(
                    _generate(i), model=model, host=ip, port=SERVICE_PORT)).start()
            servers["decode-engine"] = in_netns(net.decode, lambda: CompletionsServer(
                _generate(9), model=model, host="127.0.0.1", port=vllm_port)).start()

            # The EPP: rendered flags and config; the config file and kubeconfig at host paths.
            epp_container = _container(objs, "epp")
            config = logs / EPP_CONFIG_FILE
            config.write_text(_one(objs, "ConfigMap", "-epp")["data"][EPP_CONFIG_FILE])
            epp_args = [f"{config}" if a == f"/config/{EPP_CONFIG_FILE}" else a for a in epp_container["args"]]
            epp_argv = [str(bins["epp"]), *epp_args, f"--kubeconfig={cluster.kubeconfig}"]
            procs.append(_spawn(net, net.pods, epp_argv, logs / "epp.log", {}))
            # The sidecar: rendered args and env (the namespace from the downward API, resolved).
            env = {e["name"]: e.get("value", namespace) for e in decode.get("env", [])}
            procs.append(_spawn(net, net.decode, [str(bins["pd-sidecar"]), *decode["args"]], logs / "sidecar.log",
                                {**env, "KUBECONFIG": str(cluster.kubeconfig)}))
            # The same sidecar release with its SSRF guard on (what ssrfProtection: true would render),
            # on another port of the decode pod, to show why the API refuses that setting.
            guarded = [a for a in decode["args"] if not a.startswith("-port=")]
            guarded += [f"-port={GUARDED_PORT}", "-enable-ssrf-protection=true", "-pool-group=inference.networking.k8s.io"]
            procs.append(_spawn(net, net.decode, [str(bins["pd-sidecar"]), *guarded], logs / "sidecar-guarded.log",
                                {"INFERENCE_POOL_NAME": pool["metadata"]["name"], "INFERENCE_POOL_NAMESPACE": namespace,
                                 "KUBECONFIG": str(cluster.kubeconfig)}))
            st = Stack(net, namespace, model, bins, ips, servers, logs, cluster, epp_argv)

            # Ready when the sidecar's guard knows the pool's prefill pod and the EPP routes.
            eventually(lambda: st.direct_to_decode("warm up", f"{ips['prefill']}:{SERVICE_PORT}")[0] == 200 or None,
                       what=f"the sidecar allowing the pool's prefiller (log: {st.log_tail('sidecar')})", timeout=90)

            def routed() -> bool | None:
                try:
                    return st.via_envoy_standin("warm", 1)["status"] == 200 or None
                except AssertionError:
                    return None

            eventually(routed, what="the EPP routing a request", timeout=120)
            for s in servers.values():
                s._server.bodies.clear()  # noqa: SLF001 - start the tests from a clean record
            yield st
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            for s in servers.values():
                s.close()
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
            cluster.kubectl("delete", "node", "llmd-node", "--wait=false", check=False)


def _spawn(net: PodNet, ns: str, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    f = log.open("wb")
    full = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return subprocess.Popen(net.exec_argv(ns, argv), stdout=f, stderr=subprocess.STDOUT, env={**full, **env},
                            start_new_session=True)


CLOSED_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def _variants() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") == "HiSparseDeployment":
            out.append((path.stem, doc))
            if doc["spec"].get("prefill") is not None:
                decode_only = copy.deepcopy(doc)
                decode_only["spec"].pop("prefill")
                decode_only["spec"].get("kvTransfer", {}).pop("mooncake", None)
                out.append((f"{path.stem}-decode-only", decode_only))
    return out


@pytest.mark.parametrize(("name", "doc"), _variants(), ids=[n for n, _ in _variants()])
def test_epp_loads_the_rendered_config(name: str, doc: dict[str, Any], tmp_path: Path) -> None:
    """The real EPP's own strict config loader accepts what we render (it then stops: the kubeconfig
    points at a closed port). The config llm-d v0.4.0 cannot read (another group) fails here."""
    bins = _bins("epp")
    config = tmp_path / EPP_CONFIG_FILE
    config.write_text(_one(render(doc), "ConfigMap", "-epp")["data"][EPP_CONFIG_FILE])
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(CLOSED_KUBECONFIG)
    r = subprocess.run([str(bins["epp"]), "--pool-name=p", "--pool-namespace=n", f"--config-file={config}",
                        f"--kubeconfig={kubeconfig}", f"--grpc-port={free_port()}", f"--grpc-health-port={free_port()}",
                        f"--metrics-port={free_port()}"], capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert "loaded configuration from file/text successfully" in out, out[-3000:]
    assert "127.0.0.1:1" in out  # it got as far as the apiserver


def _module_dir(module: str, version: str) -> Path:
    r = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True,
                       timeout=300, cwd=REPO / "e2e" / "tools" / "llmd")
    assert r.returncode == 0, r.stdout + r.stderr
    return Path(json.loads(r.stdout)["Dir"])


def _source(root: Path, *dirs: str) -> str:
    return "\n".join(p.read_text() for d in dirs for p in sorted((root / d).rglob("*.go"))
                     if not p.name.endswith("_test.go"))


@pytest.mark.parametrize("version", sorted(llmd.RELEASES))
def test_release_table_matches_the_modules_source(version: str) -> None:
    """Each row of the release table, checked against that release's own source (and its GIE's)."""
    rel = llmd.release(version)
    root = _module_dir("github.com/llm-d/llm-d-inference-scheduler", version)
    assert f"sigs.k8s.io/gateway-api-inference-extension {rel.gie_version}" in (root / "go.mod").read_text()
    plugins = _source(root, "pkg/plugins")
    assert f'PdProfileHandlerType = "{rel.pd_profile_handler}"' in plugins
    assert f'PrefillHeaderHandlerType = "{rel.prefill_header_plugin}"' in plugins
    assert ('json:"prefixPluginType"' in plugins) == rel.pd_handler_prefix_type_param
    for t in ("decode-filter", "prefill-filter"):
        assert f'= "{t}"' in plugins
    sidecar = _source(root, "cmd/pd-sidecar", "pkg/sidecar")
    assert ('"pool-group"' in sidecar) == rel.sidecar_pool_group_flag
    assert "promhttp" not in sidecar and '"/metrics"' not in sidecar  # no metrics to scrape (docs/guides/monitoring.md)
    group, _, ver = rel.sidecar_ssrf_pool_api.partition("/")
    assert f'"{group}"' in sidecar and (not rel.sidecar_pool_group_flag or f'"{ver}"' in sidecar)

    gie = _module_dir("sigs.k8s.io/gateway-api-inference-extension", rel.gie_version)
    register = (gie / "apix/config/v1alpha1/zz_generated.register.go").read_text()
    assert f'GroupName = "{rel.epp_config_api.split("/")[0]}"' in register
    controllers = _source(gie, "pkg/epp/controller")
    kinds = {"inferenceobjectives": "InferenceObjective", "inferencemodelrewrites": "InferenceModelRewrite"}
    for resource, kind in kinds.items():
        assert (f"For(&v1alpha2.{kind}{{}})" in controllers) == (resource in rel.epp_watched_x_resources)
    runner = _source(gie, "cmd/epp", "pkg/epp/server")
    assert f'"{rel.epp_kv_cache_metric_default}"' in runner
    assert '"metrics-endpoint-auth"' in runner  # rendered explicitly: the runner's default is true
    for builtin in ("prefix-cache-scorer", "queue-scorer", "max-score-picker", "single-profile-handler"):
        assert f'"{builtin}"' in _source(gie, "pkg/epp/scheduling")


def _completions(server: CompletionsServer) -> list[dict[str, Any]]:
    return [b for b in server.bodies if isinstance(b, dict) and "prompt" in b]


def test_long_prompt_is_disaggregated(stack: Stack) -> None:
    threshold = llmd.threshold_chars(THRESHOLD_TOKENS)
    prompt = _prompt(threshold + 300, seed=1)
    res = stack.via_envoy_standin(prompt, max_tokens=5)
    assert res["status"] == 200, res
    assert res["destination"] == f"{stack.ips['decode']}:{SERVICE_PORT}"
    assert res["headers"].get("x-prefiller-host-port") == f"{stack.ips['prefill']}:{SERVICE_PORT}", res["headers"]
    # The sidecar sent the prefill (max_tokens 1, a remote decode) to the prefill pod...
    (pre,) = [b for b in _completions(stack.servers["prefill"]) if b["prompt"] == prompt]
    assert pre["max_tokens"] == 1 and pre["kv_transfer_params"]["do_remote_decode"] is True
    # ...and handed the prefill's kv_transfer_params to its decode engine with the original max_tokens.
    (dec,) = [b for b in _completions(stack.servers["decode-engine"]) if b["prompt"] == prompt]
    assert dec["max_tokens"] == 5
    kv = dec["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True
    assert kv["remote_engine_id"] == stack.servers["prefill"]._server.engine_id  # noqa: SLF001
    assert kv["remote_host"] == stack.ips["prefill"]
    assert res["body"]["choices"][0]["text"], res["body"]


def test_short_prompt_prefills_on_decode(stack: Stack) -> None:
    threshold = llmd.threshold_chars(THRESHOLD_TOKENS)
    prompt = _prompt(threshold - 100, seed=2)
    before = len(_completions(stack.servers["prefill"]))
    res = stack.via_envoy_standin(prompt, max_tokens=3)
    assert res["status"] == 200, res
    assert res["destination"] == f"{stack.ips['decode']}:{SERVICE_PORT}"
    assert "x-prefiller-host-port" not in res["headers"], res["headers"]
    assert len(_completions(stack.servers["prefill"])) == before
    (dec,) = [b for b in _completions(stack.servers["decode-engine"]) if b["prompt"] == prompt]
    assert "kv_transfer_params" not in dec and dec["max_tokens"] == 3


def test_other_kv_build_is_never_picked(stack: Stack) -> None:
    picked = set()
    for i in range(8):
        chars = llmd.threshold_chars(THRESHOLD_TOKENS) + (300 if i % 2 else -100)
        res = stack.via_envoy_standin(_prompt(chars, seed=100 + i), max_tokens=2)
        assert res["status"] == 200, res
        picked.add(res["destination"])
        picked.add(res["headers"].get("x-prefiller-host-port", ""))
    others = {f"{stack.ips[k]}:{SERVICE_PORT}" for k in ("other-prefill", "other-decode")}
    assert not picked & others, picked
    assert f"{stack.ips['prefill']}:{SERVICE_PORT}" in picked  # the run did disaggregate
    assert stack.servers["other-prefill"].requests == 0
    assert stack.servers["other-decode"].requests == 0


def test_ssrf_guard_of_the_served_sidecar_refuses_every_prefiller(stack: Stack) -> None:
    """Why ``ssrfProtection`` is refused: the guard of sidecar v0.5.1, watching the rendered v1 pool,
    refuses a prefiller outside the pool, and the pool's own prefiller too (it reads the v1 selector
    as a flat label map). Should a release fix it, this fails and the setting can be allowed."""
    outside = f"{stack.ips['other-prefill']}:{SERVICE_PORT}"
    inside = f"{stack.ips['prefill']}:{SERVICE_PORT}"

    def up() -> bool | None:
        return stack.direct_to_decode("probe", outside, GUARDED_PORT)[0] != 0 or None

    eventually(up, what="the guarded sidecar listening", timeout=60)
    time.sleep(5)  # the guard's pool informer has synced (it logs the pool within a second)
    before = stack.servers["other-prefill"].requests
    code, text = stack.direct_to_decode(_prompt(400, seed=7), outside, GUARDED_PORT)
    assert code == 403 and "SSRF" in text, (code, text)
    assert stack.servers["other-prefill"].requests == before
    code, text = stack.direct_to_decode(_prompt(400, seed=8), inside, GUARDED_PORT)
    assert code == 403 and "SSRF" in text, (code, text)
    log = (stack.logs / "sidecar-guarded.log").read_text(errors="replace")
    assert "map[llm-d.ai/inference-serving:true" in log  # the v1 selector read as labels
    # The unguarded sidecar the render runs sends the same request through.
    assert stack.direct_to_decode(_prompt(400, seed=9), inside)[0] == 200


def _scrape(stack: Stack, port: int, token: str | None = None) -> tuple[int, str]:
    """GET the EPP's /metrics from its pod's network, as Prometheus does (with ``token`` as its bearer)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    return in_netns(stack.net.pods, lambda: _send(req, timeout=10))


def test_epp_metrics_answer_the_rendered_scrape(stack: Stack) -> None:
    """Without ``spec.monitoring.eppMetricsAuth`` the rendered PodMonitor scrapes the EPP with no
    credential, so the EPP is rendered with ``--metrics-endpoint-auth=false`` (GIE's runner would
    otherwise answer that scrape 401); it serves its own series and the pool's."""
    assert "--metrics-endpoint-auth=false" in stack.epp_argv
    code, text = _scrape(stack, EPP_METRICS_PORT)
    assert code == 200, (code, text[:300])
    assert "inference_extension_info" in text
    assert "inference_pool_per_pod_queue_size" in text, text[-1500:]


def test_every_epp_metric_the_dashboard_names_is_in_the_epp_s_exposition(stack: Stack) -> None:
    """The EPP's metrics an alert, panel or dashboard variable selects (``EPP_METRIC_PREFIXES``) are samples
    of the real EPP's ``/metrics``, read with prometheus_client's parser, once it has scheduled a long
    (prefill-decode) and a short (decode-only) request."""
    threshold = llmd.threshold_chars(THRESHOLD_TOKENS)
    for prompt in (_prompt(threshold + 300, seed=11), _prompt(threshold - 100, seed=12)):
        assert stack.via_envoy_standin(prompt, max_tokens=2)["status"] == 200
    code, text = _scrape(stack, EPP_METRICS_PORT)
    assert code == 200, (code, text[:300])
    families = list(text_string_to_metric_families(text))
    seen = {s.name for f in families for s in f.samples}
    decisions = {s.labels.get("decision_type") for f in families for s in f.samples
                 if s.name == "llm_d_inference_scheduler_pd_decision_total"}
    assert {"prefill-decode", "decode-only"} <= decisions, decisions
    named = {n: sorted(w) for n, w in monitoring_exprs.named_metrics().items()
             if n.startswith(monitoring_exprs.EPP_METRIC_PREFIXES)}
    assert named, "no alert or panel names an EPP metric"
    missing = {n: w for n, w in named.items() if n not in seen}
    assert not missing, f"named, but not in the EPP's exposition: {missing}"


def test_epp_with_metrics_auth_admits_only_a_token_allowed_to_read_metrics(stack: Stack) -> None:
    """``eppMetricsAuth`` set: the same EPP release, flags and pool with ``--metrics-endpoint-auth=true``
    (here on ports of its own beside the first). A scrape with no token is refused, and so is the token of
    a ServiceAccount without the grant; the token of one bound to a ClusterRole allowing ``get`` on
    ``/metrics`` (what the PodMonitor's Secret must hold) is admitted. The EPP checks each with a real
    TokenReview and SubjectAccessReview against the control plane."""
    from hisparse_operator.render.routing import EPP_HEALTH_PORT

    ports = {"--grpc-port": 9302, "--grpc-health-port": 9303, "--metrics-port": 9390}
    assert EPP_HEALTH_PORT not in ports.values() and EPP_METRICS_PORT not in ports.values()
    argv, it = [], iter(stack.epp_argv)
    for a in it:
        if a in ports:
            argv += [a, str(ports[a])]
            next(it)
        elif a.startswith("--metrics-endpoint-auth="):
            argv.append("--metrics-endpoint-auth=true")
        else:
            argv.append(a)
    assert "--metrics-endpoint-auth=true" in argv and "9390" in argv, argv
    c, ns = stack.cluster, stack.namespace
    reader, other = "epp-metrics-reader", "no-metrics"
    c.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": reader, "namespace": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": other, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": f"{ns}-metrics-reader"},
         "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": f"{ns}-metrics-reader"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{ns}-metrics-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": reader, "namespace": ns}]},
    ])
    proc = _spawn(stack.net, stack.net.pods, argv, stack.logs / "epp-auth.log", {})
    try:
        tokens = {sa: c.kubectl("create", "token", sa, "-n", ns, "--duration=10m").stdout.strip() for sa in (reader, other)}
        eventually(lambda: _scrape(stack, 9390)[0] != 0 or None, what=f"the second EPP's metrics port "
                   f"(log: {stack.log_tail('epp-auth')})", timeout=60)
        assert _scrape(stack, 9390)[0] == 401
        # controller-runtime's filter answers 500 when the TokenReview says the token is not one.
        code, text = _scrape(stack, 9390, "not-a-token")
        assert code in (401, 500) and "inference_extension_info" not in text, (code, text[:300])
        assert _scrape(stack, 9390, tokens[other])[0] == 403
        code, text = _scrape(stack, 9390, tokens[reader])
        assert code == 200 and "inference_extension_info" in text, (code, text[:300])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        c.kubectl("delete", "clusterrolebinding,clusterrole", f"{ns}-metrics-reader", "--ignore-not-found", check=False)
