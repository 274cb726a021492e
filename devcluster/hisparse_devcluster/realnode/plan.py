"""What the real node is made of: names, addresses, configs and command lines. Pure, no I/O.

Everything a node instance owns outside its workdir (network namespace, cgroup root, runtime dir
with its sockets, links) is named after a hash of the cluster's workdir, so two clusters can each
run a real node on one machine and each tears down exactly its own.

The node lives in a network namespace of its own with no uplink: a veth pair whose both ends stay
inside it, one end holding the node IP as a /32. Pods get addresses from a bridge inside that
namespace. The host and the namespace meet only through unix sockets, each bridged to TCP by a
socat on either side:

- apiserver: host ``127.0.0.1:<apiserver port>`` <- socat <- ``api.sock`` <- socat listening on the
  same port inside the namespace (on its loopback for the kubelet and kube-proxy, on the node IP for
  pods, which reach it as the ``kubernetes`` Service's endpoint);
- kubelet: host ``127.0.0.1:<kubelet port>`` (the apiserver dials the node there for logs, exec and
  port-forward) -> socat -> ``kubelet.sock`` -> socat -> the kubelet inside the namespace.

The apiserver dials a node by its ``Hostname`` address, and the one name that resolves to the host's
loopback without editing ``/etc/hosts`` is ``localhost``: so the node is named ``localhost``.

Services of the node's pods that the apiserver itself calls (an admission webhook's Service, an
APIService) are reached through the apiserver's egress selector, as konnectivity does it: the
control plane's apiserver sends its ``cluster`` traffic (webhook Services, kubelets, the pod and
service proxy) as HTTP CONNECT over a unix socket to the cluster's egress proxy
(:mod:`.egress`). The proxy opens each connection where its target lives and nowhere else
(:func:`egress_way`): a ClusterIP, a pod address or the node IP from a socket inside the node's
namespace, where kube-proxy's rules turn a ClusterIP into a pod address as they do for any local
client (the namespace has a route for the service range on its own veth for that); loopback (KWOK's
"kubelets", the kubelet bridge above, an ExternalName of ``127.0.0.1``) from the host; anything
else is refused. So no host route, host link or host address is added, and two clusters' nodes
never see each other's traffic.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from .._components import SERVICE_CIDR

__all__ = [
    "CLUSTER_DOMAIN",
    "COREDNS_PORT",
    "NODE_IP",
    "NODE_LABEL",
    "NODE_NAME",
    "NODE_TAINT",
    "POD_SUBNET",
    "Names",
    "Ports",
    "cluster_dns_ip",
    "egress_way",
    "real_node_placement",
]

NODE_NAME: Final = "localhost"
"""The node's name and ``Hostname`` address (see the module docstring for why)."""
NODE_LABEL: Final = ("hisparse.dev/real-node", "true")
"""Label of the real node: a pod that should run containers selects it."""
NODE_TAINT: Final = {"key": "hisparse.dev/real-node", "value": "true", "effect": "NoSchedule"}
"""Taint of the real node, so that only pods that tolerate it (those meant for it) land there."""
NODE_IP: Final = "10.250.0.1"
"""The node's address (a /32 inside its own network namespace; every node instance may use it)."""
POD_SUBNET: Final = "10.250.1.0/24"
"""Pod addresses on the node's bridge (inside the namespace; apart from the fake KWOK pods' CIDR)."""
CLUSTER_DOMAIN: Final = "cluster.local"
COREDNS_PORT: Final = 1053
"""CoreDNS listens here in its pod (unprivileged); the ``kube-dns`` Service maps port 53 to it."""
KUBELET_HEALTHZ_PORT: Final = 10248
"""Inside the namespace only."""
CNI_BIN_DIR: Final = "/usr/lib/cni"
"""Where Debian's containernetworking-plugins puts bridge, host-local and loopback."""


def cluster_dns_ip(service_cidr: str = SERVICE_CIDR) -> str:
    """``kube-dns``'s ClusterIP: the tenth address of the service range, as kubeadm picks it."""
    return str(ipaddress.ip_network(service_cidr)[10])


