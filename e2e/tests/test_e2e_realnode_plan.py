"""The real node's plan without a host: per-cluster names, configs, and the image archive writer."""

from __future__ import annotations

import ipaddress
import json
import tarfile
import tomllib
from pathlib import Path

from hisparse_devcluster import SERVICE_CIDR, POD_CIDR
from hisparse_devcluster._components import KUBERNETES_SERVICE_IP
from hisparse_devcluster.realnode import plan, write_image_archive
from hisparse_devcluster.realnode.node import _archive_names, _normalize


def names(path: str) -> plan.Names:
    return plan.Names.for_workdir(Path(path))


def test_two_clusters_share_no_host_name() -> None:
    a, b = names("/tmp/cluster-a"), names("/tmp/cluster-b")
    assert a.instance != b.instance
    for attr in ("netns", "cgroup_root", "veth", "bridge", "cni_network", "run_dir", "containerd_sock"):
        assert getattr(a, attr) != getattr(b, attr), attr
    assert names("/tmp/cluster-a") == a  # stable: a later process finds the same names


def test_names_fit_the_kernel_limits() -> None:
    n = names("/a/very/long/workdir/" + "x" * 200)
    assert all(len(v) <= 15 for v in (*n.veth, n.bridge))  # IFNAMSIZ - 1
    for sock in (n.containerd_sock, n.api_sock, n.kubelet_sock):
        assert len(str(sock).encode()) < 108  # sun_path


def test_addresses_stay_apart() -> None:
    nets = [ipaddress.ip_network(c) for c in (SERVICE_CIDR, POD_CIDR, plan.POD_SUBNET, f"{plan.NODE_IP}/32")]
    assert not any(x.overlaps(y) for i, x in enumerate(nets) for y in nets[i + 1:])
    assert all(net.is_private for net in nets)
    assert ipaddress.ip_address(plan.cluster_dns_ip()) in ipaddress.ip_network(SERVICE_CIDR)
    assert plan.cluster_dns_ip() != KUBERNETES_SERVICE_IP


def test_containerd_config_is_its_own_and_uses_the_local_pause() -> None:
    n = names("/tmp/cluster-a")
    doc = tomllib.loads(plan.containerd_config(n, pause_image="localhost/pause:3.10.1", runc="/usr/sbin/runc"))
    assert doc["root"].startswith(str(n.dir)) and doc["state"].startswith(str(n.run_dir))
    assert doc["grpc"]["address"] == str(n.containerd_sock)
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "localhost/pause:3.10.1"
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["cni"]["conf_dir"] == str(n.cni_conf_dir)
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["registry"] == {"config_path": str(n.registry_hosts_dir)} and n.registry_hosts_dir.is_relative_to(n.dir)


def test_a_private_registry_is_configured_as_containerd_documents_it() -> None:
    hosts = tomllib.loads(plan.registry_hosts("https://127.0.0.1:27100", Path("/n/certs.d/127.0.0.1:27100/ca.crt")))
    assert hosts == {"server": "https://127.0.0.1:27100", "host": {"https://127.0.0.1:27100": {
        "capabilities": ["pull", "resolve"], "ca": "/n/certs.d/127.0.0.1:27100/ca.crt"}}}


def test_cni_and_kubelet_configs_keep_state_in_the_instance() -> None:
    n = names("/tmp/cluster-a")
    cni = plan.cni_config(n)
    assert cni["plugins"][0]["ipam"]["dataDir"] == str(n.cni_ipam_dir)
    assert cni["plugins"][0]["bridge"] == n.bridge and cni["name"] == n.cni_network
    kc = plan.kubelet_config(n, plan.Ports(apiserver=6443, kubelet=40000), ca_file=Path("ca"),
                             cert_file=Path("c"), key_file=Path("k"))
    assert kc["cgroupRoot"] == n.cgroup_root and kc["podLogsDir"] == str(n.pod_logs)
    assert kc["registerWithTaints"] == [plan.NODE_TAINT]
    assert kc["clusterDNS"] == [plan.cluster_dns_ip()] and kc["port"] == 40000
    assert kc["failCgroupV1"] is False and kc["authentication"]["anonymous"]["enabled"] is False


def test_cluster_dns_never_forwards() -> None:
    assert "forward" not in plan.corefile() and "proxy" not in plan.corefile()
    objs = {o["kind"]: o for o in plan.coredns_objects(image="localhost/coredns:1.15.0")}
    spec = objs["Deployment"]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == dict([plan.NODE_LABEL])
    assert spec["containers"][0]["securityContext"]["runAsNonRoot"] is True
    assert objs["Service"]["spec"]["clusterIP"] == plan.cluster_dns_ip()


def test_socat_bridges_listen_only_on_loopback_and_inside_the_namespace() -> None:
    n = names("/tmp/cluster-a")
    cmds = plan.socats(n, plan.Ports(apiserver=6443, kubelet=40000))
    assert "bind=127.0.0.1" in " ".join(cmds["socat-kubelet-host"])
    for name in ("socat-api-node", "socat-kubelet-node"):
        assert cmds[name][:2] == ["nsenter", f"--net={n.netns_path}"]
    assert all("TCP-LISTEN" not in " ".join(argv) for name, argv in cmds.items()
               if name.endswith("-host") and "bind=127.0.0.1" not in " ".join(argv))


