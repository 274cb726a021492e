"""The harness's own pieces, without a cluster: manifests, PKI, processes, state, tools."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hisparse_devcluster import (
    SERVICE_CIDR,
    GpuNodeSpec,
    Tools,
    ToolsNotBuiltError,
    _components,
    _procs,
    versions,
)
from hisparse_operator.pki import Pki
from hisparse_devcluster._state import ClusterState
from hisparse_devcluster.cluster import _lws_webhook_configurations
from hisparse_devcluster.nodes import (
    GPU_RESOURCE,
    KWOK_ANNOTATION,
    RACK_LABEL,
    ZONE_LABEL,
    gpu_node_manifest,
    placement,
)


def test_gpu_node_manifest_capacity_and_allocatable() -> None:
    spec = GpuNodeSpec(hugepages_1gi="64Gi", labels={"pool": "decode"})
    node = gpu_node_manifest("gpu-node-007", spec, zone="zone-b", rack="rack-01")
    cap, alloc = node["status"]["capacity"], node["status"]["allocatable"]
    assert cap[GPU_RESOURCE] == alloc[GPU_RESOURCE] == "8"
    assert cap["memory"] == "2Ti"
    assert alloc["memory"] == "1968Gi"  # 2048 - 16 reserved - 64 hugepages
    assert alloc["cpu"] == "222000m"
    meta = node["metadata"]
    assert meta["annotations"][KWOK_ANNOTATION[0]] == KWOK_ANNOTATION[1]
    assert meta["labels"][ZONE_LABEL] == "zone-b" and meta["labels"][RACK_LABEL] == "rack-01"
    assert meta["labels"]["pool"] == "decode"
    assert "taints" not in node["spec"]


def test_each_model_cache_claim_gets_a_volume_bound_to_it_on_kwok_nodes_only() -> None:
    import yaml
    from hisparse_devcluster import storage
    from hisparse_operator.render import render

    examples = Path(__file__).resolve().parents[2] / "examples"
    doc = yaml.safe_load((examples / "hisparse-deployment.yaml").read_text())
    (claim,) = [o for o in render(doc) if o["kind"] == "PersistentVolumeClaim"]
    (pv,) = storage.model_cache_volumes(doc)
    spec = pv["spec"]
    assert spec["claimRef"] == {"namespace": "inference", "name": claim["metadata"]["name"]}
    assert spec["capacity"]["storage"] == claim["spec"]["resources"]["requests"]["storage"]
    assert spec["accessModes"] == claim["spec"]["accessModes"] == ["ReadWriteMany"]
    term = spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert (term["key"], term["values"]) == ("type", ["kwok"])
    pod_ephemeral = yaml.safe_load((examples / "deepseek-v32-single-node.yaml").read_text())
    assert storage.model_cache_volumes(pod_ephemeral) == [], "a PodEphemeral cache has no claim"


def test_placement_fills_racks_and_alternates_zones() -> None:
    got = [placement(i, ("a", "b"), 2) for i in range(5)]
    assert got == [("a", "rack-00"), ("a", "rack-00"), ("b", "rack-01"), ("b", "rack-01"),
                   ("a", "rack-02")]
    with pytest.raises(ValueError):
        placement(0, (), 1)


def test_memory_reservation_larger_than_node_is_refused() -> None:
    with pytest.raises(ValueError, match="no allocatable memory"):
        gpu_node_manifest("n", GpuNodeSpec(memory="8Gi", reserved_memory="16Gi"), zone="z", rack="r")


def test_pki_issues_server_and_client_certs(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    ca = x509.load_pem_x509_certificate(pki.ca.cert.read_bytes())
    server = pki.issue("srv", "kube-apiserver", server_ips=("127.0.0.1",))
    admin = pki.issue("adm", "admin", organizations=("system:masters",), client=True)
    s = x509.load_pem_x509_certificate(server.cert.read_bytes())
    a = x509.load_pem_x509_certificate(admin.cert.read_bytes())
    s.verify_directly_issued_by(ca)
    a.verify_directly_issued_by(ca)
    sans = s.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    eku = a.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    orgs = [n.value for n in a.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters"]
    assert admin.key.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValueError):
        pki.issue("nothing", "x")


def test_spawned_process_group_is_stopped_completely(tmp_path: Path) -> None:
    # A shell that leaves a grandchild in its group: stop must end both.
    rec, child = _procs.spawn("sh", ["sh", "-c", "sleep 300 & sleep 300"], tmp_path / "sh.log",
                              tie_to_parent=True)
    assert _procs.is_running(rec)
    _procs.stop(rec, grace_s=5, reap=child.poll)
    assert not _procs.is_running(rec)
    assert _procs.group_members(rec.pid) == []
    assert child.returncode is not None


def test_process_record_rejects_reused_pid(tmp_path: Path) -> None:
    rec, child = _procs.spawn("sleep", ["sleep", "300"], tmp_path / "s.log", tie_to_parent=True)
    impostor = _procs.ProcRecord(rec.name, rec.pid, rec.start_ticks + 1, rec.argv, rec.log)
    assert not _procs.is_running(impostor)
    _procs.stop(impostor)  # must not signal a process it cannot prove is its own
    assert _procs.is_running(rec)
    _procs.stop(rec, reap=child.poll)


def test_state_round_trips(tmp_path: Path) -> None:
    rec, child = _procs.spawn("sleep", ["sleep", "300"], tmp_path / "s.log", tie_to_parent=True)
    try:
        st = ClusterState(workdir=tmp_path, server="https://127.0.0.1:1", kubeconfig="k",
                          ports={"apiserver": 1}, tools={"kubectl": "/bin/true"})
        st.record(rec)
        loaded = ClusterState.load(tmp_path)
        assert loaded is not None
        assert loaded.processes == [rec] and loaded.ports == {"apiserver": 1}
    finally:
        _procs.stop(rec, reap=child.poll)


def test_missing_binaries_fail_with_build_instructions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for family in ("KUBERNETES", "ETCD", "KWOK", "HELM", "LWS"):
        monkeypatch.setenv(f"HISPARSE_{family}_BIN", str(tmp_path))
    with pytest.raises(ToolsNotBuiltError, match="e2e/tools/build.sh") as err:
        Tools.locate()
    assert "kube-apiserver" in str(err.value) and "etcd" in str(err.value)


def test_build_script_prints_bin_dirs() -> None:
    script = Path(__file__).resolve().parents[1] / "tools" / "build.sh"
    out = subprocess.run(["bash", str(script), "--print-env"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    env = dict(line.split("=", 1) for line in out.splitlines())
    assert set(env) == {"HISPARSE_KUBERNETES_BIN", "HISPARSE_ETCD_BIN", "HISPARSE_KWOK_BIN",
                        "HISPARSE_HELM_BIN", "HISPARSE_LWS_BIN", "HISPARSE_COREDNS_BIN", "HISPARSE_LLMD_BIN",
                        "HISPARSE_LLMD_SIDECAR_BIN", "HISPARSE_PROMETHEUS_BIN", "HISPARSE_PROMETHEUS_OPERATOR_BIN",
                        "HISPARSE_KUBE_ROUTER_BIN", "HISPARSE_TOOLS_PATH"}
    path = env.pop("HISPARSE_TOOLS_PATH").split(":")
    assert sorted(path) == sorted(env.values()) and len(set(path)) == len(path), path


def test_build_script_builds_families_side_by_side_and_names_each_failure(tmp_path: Path) -> None:
    """Two lanes: each family's output comes whole, into its own versioned dir; a failed family stops no
    other, and the end names every failure. (A bad GOFLAGS fails each go build at once, so nothing compiles.)"""
    script = Path(__file__).resolve().parents[1] / "tools" / "build.sh"
    killed = tmp_path / "tools" / f".go-build.{2**22 + 1}"  # a Go cache of a run whose pid cannot exist
    killed.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "GOCACHE"}
    res = subprocess.run(["bash", str(script), "etcd", "helm", "lws"], capture_output=True, text=True, timeout=120,
                         env={**env, "HISPARSE_CACHE": str(tmp_path), "GOFLAGS": "-no-such-flag"})
    assert not list((tmp_path / "tools").glob(".go-build.*")), "a run leaves its Go cache, or a killed run's"
    assert res.returncode == 1, res
    assert "failed to build: etcd helm lws" in res.stderr, res.stderr
    blocks = re.findall(r"^(\w+): building into (\S+)\n  go build (\S+) -> (\S+)\ngo: parsing \$GOFLAGS",
                        res.stdout + res.stderr, flags=re.M)
    got = {family: (Path(d).parent.name.rpartition("-")[0], pkg.split("/")[0], binary)
           for family, d, pkg, binary in blocks}
    assert got == {"etcd": ("etcd", "go.etcd.io", "etcd"), "helm": ("helm", "helm.sh", "helm"),
                   "lws": ("lws", "sigs.k8s.io", "lws-manager")}, res.stdout + res.stderr
    # All three at once, asked for in another order: the lanes end in any order, the message is in build order.
    res = subprocess.run(["bash", str(script), "lws", "helm", "etcd"], capture_output=True, text=True, timeout=120,
                         env={**env, "HISPARSE_CACHE": str(tmp_path), "GOFLAGS": "-no-such-flag",
                              "HISPARSE_BUILD_LANES": "3"})
    assert res.returncode == 1 and "failed to build: etcd helm lws " in res.stderr, res.stderr


def test_build_script_checks_named_families_only() -> None:
    script = Path(__file__).resolve().parents[1] / "tools" / "build.sh"
    res = subprocess.run(["bash", str(script), "--check", "no-such-family"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1 and "unknown family 'no-such-family'" in res.stderr
    assert "kubernetes" in res.stderr and "coredns" in res.stderr


@pytest.mark.parametrize(("moddir", "module", "version"), [
    ("k8s", "k8s.io/kubernetes", versions.KUBERNETES_VERSION),
    ("etcd", "go.etcd.io/etcd/server/v3", versions.ETCD_VERSION),
    ("kwok", "sigs.k8s.io/kwok", versions.KWOK_VERSION),
    ("helm", "helm.sh/helm/v3", versions.HELM_VERSION),
    ("lws", "sigs.k8s.io/lws", versions.LWS_VERSION),
    ("coredns", "github.com/coredns/coredns", versions.COREDNS_VERSION),
    ("prometheus-operator", "github.com/prometheus-operator/prometheus-operator", versions.PROMETHEUS_OPERATOR_VERSION),
    ("prometheus", "github.com/prometheus/prometheus", versions.PROMETHEUS_MODULE_VERSION),
])
def test_versions_module_matches_tools_modules(moddir: str, module: str, version: str) -> None:
    gomod = (Path(__file__).resolve().parents[1] / "tools" / moddir / "go.mod").read_text()
    pins = {f[0]: f[1] for f in (line.split() for line in gomod.splitlines()) if len(f) >= 2}
    assert pins.get(module) == version


def test_kubernetes_staging_modules_use_published_twins() -> None:
    gomod = (Path(__file__).resolve().parents[1] / "tools" / "k8s" / "go.mod").read_text()
    # Kubernetes v1.N.M publishes its staging modules as v0.N.M.
    twin = "v0." + versions.KUBERNETES_VERSION.split(".", 1)[1]
    replaces = [line.split() for line in gomod.splitlines() if line.startswith("replace ")]
    assert len(replaces) >= 30
    for _, src, arrow, dst, ver in replaces:
        assert (arrow, dst, ver) == ("=>", src, twin)


def test_component_flags_use_loopback_rbac_and_files_that_exist(tmp_path: Path) -> None:
    tools = Tools(*(Path(f"/opt/bin/{n}") for n in (
        "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd", "kwok",
        "helm", "lws-manager")))
    layout = _components.Layout(tmp_path)
    ports = _components.Ports(*range(20001, 20001 + len(_components.Ports.names())))
    _components.make_credentials(layout, "https://127.0.0.1:20003")
    argvs = {f.__name__: f(tools, layout, ports) for f in (
        _components.etcd, _components.kube_apiserver, _components.kube_controller_manager,
        _components.kube_scheduler, _components.kwok, _components.lws_manager)}

    for name, argv in argvs.items():
        flags = {k: v for k, _, v in (a.removeprefix("--").partition("=") for a in argv[1:])}
        for key, value in flags.items():
            if key.endswith(("-urls", "address", "-ip", "etcd-servers")):
                assert "127.0.0.1" in value and "0.0.0.0" not in value, (name, key, value)
            if value.startswith(str(tmp_path)) and value.endswith((".crt", ".key", ".pub",
                                                                  ".kubeconfig")):
                assert Path(value).is_file(), (name, key, value)
    api = {k: v for k, _, v in (a.removeprefix("--").partition("=") for a in argvs["kube_apiserver"][1:])}
    assert api["authorization-mode"] == "RBAC"
    assert api["allow-privileged"] == "true"
    assert api["service-cluster-ip-range"] == SERVICE_CIDR
    assert "--unsafe-no-fsync" in argvs["etcd"]
    assert "--manage-all-nodes=false" in argvs["kwok"]
    assert "--leader-elect=false" in argvs["kube_controller_manager"]
    # Node liveness through Leases, as kubelets do (not rare node status writes).
    lease_s = int(next(a for a in argvs["kwok"] if a.startswith("--node-lease-duration-seconds="))
                  .partition("=")[2])
    grace = next(a for a in argvs["kube_controller_manager"] if a.startswith("--node-monitor-grace-period="))
    # Several renewals (every lease_s / 4) may be missed before a node counts as unhealthy.
    assert lease_s > 0 and int(grace.partition("=")[2].removesuffix("s")) >= lease_s
    # Client limits raised above the defaults (20/30 and 50/100), which paced bursts of hundreds of objects.
    kcm = {k: v for k, _, v in (a.removeprefix("--").partition("=") for a in argvs["kube_controller_manager"][1:])}
    sched = {k: v for k, _, v in (a.removeprefix("--").partition("=") for a in argvs["kube_scheduler"][1:])}
    assert float(kcm["kube-api-qps"]) == _components.CONTROLLER_MANAGER_API_QPS > 20
    assert int(kcm["kube-api-burst"]) == _components.CONTROLLER_MANAGER_API_BURST > 30
    assert float(sched["kube-api-qps"]) == _components.SCHEDULER_API_QPS > 50
    assert int(sched["kube-api-burst"]) == _components.SCHEDULER_API_BURST > 100
    assert int(kcm["concurrent-deployment-syncs"]) == _components.CONTROLLER_MANAGER_CONCURRENT_SYNCS
    lws = _components.lws_configuration(layout, ports)
    assert lws["webhook"]["host"] == "127.0.0.1" and lws["webhook"]["port"] == ports.lws_webhook
    assert {p.name for p in Path(lws["webhook"]["certDir"]).iterdir()} == {"tls.crt", "tls.key"}
    assert lws["health"]["healthProbeBindAddress"] == f"127.0.0.1:{ports.lws_health}"
    assert lws["internalCertManagement"] == {"enable": False}
    assert lws["leaderElection"] == {"leaderElect": False}


def test_lws_webhooks_are_upstreams_on_loopback() -> None:
    ports = _components.Ports(*range(20001, 20001 + len(_components.Ports.names())))
    configs = _lws_webhook_configurations(ports)
    hooks = {h["name"]: h for c in configs for h in c["webhooks"]}
    assert {c["metadata"]["name"] for c in configs} == {
        "lws-mutating-webhook-configuration", "lws-validating-webhook-configuration"}
    assert {"mleaderworkerset.kb.io", "mpod.kb.io", "vleaderworkerset.kb.io", "vpod.kb.io"} <= set(hooks)
    for hook in hooks.values():
        assert hook["clientConfig"]["url"].startswith(f"https://127.0.0.1:{ports.lws_webhook}/")
    # Upstream's kustomize patches limit the pod webhooks to LWS pods; other pods never wait on them.
    for name in ("mpod.kb.io", "vpod.kb.io"):
        assert hooks[name]["objectSelector"]["matchExpressions"][0]["key"] == "leaderworkerset.sigs.k8s.io/name"


def test_the_cpu_example_model_comes_from_the_hub_stand_in_it_names(tmp_path: Path) -> None:
    """The example's ``model.endpoint`` is the stand-in's Service, which serves the example's repository
    with its revision resolving to the checkpoint's commit; another checkpoint is another commit."""
    from hisparse_devcluster import cpu_example
    from hisparse_devcluster.realnode import NODE_LABEL

    doc = cpu_example.example_doc()
    model = doc["spec"]["model"]
    assert model["endpoint"] == f"http://{cpu_example.HUB_NAME}:{cpu_example.HUB_PORT}"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text("{}")
    commit = cpu_example.hub_commit(tmp_path / "a")
    assert len(commit) == 40 and int(commit, 16) >= 0
    (tmp_path / "a" / "config.json").write_text('{"x": 1}')
    assert cpu_example.hub_commit(tmp_path / "a") != commit
    deployment, service = cpu_example.hub_objects(doc, "ns", tmp_path / "a", commit, "img")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--repo") + 1] == model["source"].removeprefix("hf://")
    assert f"{model['revision']}={commit}" in args and f"{commit}=/hub/{commit}" in args
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == dict([NODE_LABEL])
    assert (service["metadata"]["name"], service["spec"]["ports"][0]["port"]) == (cpu_example.HUB_NAME, cpu_example.HUB_PORT)


