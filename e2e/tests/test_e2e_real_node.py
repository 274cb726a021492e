"""The real node beside the KWOK nodes: a kubelet, containerd and runc running pods from a locally
imported image, with Services, cluster DNS and the in-cluster apiserver reachable from a pod; a
kubelet restart that converges; a teardown that leaves nothing; and the failure messages.

The tests run in file order on one node (the last one stops it and checks the host is clean).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_realnode import BUSYBOX_IMAGE, busybox_archive, busybox_pod, pod, sh, until, wait_pods_ready
from hisparse_devcluster import Cluster, KubectlError, Tools
from hisparse_devcluster.realnode import (
    NODE_NAME,
    NodeTimeouts,
    RealNode,
    RealNodeError,
    cluster_dns_ip,
)

pytestmark = pytest.mark.host

_NODE: dict[str, RealNode] = {}


@pytest.fixture(scope="module")
def node(cluster: Cluster, tools: Tools) -> Iterator[RealNode]:
    n = RealNode(cluster, tools=tools).start()
    _NODE["node"] = n
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def app(cluster: Cluster, node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A namespace with a web pod behind a ClusterIP Service and a client pod, both on the real node."""
    archive = busybox_archive(tmp_path_factory.mktemp("images") / "busybox.tar", kubectl=cluster.kubectl_path)
    assert node.import_image(archive) == [BUSYBOX_IMAGE]
    ns = "real-node-app"
    cluster.kubectl("create", "namespace", ns)
    web = busybox_pod("web", ns, "/bin/busybox mkdir -p /tmp/www && "
                      "echo served-by-$(/bin/busybox hostname) > /tmp/www/index.html && "
                      "exec /bin/busybox httpd -f -p 8080 -h /tmp/www", labels={"app": "web"}, port=8080)
    client = busybox_pod("client", ns, "exec /bin/busybox sleep 3600")
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
           "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}
    cluster.apply([web, client, svc])
    wait_pods_ready(cluster, ns, ["web", "client"])
    try:
        yield ns
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_node_registers_tainted_and_labelled(cluster: Cluster, node: RealNode) -> None:
    obj = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    assert obj["metadata"]["labels"][node.label[0]] == node.label[1]
    assert node.taint in obj["spec"]["taints"]
    assert obj["status"]["nodeInfo"]["kubeletVersion"] == "v1.35.4"
    assert obj["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.6")
    assert {"type": "InternalIP", "address": node.ip} in obj["status"]["addresses"]
    # Nothing meant for the KWOK nodes lands here: the only pods on it are CoreDNS's (and the tests').
    on_node = json.loads(cluster.kubectl("get", "pods", "-A", f"--field-selector=spec.nodeName={NODE_NAME}",
                                         "-o", "json").stdout)["items"]
    assert {p["metadata"]["namespace"] for p in on_node} <= {"kube-system", "real-node-app"}


def test_pod_runs_from_the_imported_image(cluster: Cluster, node: RealNode, app: str) -> None:
    web = pod(cluster, app, "web")
    assert web["spec"]["nodeName"] == NODE_NAME
    status = web["status"]["containerStatuses"][0]
    assert status["ready"] and status["image"] == BUSYBOX_IMAGE
    image_id = status["imageID"]
    assert image_id.startswith("sha256:") or "@sha256:" in image_id
    # The container really runs under runc on this host, in the node's cgroup tree.
    assert status["containerID"].startswith("containerd://")
    assert node.ctr("containers", "info", status["containerID"].removeprefix("containerd://")).returncode == 0
    assert os.path.isdir(f"/sys/fs/cgroup/memory/hisparse-{node.names.instance}/kubepods")
    logs = cluster.kubectl("logs", "-n", app, "web").stdout  # apiserver -> kubelet through the socat bridge
    assert "error" not in logs.lower()


