"""The control plane itself: versions, loopback-only listeners, RBAC, tokens."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from hisparse_devcluster import Cluster, versions
from kubernetes import client as k8s


def test_apiserver_reports_pinned_version(cluster: Cluster) -> None:
    status, body = cluster.api_get("/version")
    assert status == 200, body
    info = json.loads(body)
    want = versions.KUBERNETES_VERSION
    assert info["gitVersion"] == want
    assert (info["major"], info["minor"]) == tuple(want.removeprefix("v").split(".")[:2])
    assert info["gitTreeState"] == "clean"


def test_kubectl_and_python_client_agree_on_version(cluster: Cluster) -> None:
    out = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert out["clientVersion"]["gitVersion"] == versions.KUBERNETES_VERSION
    assert out["serverVersion"]["gitVersion"] == versions.KUBERNETES_VERSION
    with cluster.client() as api:
        assert k8s.VersionApi(api).get_code().git_version == versions.KUBERNETES_VERSION


def _listening_addresses(pid: int) -> set[str]:
    """``ip:port`` of every TCP socket process ``pid`` listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state != "0A" or inode not in inodes:  # 0A = LISTEN
                continue
            addr, port = local.split(":")
            if width == 8:
                ip = ".".join(str(int(addr[i : i + 2], 16)) for i in (6, 4, 2, 0))
            else:
                ip = "v6:" + addr
            found.add(f"{ip}:{int(port, 16)}")
    return found


def test_every_server_listens_on_loopback_only(cluster: Cluster) -> None:
    seen = {}
    for rec in cluster.processes:
        addrs = _listening_addresses(rec.pid)
        if rec.name == "apiserver-egress":
            # The apiserver's egress proxy listens on a unix socket in the workdir only.
            assert not addrs, f"the egress proxy listens on TCP: {addrs}"
            assert (cluster.workdir / "egress.sock").is_socket()
            continue
        assert addrs, f"{rec.name} listens on nothing"
        seen[rec.name] = addrs
    off_loopback = {n: a for n, a in seen.items() if any(not x.startswith("127.0.0.1:") for x in a)}
    assert not off_loopback, f"listeners outside 127.0.0.1: {off_loopback}"
    assert {r.name for r in cluster.processes} == {
        "etcd", "apiserver-egress", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
        "lws-manager"
    }


def test_rbac_denies_a_service_account_until_a_role_grants_it(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    who = f"--as=system:serviceaccount:{namespace}:reader"
    cluster.kubectl("create", "configmap", "c1", "-n", namespace, "--from-literal=k=v")

    denied = cluster.kubectl("get", "configmaps", "-n", namespace, who, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower(), denied.stderr

    cluster.kubectl("create", "role", "read-cm", "-n", namespace,
                    "--verb=get,list", "--resource=configmaps")
    cluster.kubectl("create", "rolebinding", "read-cm", "-n", namespace,
                    "--role=read-cm", f"--serviceaccount={namespace}:reader")
    allowed = cluster.kubectl("get", "configmaps", "c1", "-n", namespace, who, "-o", "name")
    assert allowed.stdout.strip() == "configmap/c1"
    # The grant is exactly as wide as the Role: secrets stay forbidden.
    still_denied = cluster.kubectl("get", "secrets", "-n", namespace, who, check=False)
    assert "forbidden" in still_denied.stderr.lower(), still_denied.stderr
    can_i = cluster.kubectl("auth", "can-i", "delete", "configmaps", "-n", namespace, who,
                            check=False)
    assert can_i.stdout.strip() == "no"


def test_service_account_tokens_are_issued_and_accepted(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "bot", "-n", namespace)
    token = cluster.kubectl("create", "token", "bot", "-n", namespace).stdout.strip()
    # The token authenticates on its own (no client cert) as that ServiceAccount.
    res = subprocess.run(
        [str(cluster.kubectl_path), "--kubeconfig=/dev/null", f"--server={cluster.server}",
         f"--certificate-authority={cluster.workdir / 'pki' / 'ca.crt'}",
         f"--token={token}", "auth", "whoami", "-o", "json"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert res.returncode == 0, res.stderr
    user = json.loads(res.stdout)["status"]["userInfo"]["username"]
    assert user == f"system:serviceaccount:{namespace}:bot"


def test_helm_reports_its_version_and_reaches_the_cluster(cluster: Cluster) -> None:
    helm = cluster.helm_path
    assert helm is not None, "helm is missing: run e2e/tools/build.sh"
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
           "HELM_CACHE_HOME": str(cluster.workdir / "helm" / "cache"),
           "HELM_CONFIG_HOME": str(cluster.workdir / "helm" / "config"),
           "HELM_DATA_HOME": str(cluster.workdir / "helm" / "data")}

    def run(*args: str) -> str:
        res = subprocess.run([str(helm), *args], capture_output=True, text=True, env=env,
                             timeout=60, check=False)
        assert res.returncode == 0, res.stderr
        return res.stdout

    assert run("version", "--template={{.Version}}") == versions.HELM_VERSION
    assert json.loads(run("list", "--all-namespaces", "-o", "json")) == []