def test_one_binary_is_found_alone_and_refused_for_another_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """locate_binary (the chart tests' Helm) finds one binary through build.sh, and refuses a dir that
    build.sh named for another version than versions.py's, as Tools.locate does."""
    from hisparse_devcluster import _tools, locate_binary

    helm = locate_binary("helm", "helm")
    assert helm.name == "helm" and helm.parent.parent.name == f"helm-{_tools._FAMILIES['helm'][1]}"
    monkeypatch.setitem(_tools._FAMILIES, "helm", (("helm",), "v0.0.1"))
    with pytest.raises(ToolsNotBuiltError, match="is not for v0.0.1"):
        locate_binary("helm", "helm")
    with pytest.raises(ToolsNotBuiltError, match="is not built"):
        locate_binary("llmd", "no-such-binary")


def test_pushed_references_tag_the_project_s_images_and_keep_upstream_versions() -> None:
    from hisparse_devcluster.images import BuiltImage
    from hisparse_devcluster.images.push import target

    def built(name: str, ref: str) -> BuiltImage:
        return BuiltImage(name, ref, "/a.tar", "h", 1, 0.0, 0.0, "t")

    assert target(built("hisparse-operator", "localhost/hisparse-operator:6a0df15895d402ee"), "r.example/x/", "0.1.0") \
        == "r.example/x/hisparse-operator:0.1.0"
    assert target(built("llm-d-epp", "localhost/llm-d-epp:v0.4.0"), "127.0.0.1:5000/inf", "0.1.0") \
        == "127.0.0.1:5000/inf/llm-d-epp:v0.4.0"