def test_image_archive_round_trip(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_bytes(b"#!/bin/sh\n")
    a = write_image_archive(tmp_path / "a.tar", "localhost/tool:1", root, entrypoint=["/bin/tool"])
    b = write_image_archive(tmp_path / "b.tar", "localhost/tool:1", root, entrypoint=["/bin/tool"])
    assert a.read_bytes() == b.read_bytes()  # reproducible
    with tarfile.open(a) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
    assert config["config"]["Entrypoint"] == ["/bin/tool"] and config["os"] == "linux"
    assert _archive_names(a) == ["localhost/tool:1"]
    assert _normalize("busybox:1") == "docker.io/library/busybox:1"
    assert _normalize("org/app:2") == "docker.io/org/app:2"
    assert _normalize("registry.example:5000/app:2") == "registry.example:5000/app:2"


# ---- the apiserver's egress into the node's namespace -------------------------------------------------------

def test_egress_opens_node_addresses_inside_and_loopback_on_the_host_only() -> None:
    service, pod = ipaddress.ip_network(SERVICE_CIDR), ipaddress.ip_network(plan.POD_SUBNET)
    assert plan.egress_way(str(service[10])) == "node"
    assert plan.egress_way(str(service[-2])) == "node"
    assert plan.egress_way(str(pod[7])) == "node"
    assert plan.egress_way(plan.NODE_IP) == "node"
    for loopback in ("127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost"):
        assert plan.egress_way(loopback) == "loopback", loopback
    # KWOK's pod addresses are never dialled; the machine's own and every other network are refused;
    # names are never looked up.
    for other in (str(ipaddress.ip_network(POD_CIDR)[5]), "192.0.2.2", "10.0.0.1", "8.8.8.8", "fd00::2",
                  "kubernetes.default.svc", "example.org", "", "10.250.0.2", "10.250.2.1"):
        assert plan.egress_way(other) is None, other


def test_egress_selector_sends_cluster_traffic_only_through_the_socket(tmp_path: Path) -> None:
    doc = plan.egress_selector_configuration(tmp_path / "egress.sock")
    assert doc["apiVersion"] == "apiserver.k8s.io/v1beta1" and doc["kind"] == "EgressSelectorConfiguration"
    # controlplane (webhooks by URL, e.g. LWS's on loopback) and etcd stay direct.
    assert [s["name"] for s in doc["egressSelections"]] == ["cluster"]
    conn = doc["egressSelections"][0]["connection"]
    assert conn == {"proxyProtocol": "HTTPConnect", "transport": {"uds": {"udsName": str(tmp_path / "egress.sock")}}}


def test_the_apiserver_reads_the_egress_configuration(tmp_path: Path) -> None:
    from hisparse_devcluster import _components
    from hisparse_devcluster._tools import Tools

    layout = _components.Layout(tmp_path)
    tools = Tools(**{f: Path(f"/bin/{f}") for f in Tools.__dataclass_fields__})  # type: ignore[arg-type]
    ports = _components.Ports(*range(1, len(_components.Ports.names()) + 1))
    argv = _components.kube_apiserver(tools, layout, ports)
    assert f"--egress-selector-config-file={layout.egress_config}" in argv
    assert plan.egress_proxy("/py", socket=layout.egress_socket, names=names(str(tmp_path)))[:3] == [
        "/py", "-m", "hisparse_devcluster.realnode.egress"]


def test_namespace_routes_name_only_the_service_range_on_the_nodes_own_link() -> None:
    n = names("/tmp/cluster-a")
    assert plan.netns_routes(n) == [[SERVICE_CIDR, "dev", n.veth[0], "src", plan.NODE_IP]]


# ---- the chart's values for the operator pod on the real node ------------------------------------------------

def test_operator_pod_values_are_the_charts_own_and_place_it_on_the_real_node() -> None:
    from hisparse_devcluster.operator_pod import OperatorPodError, chart_values, deep_merge
    from hisparse_operator.chart_values import ChartValues

    values = chart_values("localhost/hisparse-operator:0123abcd")
    model = ChartValues.model_validate(values)  # the same model values.schema.json is generated from
    assert model.image.repository == "localhost/hisparse-operator" and model.image.tag == "0123abcd"
    assert model.image.pull_policy == "Never"
    assert model.node_selector == dict([plan.NODE_LABEL])
    assert model.tolerations == plan.real_node_placement()["tolerations"]
    assert model.replicas == 1
    merged = ChartValues.model_validate(deep_merge(values, {"resyncSeconds": 120, "image": {"pullPolicy": "IfNotPresent"}}))
    assert merged.resync_seconds == 120 and merged.image.pull_policy == "IfNotPresent" and merged.image.tag == "0123abcd"
    import pytest

    with pytest.raises(OperatorPodError, match="read the image reference failed: .* has no tag"):
        chart_values("localhost/hisparse-operator")


def test_coredns_is_built_with_each_plugin_its_corefile_names() -> None:
    """build.sh compiles only the plugins its overlay imports: a Corefile directive left out of it would
    stop CoreDNS at start ("Unknown directive")."""
    import re

    overlay = Path(__file__).resolve().parents[1] / "tools" / "coredns" / "_overlay" / "core" / "plugin" / "zplugin.go"
    built = set(re.findall(r'"github\.com/coredns/coredns/plugin/(\w+)"', overlay.read_text()))
    directives, depth = set(), 0
    for line in plan.corefile().splitlines():
        words = line.split()
        if depth == 1 and words and words[0] != "}":
            directives.add(words[0])  # a plugin of the server block (deeper lines are its options)
        depth += line.count("{") - line.count("}")
    assert {"kubernetes", "health", "ready"} <= directives <= built, directives - built