def test_cluster_ip_service_answers_from_a_pod(cluster: Cluster, app: str) -> None:
    ip = cluster.kubectl("get", "svc", "web", "-n", app, "-o", "jsonpath={.spec.clusterIP}").stdout
    assert ip.startswith("10.96.")
    # busybox's nc (its wget crashes without a libc's name-service files in the image).
    out = sh(cluster, app, "client", f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 5 {ip} 80")
    assert out.startswith("HTTP/1.") and out.rstrip().endswith("served-by-web"), out


def http_by_name(cluster: Cluster, app: str, url: str) -> str:
    """GET ``url`` from the client pod with kubectl (Go's resolver: resolv.conf, search list, ndots)."""
    return sh(cluster, app, "client", f"/bin/kubectl --server={url} --token=unused get --raw /")


def test_dns_names_resolve_from_a_pod(cluster: Cluster, app: str) -> None:
    ip = cluster.kubectl("get", "svc", "web", "-n", app, "-o", "jsonpath={.spec.clusterIP}").stdout
    resolv = sh(cluster, app, "client", "/bin/busybox cat /etc/resolv.conf")
    assert f"nameserver {cluster_dns_ip()}" in resolv and f"search {app}.svc.cluster.local" in resolv
    looked_up = sh(cluster, app, "client", f"/bin/busybox nslookup web.{app}.svc.cluster.local")
    assert re.search(rf"Address:\s*{re.escape(ip)}\b", looked_up), looked_up
    # <svc>.<ns>.svc through the search list, as an application resolves it.
    assert http_by_name(cluster, app, f"http://web.{app}.svc").strip() == "served-by-web"
    # A name outside the cluster is not forwarded anywhere: it fails.
    res = cluster.kubectl("exec", "-n", app, "client", "--", "/bin/busybox", "nslookup", "example.org",
                          check=False)
    assert res.returncode != 0 or "NXDOMAIN" in res.stdout or "can't" in res.stdout + res.stderr


def test_in_cluster_apiserver_answers_from_a_pod(cluster: Cluster, app: str) -> None:
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    # In-cluster config: KUBERNETES_SERVICE_HOST (the ClusterIP), the ServiceAccount token and CA, the
    # apiserver certificate verified against it.
    out = sh(cluster, app, "client", "/bin/kubectl get --raw /version")
    assert json.loads(out)["gitVersion"] == "v1.35.4"
    env = sh(cluster, app, "client", "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT")
    assert env.strip() == "10.96.0.1:443"
    # By name, through the cluster DNS and the search list.
    by_name = (f"/bin/kubectl --server=https://kubernetes.default --certificate-authority={sa}/ca.crt "
               f"--token=$(/bin/busybox cat {sa}/token)")
    assert json.loads(sh(cluster, app, "client", f"{by_name} get --raw /version"))["gitVersion"] == "v1.35.4"
    # As the pod's own ServiceAccount: authenticated, and refused by RBAC.
    res = cluster.kubectl("exec", "-n", app, "client", "--", "/bin/busybox", "sh", "-c",
                          f"{by_name} get nodes 2>&1", check=False)
    assert "forbidden" in res.stdout.lower() and f"system:serviceaccount:{app}:default" in res.stdout, res.stdout


def test_kubelet_restart_converges(cluster: Cluster, node: RealNode, app: str) -> None:
    def snapshot() -> dict[str, tuple[str, str, int]]:
        items = json.loads(cluster.kubectl("get", "pods", "-A", f"--field-selector=spec.nodeName={NODE_NAME}",
                                           "-o", "json").stdout)["items"]
        return {f"{p['metadata']['namespace']}/{p['metadata']['name']}":
                (p["metadata"]["uid"], p["status"]["containerStatuses"][0]["containerID"],
                 p["status"]["containerStatuses"][0]["restartCount"]) for p in items}

    before = snapshot()
    assert {f"{app}/web", f"{app}/client"} <= set(before) and any(k.startswith("kube-system/coredns") for k in before)
    old_pid = next(p.pid for p in node.processes if p.name == "kubelet")
    node.restart_kubelet()
    assert next(p.pid for p in node.processes if p.name == "kubelet") != old_pid
    wait_pods_ready(cluster, app, ["web", "client"])
    # Same pods, same containers, no restarts, nothing duplicated.
    assert snapshot() == before
    sandboxes = [ln for ln in node.ctr("containers", "list", "--quiet").stdout.split() if ln]
    assert len(sandboxes) == 2 * len(before), sandboxes  # one pause + one app container per pod
    # The restarted kubelet serves exec once it has synced its pods again (moments after Ready), and the
    # Service answers again once the endpoint the restart marked not ready is back in kube-proxy's rules
    # (until then nftables rejects: "connection refused").
    def served() -> bool:
        try:
            return http_by_name(cluster, app, f"http://web.{app}.svc").strip() == "served-by-web"
        except KubectlError as e:
            if "pod does not exist" in e.stderr or "was refused" in e.stderr:
                return False
            raise

    until("exec through the restarted kubelet", served, timeout=60)


def test_a_changed_config_map_reaches_the_pods_volume_within_the_kubelets_sync(cluster: Cluster, node: RealNode,
                                                                                  app: str) -> None:
    """The running kubelet syncs pods every KUBELET_SYNC_FREQUENCY (read back from its own /configz), so a
    changed ConfigMap reaches a mounted volume within two periods and 20 s for the exec that reads it, each of
    three times in a row (the default of 1 min plus jitter took minutes to carry a PodMonitor into
    Prometheus's configuration)."""
    from hisparse_devcluster.realnode.plan import KUBELET_SYNC_FREQUENCY

    code, body = node.kubelet_get("/configz")
    assert code == 200, body
    assert json.loads(body)["kubeletconfig"]["syncFrequency"] == KUBELET_SYNC_FREQUENCY
    period = float(KUBELET_SYNC_FREQUENCY.removesuffix("s"))

    def config_map(value: str) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": app},
                "data": {"value": value}}

    reader = busybox_pod("reader", app, "exec /bin/busybox sleep 3600")
    reader["spec"]["volumes"] = [{"name": "settings", "configMap": {"name": "settings"}}]
    reader["spec"]["containers"][0]["volumeMounts"] = [{"name": "settings", "mountPath": "/settings"}]
    cluster.apply([config_map("v0"), reader])
    try:
        wait_pods_ready(cluster, app, ["reader"])
        until("the first value mounted", lambda: sh(cluster, app, "reader", "/bin/busybox cat /settings/value") == "v0")
        took = []
        for i in range(1, 4):
            started = time.monotonic()
            cluster.apply([config_map(f"v{i}")])
            until(f"value v{i} in the volume",
                  lambda: sh(cluster, app, "reader", "/bin/busybox cat /settings/value") == f"v{i}",
                  timeout=2 * period + 20, interval=1)
            took.append(round(time.monotonic() - started, 1))
        print(f"ConfigMap -> volume: {took} s")
    finally:
        cluster.kubectl("delete", "pod", "reader", "-n", app, "--wait=true", "--timeout=60s", check=False)
        cluster.kubectl("delete", "configmap", "settings", "-n", app, check=False)