@dataclass(frozen=True)
class Names:
    """Host-wide names of one node instance, derived from its cluster's workdir."""

    instance: str
    """8 hex digits of sha256(workdir)."""
    workdir: Path

    @classmethod
    def for_workdir(cls, workdir: Path) -> Names:
        digest = hashlib.sha256(str(workdir.resolve()).encode()).hexdigest()[:8]
        return cls(instance=digest, workdir=workdir.resolve())

    @property
    def netns(self) -> str:
        return f"hisparse-{self.instance}"

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    @property
    def cgroup_root(self) -> str:
        """The kubelet's ``cgroupRoot``, made beforehand in every cgroup hierarchy."""
        return f"/hisparse-{self.instance}"

    @property
    def veth(self) -> tuple[str, str]:
        """The pair inside the namespace; the first holds the node IP (15 characters at most)."""
        return f"hsn{self.instance}a", f"hsn{self.instance}b"

    @property
    def bridge(self) -> str:
        return f"hsb{self.instance}"

    @property
    def cni_network(self) -> str:
        return f"hisparse-{self.instance}"

    @property
    def run_dir(self) -> Path:
        """Sockets and containerd's state (unix socket paths must stay under 108 bytes)."""
        return Path("/run") / f"hisparse-{self.instance}"

    @property
    def containerd_sock(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return self.run_dir / "containerd"

    @property
    def api_sock(self) -> Path:
        return self.run_dir / "api.sock"

    @property
    def kubelet_sock(self) -> Path:
        return self.run_dir / "kubelet.sock"

    # ---- files in the workdir ----

    @property
    def dir(self) -> Path:
        return self.workdir / "realnode"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def containerd_root(self) -> Path:
        return self.dir / "containerd"

    @property
    def pod_logs(self) -> Path:
        return self.dir / "pod-logs"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.dir / "cni-ipam"

    @property
    def registry_hosts_dir(self) -> Path:
        """containerd's registry configuration (``config_path``): one ``<host:port>/hosts.toml`` per
        registry, as on a cluster's nodes (empty: every registry by its defaults)."""
        return self.dir / "certs.d"

    @property
    def images(self) -> Path:
        return self.dir / "images"

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    def config(self, name: str) -> Path:
        return self.dir / name

    @property
    def owned_paths(self) -> tuple[Path, ...]:
        """Where this instance's mounts can be: anything mounted below these is its own."""
        return (self.dir, self.run_dir)


@dataclass(frozen=True)
class Ports:
    apiserver: int
    """The control plane's apiserver port; the namespace-side socat listens on the same number."""
    kubelet: int
    """Free on the host's loopback; the kubelet listens on it inside the namespace too."""


# ---- command lines ----------------------------------------------------------------------------------


def in_netns(names: Names, argv: list[str]) -> list[str]:
    """``argv`` in the node's network namespace. ``nsenter`` rather than ``ip netns exec``, which
    remounts /sys and so hides /sys/fs/cgroup from the kubelet."""
    return ["nsenter", f"--net={names.netns_path}", "--", *argv]


def socats(names: Names, ports: Ports) -> dict[str, list[str]]:
    """The four socat processes, by name (start them in this order)."""
    api, kubelet = names.api_sock, names.kubelet_sock
    return {
        "socat-api-host": ["socat", f"UNIX-LISTEN:{api},fork,unlink-early",
                           f"TCP:127.0.0.1:{ports.apiserver}"],
        # 0.0.0.0 inside the namespace: its loopback (kubelet, kube-proxy) and the node IP (pods).
        "socat-api-node": in_netns(names, [
            "socat", f"TCP-LISTEN:{ports.apiserver},fork,reuseaddr", f"UNIX-CONNECT:{api}"]),
        "socat-kubelet-node": in_netns(names, [
            "socat", f"UNIX-LISTEN:{kubelet},fork,unlink-early", f"TCP:{NODE_IP}:{ports.kubelet}"]),
        "socat-kubelet-host": ["socat", f"TCP-LISTEN:{ports.kubelet},bind=127.0.0.1,fork,reuseaddr",
                               f"UNIX-CONNECT:{kubelet}"],
    }


def containerd(containerd_bin: str, names: Names) -> list[str]:
    return in_netns(names, [containerd_bin, f"--config={names.config('containerd.toml')}"])


def kubelet(kubelet_bin: str, names: Names) -> list[str]:
    return in_netns(names, [
        kubelet_bin,
        f"--config={names.config('kubelet.yaml')}",
        f"--kubeconfig={names.config('kubelet.kubeconfig')}",
        f"--root-dir={names.kubelet_root}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        f"--node-labels={'='.join(NODE_LABEL)}",
        "--v=1",
    ])


def kube_proxy(kube_proxy_bin: str, names: Names) -> list[str]:
    return in_netns(names, [kube_proxy_bin, f"--config={names.config('kube-proxy.yaml')}", "--v=1"])


KUBE_PROXY_HEALTHZ_PORT: Final = 10256
"""kube-proxy's default /healthz, inside the namespace only."""
KUBE_ROUTER_HEALTH_PORT: Final = 20244
"""kube-router's /healthz, inside the namespace only."""
KUBE_ROUTER_USER: Final = "hisparse-dev:kube-router"


def kube_router(kube_router_bin: str, names: Names, *, kubeconfig: Path) -> list[str]:
    """kube-router with only its network policy controller (as k3s runs it): no routing, no service proxy
    (kube-proxy has that), no CNI changes; iptables and ipsets in the node's namespace."""
    return in_netns(names, [
        kube_router_bin, f"--kubeconfig={kubeconfig}", f"--hostname-override={NODE_NAME}",
        "--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--run-loadbalancer=false",
        "--enable-cni=false", "--enable-ipv4=true", "--enable-ipv6=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}", f"--health-port={KUBE_ROUTER_HEALTH_PORT}",
        "--metrics-port=0", "--iptables-sync-period=1m", "--v=1"])


def kube_router_rbac() -> list[dict[str, Any]]:
    """What kube-router's informers read (it watches Services and EndpointSlices even in firewall mode)."""
    return [{
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": KUBE_ROUTER_USER},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes", "services", "endpoints"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
        ],
    }, {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": KUBE_ROUTER_USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": KUBE_ROUTER_USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KUBE_ROUTER_USER}],
    }]