@pytest.mark.parametrize(("registry", "tag", "says"), [
    ("https://r.example/x", "0.1.0", "no scheme"), ("r.example/x:1", "0.1.0", "not host[:port][/path]"),
    ("r.example/x", "-bad", "not a valid image tag"), ("r.example/x", "a" * 129, "not a valid image tag")])
def test_a_push_target_that_is_not_a_registry_or_tag_is_refused_before_anything_runs(
        registry: str, tag: str, says: str, tmp_path: Path) -> None:
    from hisparse_devcluster.images import BuiltImage, ImageError, push

    missing = BuiltImage("hisparse-operator", "localhost/hisparse-operator:h", str(tmp_path / "none.tar"), "h", 1, 0, 0, "t")
    with pytest.raises(ImageError, match=re.escape(says)):
        push({"hisparse-operator": missing}, registry, tag=tag)


def test_the_registry_keeps_its_address_for_its_storage(tmp_path: Path) -> None:
    from hisparse_devcluster.registry import PORT_RANGE, LoopbackRegistry

    a, b = LoopbackRegistry(tmp_path / "a", storage=tmp_path / "s"), LoopbackRegistry(tmp_path / "b", storage=tmp_path / "s")
    assert a.host == b.host and PORT_RANGE[0] <= a.port < PORT_RANGE[1]


def test_the_cli_refuses_a_bad_push_target_before_building_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from hisparse_devcluster import images
    from hisparse_operator.cli import app

    built: list[object] = []
    monkeypatch.setattr(images, "ensure", lambda *a, **k: built.append(a) or {})
    res = CliRunner().invoke(app, ["dev", "images", "--only", "operator", "--push", "https://r.example/x"])
    assert res.exit_code != 0 and "no scheme" in res.output, res.output
    assert not built, "an image was built for a push that could not happen"
    res = CliRunner().invoke(app, ["dev", "images", "--only", "operator", "--push", "r.example/x"])
    assert res.exit_code == 0 and built, res.output  # a valid target goes on to the build (nothing to push here)