def test_import_refuses_what_is_not_an_image(node: RealNode, tmp_path: Path) -> None:
    bogus = tmp_path / "not-an-image.tar"
    bogus.write_bytes(b"\0" * 1024)
    with pytest.raises(RealNodeError, match=r"import an image failed: .*\nfix: .*docker-archive"):
        node.import_image(bogus)
    with pytest.raises(RealNodeError, match="is not a file"):
        node.import_image(tmp_path / "missing.tar")


def test_teardown_leaves_nothing(cluster: Cluster, node: RealNode) -> None:
    names = node.names
    shims = [p for p in _pids_with(str(names.containerd_sock))]
    assert shims, "the running node has containerd shims"
    node.stop()
    mounts = Path("/proc/mounts").read_text()
    assert str(names.dir) not in mounts and str(names.run_dir) not in mounts
    assert not [h for h in Path("/sys/fs/cgroup").iterdir() if (h / f"hisparse-{names.instance}").exists()]
    assert names.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(v in links for v in (*names.veth, names.bridge))
    assert not _pids_with(str(names.workdir / "realnode")) and not _pids_with(str(names.run_dir))
    assert node.leftovers() == {}
    assert RealNode.attach(cluster) is None
    assert NODE_NAME not in cluster.kubectl("get", "nodes", "-o", "name").stdout


def test_node_that_does_not_register_stops_with_a_clear_error(cluster: Cluster, tools: Tools,
                                                               tmp_path: Path) -> None:
    # A kubelet that never registers (a stand-in that only sleeps): the start must fail at that step,
    # say so, and leave nothing behind.
    fake = tmp_path / "kubelet"
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    from dataclasses import replace

    node = RealNode(cluster, tools=replace(tools, kubelet=fake), timeouts=NodeTimeouts(register=5))
    with pytest.raises(RealNodeError) as err:
        node.start()
    msg = str(err.value)
    assert msg.startswith("real node: register the node (kubelet) failed: ")
    assert "timed out after 5s waiting for node localhost to register" in msg
    assert "\nfix: see " in msg and "realnode-kubelet.log" in msg
    assert node.leftovers() == {}
    assert RealNode.attach(cluster) is None


def _pids_with(needle: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