def netns_routes(names: Names) -> list[list[str]]:
    """``ip route add`` arguments run inside the node's namespace once its links are up: the service
    range on the node's own veth, so that a client inside the namespace (the egress proxy's sockets)
    can connect to a ClusterIP at all; kube-proxy's output rules then rewrite the destination to a
    pod on the bridge. Pods need no such route: their packets are rewritten as they enter."""
    return [[SERVICE_CIDR, "dev", names.veth[0], "src", NODE_IP]]


# ---- the apiserver's egress to the cluster -------------------------------------------------------------

EgressWay = Literal["node", "loopback"]
EGRESS_SELECTOR_API: Final = "apiserver.k8s.io/v1beta1"


def egress_way(host: str) -> EgressWay | None:
    """Where the egress proxy opens a connection the apiserver asked for (``CONNECT host:port``):
    ``"node"`` for an address inside the real node's namespace (the service range, the node's pod
    subnet, the node IP), ``"loopback"`` for the host's loopback (``localhost`` included: the real
    node's name), None (refused) for anything else, names included: no lookup is ever made."""
    if host == "localhost":
        return "loopback"
    try:
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None
    if ip.is_loopback:
        return "loopback"
    inside = (ipaddress.ip_network(SERVICE_CIDR), ipaddress.ip_network(POD_SUBNET),
              ipaddress.ip_network(f"{NODE_IP}/32"))
    return "node" if any(ip in net for net in inside) else None


def egress_selector_configuration(socket: Path) -> dict[str, Any]:
    """The apiserver's ``--egress-selector-config-file``: ``cluster`` traffic (webhook Services,
    kubelets, the pod and service proxy) as HTTP CONNECT over ``socket``; ``controlplane`` (webhooks
    by URL) and ``etcd`` stay direct."""
    return {
        "apiVersion": EGRESS_SELECTOR_API,
        "kind": "EgressSelectorConfiguration",
        "egressSelections": [{
            "name": "cluster",
            "connection": {"proxyProtocol": "HTTPConnect", "transport": {"uds": {"udsName": str(socket)}}},
        }],
    }


def egress_proxy(python: str, *, socket: Path, names: Names) -> list[str]:
    """The egress proxy's command line (a host process: it opens loopback connections on the host and
    the node's from sockets made inside its namespace)."""
    return [python, "-m", "hisparse_devcluster.realnode.egress", f"--socket={socket}",
            f"--netns={names.netns_path}"]


# ---- configuration files ----------------------------------------------------------------------------


def containerd_config(names: Names, *, pause_image: str, runc: str, root: Path | None = None) -> str:
    """containerd 1.6's config (version 2): its own root, state and socket; CRI with the locally
    built pause image, runc with cgroupfs, the CNI plugins of Debian's package, and registries configured
    per host in ``registry_hosts_dir`` (:func:`registry_hosts`)."""
    cri = {
        "sandbox_image": pause_image,
        "stream_server_address": "127.0.0.1",
        "stream_server_port": "0",
        # Pod network namespaces under the state dir, not the host's /run/netns.
        "netns_mounts_under_state_dir": True,
        "enable_selinux": False,
        "tolerate_missing_hugetlb_controller": True,
        # The pause container asks for -998 and Guaranteed pods for -997; lowering a score needs
        # CAP_SYS_RESOURCE, which a development container may lack: keep scores at containerd's own.
        "restrict_oom_score_adj": True,
        "containerd": {
            "snapshotter": "overlayfs",
            "default_runtime_name": "runc",
            "runtimes": {"runc": {
                "runtime_type": "io.containerd.runc.v2",
                # runc's state of its own (the default /run/containerd/runc is every containerd's).
                "options": {"BinaryName": runc, "Root": str(names.run_dir / "runc"), "SystemdCgroup": False},
            }},
        },
        "cni": {"bin_dir": CNI_BIN_DIR, "conf_dir": str(names.cni_conf_dir), "max_conf_num": 1},
        "registry": {"config_path": str(names.registry_hosts_dir)},
    }
    doc = {
        "version": 2,
        "root": str(root or names.containerd_root),
        "state": str(names.containerd_state),
        "disabled_plugins": [
            "io.containerd.internal.v1.opt",  # would write /opt/containerd
            "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
            "io.containerd.tracing.processor.v1.otlp",
        ],
        "grpc": {"address": str(names.containerd_sock)},
        "ttrpc": {"address": str(names.run_dir / "containerd.ttrpc.sock")},
        "plugins": {"io.containerd.grpc.v1.cri": cri},
    }
    return toml(doc)


def registry_hosts(server: str, ca_file: Path) -> str:
    """``hosts.toml`` for a registry served over TLS by a CA of its own (containerd's docs/hosts.md):
    what a cluster's nodes carry for a private registry."""
    return toml({"server": server, "host": {server: {"capabilities": ["pull", "resolve"], "ca": str(ca_file)}}})


def cni_config(names: Names) -> dict[str, Any]:
    """The bridge network of the node's pods, with host-local addresses kept in the workdir."""
    return {
        "cniVersion": "1.0.0",
        "name": names.cni_network,
        "plugins": [{
            "type": "bridge",
            "bridge": names.bridge,
            "isGateway": True,
            "ipMasq": False,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": POD_SUBNET}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": str(names.cni_ipam_dir),
            },
        }],
    }


KUBELET_SYNC_FREQUENCY: Final = "10s"


def kubelet_config(names: Names, ports: Ports, *, ca_file: Path,
                   cert_file: Path, key_file: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # Kubernetes 1.35 refuses cgroup v1 unless told otherwise; this host has a v1 hierarchy.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,
        "cgroupRoot": names.cgroup_root,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "containerRuntimeEndpoint": f"unix://{names.containerd_sock}",
        "podLogsDir": str(names.pod_logs),
        "resolvConf": str(names.config("resolv.conf")),
        "clusterDNS": [cluster_dns_ip()],
        "clusterDomain": CLUSTER_DOMAIN,
        "address": NODE_IP,
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "tlsCertFile": str(cert_file),
        "tlsPrivateKeyFile": str(key_file),
        # Only holders of a certificate from the cluster CA (the apiserver) reach the kubelet's API.
        "authentication": {"x509": {"clientCAFile": str(ca_file)},
                           "webhook": {"enabled": False}, "anonymous": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "registerWithTaints": [NODE_TAINT],
        "maxPods": 110,
        # Images here are imported, never pulled: garbage collection must not remove them, and a
        # shared development disk must not evict pods.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        # A changed Secret or ConfigMap reaches a pod's volume only at the pod's next periodic sync (the
        # default 1 min, plus jitter): Prometheus's configuration, which the Prometheus Operator writes to a
        # Secret, lagged a PodMonitor by minutes. A handful of pods makes a 10 s sync cheap.
        "syncFrequency": KUBELET_SYNC_FREQUENCY,
    }


def kube_proxy_config(names: Names, *, kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "clusterCIDR": POD_SUBNET,
        "mode": "nftables",
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": f"127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}",
        # Source NAT for all Service traffic, so replies from a pod on the same bridge come back
        # through the namespace's stack whether or not bridged traffic meets netfilter.
        "nftables": {"masqueradeAll": True},
        # conntrack limits are machine-wide: leave them as they are.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        "nodePortAddresses": [f"{NODE_IP}/32"],
    }


RESOLV_CONF: Final = "# hisparse real node: pods resolve through the cluster DNS only; no upstream.\n"


# ---- objects in the cluster -------------------------------------------------------------------------

FIELD_MANAGER: Final = "hisparse-devcluster-realnode"


def node_rbac() -> list[dict[str, Any]]:
    """The control plane runs RBAC without the Node authorizer: bind ``system:node`` to the node."""
    return [{
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "hisparse-dev:real-node"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": f"system:node:{NODE_NAME}"}],
    }]


def kubernetes_endpoints(ports: Ports) -> list[dict[str, Any]]:
    """The ``kubernetes`` Service's endpoint at the node IP, where pods reach the apiserver (the
    control plane runs with ``--endpoint-reconciler-type=none``: its own address is loopback)."""
    return [{
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes",
                                "endpointslice.kubernetes.io/managed-by": "hisparse-devcluster"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": ports.apiserver, "protocol": "TCP"}],
    }]


COREDNS_NAME: Final = "coredns"


def corefile() -> str:
    """Cluster names only: no ``forward``, so no query ever leaves the node."""
    return (
        f".:{COREDNS_PORT} {{\n"
        "    errors\n"
        "    health :8080\n"
        "    ready :8181\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
        "        pods insecure\n"
        "        fallthrough in-addr.arpa ip6.arpa\n"
        "    }\n"
        "    cache 30\n"
        "    loadbalance\n"
        "}\n"
    )


def coredns_objects(*, image: str) -> list[dict[str, Any]]:
    """CoreDNS as kubeadm deploys it (RBAC, Corefile, Deployment, ``kube-dns`` Service), pinned to
    the real node, unprivileged on a high port."""
    ns, name = "kube-system", COREDNS_NAME
    labels = {"k8s-app": "kube-dns"}
    rules = [
        {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ]
    container = {
        "name": "coredns",
        "image": image,
        "imagePullPolicy": "Never",
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [{"name": "dns", "containerPort": COREDNS_PORT, "protocol": "UDP"},
                  {"name": "dns-tcp", "containerPort": COREDNS_PORT, "protocol": "TCP"}],
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:coredns"}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns},
         "data": {"Corefile": corefile()}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": name, "namespace": ns, "labels": labels},
         "spec": {
             "replicas": 1,
             "selector": {"matchLabels": labels},
             "template": {
                 "metadata": {"labels": labels},
                 "spec": {
                     "serviceAccountName": name,
                     "dnsPolicy": "Default",
                     "priorityClassName": "system-cluster-critical",
                     **real_node_placement(),
                     "containers": [container],
                     "volumes": [{"name": "config", "configMap": {"name": name}}],
                 },
             },
         }},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": ns, "labels": labels},
         "spec": {"selector": labels, "clusterIP": cluster_dns_ip(),
                  "ports": [{"name": "dns", "port": 53, "targetPort": COREDNS_PORT, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "targetPort": COREDNS_PORT, "protocol": "TCP"}]}},
    ]


def real_node_placement() -> dict[str, Any]:
    """The pod spec fields that put a pod on the real node: its label and a toleration of its taint."""
    return {
        "nodeSelector": dict([NODE_LABEL]),
        "tolerations": [{"key": NODE_TAINT["key"], "operator": "Equal", "value": NODE_TAINT["value"],
                         "effect": NODE_TAINT["effect"]}],
    }


# ---- a small TOML writer (containerd's config; the standard library only reads TOML) ---------------


def toml(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    _toml_table(doc, [], lines)
    return "\n".join(lines).strip() + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def _toml_table(doc: dict[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in doc.items() if isinstance(v, dict)}
    if path and scalars:
        lines.append("[" + ".".join(json.dumps(p) if "." in p else p for p in path) + "]")
    for k, v in scalars.items():
        lines.append(f"{k} = {_toml_value(v)}")
    if scalars:
        lines.append("")
    for k, v in tables.items():
        _toml_table(v, [*path, k], lines)
