"""Credentials and command lines of the control-plane servers.

Command lines are pure functions of the tool paths, the ports and the file
layout under the workdir, so the flags can be read (and tested) in one place.
Every listener is on 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from ._kubeconfig import write_kubeconfig
from hisparse_operator.pki import Pki
from ._tools import Tools
from .nodes import KWOK_ANNOTATION

SERVICE_CIDR = "10.96.0.0/16"
"""``--service-cluster-ip-range``: ClusterIPs come from here (every HiSparseDeployment takes one for its EPP; a /24 runs out at a few hundred)."""
KUBERNETES_SERVICE_IP = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
"""The ``kubernetes`` Service's ClusterIP (the range's first address); in the apiserver's certificate,
since pods on the real node dial it."""
POD_CIDR = "10.244.0.0/16"
"""Pod IPs KWOK writes into pod status (never dialled); kept apart from SERVICE_CIDR."""
LOOPBACK = "127.0.0.1"
ADMIN_USER = "hisparse-dev-admin"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int
    """KWOK's server: /healthz, and the "kubelet" endpoint every fake node advertises."""
    lws_webhook: int
    """LeaderWorkerSet manager's admission webhooks (HTTPS), when it runs."""
    lws_health: int
    """LeaderWorkerSet manager's /healthz and /readyz (HTTP)."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self.names(), astuple(self)))


@dataclass(frozen=True)
class Layout:
    """Where one cluster keeps its files."""

    workdir: Path

    def pki(self, name: str) -> Path:
        return self.workdir / "pki" / name

    def front_proxy(self, name: str) -> Path:
        return self.workdir / "pki" / "front-proxy" / name

    def component_kubeconfig(self, component: str) -> Path:
        return self.workdir / "kubeconfigs" / f"{component}.kubeconfig"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def etcd_data(self) -> Path:
        return self.workdir / "etcd-data"

    @property
    def kwok_stages(self) -> Path:
        return self.workdir / "kwok" / "stages.yaml"

    @property
    def lws_config(self) -> Path:
        return self.workdir / "lws" / "config.yaml"

    @property
    def lws_cert_dir(self) -> Path:
        """``tls.crt``/``tls.key`` of the LWS webhook server (controller-runtime's fixed names)."""
        return self.workdir / "lws" / "certs"

    @property
    def lws_webhooks(self) -> Path:
        return self.workdir / "lws" / "webhooks.yaml"

    @property
    def crds(self) -> Path:
        return self.workdir / "crds"

    @property
    def egress_socket(self) -> Path:
        """The apiserver's egress proxy listens here (see :mod:`.realnode.egress`)."""
        return self.workdir / "egress.sock"

    @property
    def egress_config(self) -> Path:
        """The apiserver's ``--egress-selector-config-file``."""
        return self.workdir / "egress-selector.yaml"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"


def make_credentials(layout: Layout, server: str) -> None:
    """Issue every certificate and kubeconfig the servers and the admin use."""
    pki = Pki(layout.pki(""))
    pki.issue(
        "apiserver", "kube-apiserver",
        server_ips=(LOOPBACK, KUBERNETES_SERVICE_IP),
        server_dns=("localhost", "kubernetes", "kubernetes.default",
                    "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"),
    )
    pki.issue("kwok-server", "kwok", server_ips=(LOOPBACK,))
    # The LWS manager's webhook server; the apiserver dials it at 127.0.0.1 with our CA.
    lws = pki.issue("lws-webhook", "lws-webhook", server_ips=(LOOPBACK,))
    layout.lws_cert_dir.mkdir(parents=True, exist_ok=True)
    (layout.lws_cert_dir / "tls.crt").write_bytes(lws.cert.read_bytes())
    (layout.lws_cert_dir / "tls.key").write_bytes(lws.key.read_bytes())
    (layout.lws_cert_dir / "tls.key").chmod(0o600)
    pki.service_account_keys()
    # The aggregation layer's front proxy has its own CA, as kubeadm sets it up;
    # components read it from kube-system/extension-apiserver-authentication.
    Pki(layout.front_proxy(""), ca_name="hisparse-dev-front-proxy-ca").issue(
        "front-proxy-client", "front-proxy-client", client=True
    )
    # Components use the identities the bootstrap RBAC policy grants rights to;
    # KWOK and the LWS manager have no such role, so they are cluster admins.
    users = {
        "admin": (ADMIN_USER, ("system:masters",)),
        "controller-manager": ("system:kube-controller-manager", ()),
        "scheduler": ("system:kube-scheduler", ()),
        "kwok": ("kwok-controller", ("system:masters",)),
        "lws": ("lws-controller-manager", ("system:masters",)),
    }
    for stem, (user, groups) in users.items():
        cert = pki.issue(f"{stem}-client", user, organizations=groups, client=True)
        path = layout.admin_kubeconfig if stem == "admin" else layout.component_kubeconfig(stem)
        write_kubeconfig(path, server=server, ca=pki.ca.cert, client=cert, user=user)


def etcd(tools: Tools, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://{LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return [
        str(tools.etcd),
        "--name=hisparse-dev",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=hisparse-dev={peer}",
        "--initial-cluster-state=new",
        # Test data: durability across power loss is not worth the fsync latency.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def kube_apiserver(tools: Tools, layout: Layout, ports: Ports) -> list[str]:
    pki, fp = layout.pki, layout.front_proxy
    return [
        str(tools.kube_apiserver),
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={pki('apiserver-generated')}",
        f"--tls-cert-file={pki('apiserver.crt')}",
        f"--tls-private-key-file={pki('apiserver.key')}",
        f"--client-ca-file={pki('ca.crt')}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki('sa.pub')}",
        f"--service-account-signing-key-file={pki('sa.key')}",
        "--authorization-mode=RBAC",
        f"--requestheader-client-ca-file={fp('ca.crt')}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={fp('front-proxy-client.crt')}",
        f"--proxy-client-key-file={fp('front-proxy-client.key')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Webhook Services, kubelets and the pod/service proxy through the egress proxy, which reaches
        # the real node's namespace and the host's loopback and nothing else (realnode/plan.py).
        f"--egress-selector-config-file={layout.egress_config}",
        "--allow-privileged=true",
        # MutatingAdmissionPolicy (beta, off by default in 1.35): e2e tests change what a controller
        # creates at admission, as a cluster's own policies would (a parity Job that exits without its
        # summary, in e2e/manual/test_e2e_cpu_example_gates.py). Nothing else uses it.
        "--feature-gates=MutatingAdmissionPolicy=true",
        "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
        # Logs/exec reach "kubelets" (KWOK, on loopback) with a verified cert.
        f"--kubelet-certificate-authority={pki('ca.crt')}",
        f"--kubelet-client-certificate={pki('admin-client.crt')}",
        f"--kubelet-client-key={pki('admin-client.key')}",
        # The kubernetes Service would get 127.0.0.1 endpoints, which
        # Endpoints validation rejects; nothing in-cluster dials it anyway.
        "--endpoint-reconciler-type=none",
        # Bounds graceful shutdown to ~2s even while clients hold watches
        # (otherwise the HTTP server waits up to the 60s request timeout).
        "--shutdown-send-retry-after=true",
        "--profiling=false",
    ]


CONTROLLER_MANAGER_API_QPS = 200
CONTROLLER_MANAGER_API_BURST = 400
"""``--kube-api-qps``/``--kube-api-burst`` of kube-controller-manager (defaults 20/30). With
``--use-service-account-credentials`` each controller has a client, and a rate limiter, of its own; the
deployment controller's 20 requests/s (a ReplicaSet create and several status updates per Deployment)
paced a burst of hundreds of Deployments: 200 HiSparseDeployments' objects written directly became
available in 93 s instead of 160 s with the flags below (``e2e/BENCHMARKS.md``). Large clusters and
Kubernetes' own scalability tests raise these limits likewise."""

CONTROLLER_MANAGER_CONCURRENT_SYNCS = 10
"""``--concurrent-deployment-syncs``, ``--concurrent-replicaset-syncs`` and
``--concurrent-service-endpoint-syncs`` (default 5 each): workers per controller, so a burst of
hundreds of Deployments is not served five at a time."""

SCHEDULER_API_QPS = 200
SCHEDULER_API_BURST = 400
"""kube-scheduler's client limits (defaults 50/100): a burst of hundreds of pods is bound (one
request each) plus one Event each."""


def kube_controller_manager(tools: Tools, layout: Layout, ports: Ports) -> list[str]:
    kc = layout.component_kubeconfig("controller-manager")
    pki = layout.pki
    return [
        str(tools.kube_controller_manager),
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--leader-elect=false",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.controller_manager}",
        f"--cert-dir={pki('controller-manager-generated')}",
        f"--service-account-private-key-file={pki('sa.key')}",
        f"--root-ca-file={pki('ca.crt')}",
        # One ServiceAccount per controller, as kubeadm sets it up, so RBAC applies.
        "--use-service-account-credentials=true",
        f"--cluster-signing-cert-file={pki('ca.crt')}",
        f"--cluster-signing-key-file={pki('ca.key')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--node-monitor-grace-period={NODE_MONITOR_GRACE_S}s",
        f"--kube-api-qps={CONTROLLER_MANAGER_API_QPS}",
        f"--kube-api-burst={CONTROLLER_MANAGER_API_BURST}",
        f"--concurrent-deployment-syncs={CONTROLLER_MANAGER_CONCURRENT_SYNCS}",
        f"--concurrent-replicaset-syncs={CONTROLLER_MANAGER_CONCURRENT_SYNCS}",
        f"--concurrent-service-endpoint-syncs={CONTROLLER_MANAGER_CONCURRENT_SYNCS}",
        "--profiling=false",
    ]


def kube_scheduler(tools: Tools, layout: Layout, ports: Ports) -> list[str]:
    kc = layout.component_kubeconfig("scheduler")
    return [
        str(tools.kube_scheduler),
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--leader-elect=false",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.scheduler}",
        # Deprecated like --kubeconfig and --leader-elect above, and honoured while there is no --config.
        f"--kube-api-qps={SCHEDULER_API_QPS}",
        f"--kube-api-burst={SCHEDULER_API_BURST}",
        "--profiling=false",
    ]


KWOK_NODE_LEASE_DURATION_S = 120
"""KWOK keeps each fake node's Lease in kube-node-lease, renewed every duration/4 = 30 s. KWOK's own
default (0) keeps no leases, and its node-heartbeat-with-lease Stage writes node status only every
10-20 minutes, so the node lifecycle controller would mark nodes unhealthy after its grace period and
their Running pods unready, which KWOK's pod Stages never undo. A kubelet's 40 s (renewal every 10 s)
is 100 writes/s for 1,000 fake nodes from one KWOK process; on 2 cores that fell behind the default
50 s grace while a fleet converged. (A KwokConfiguration document in ``--config`` could raise KWOK's
lease parallelism instead, but it drops KWOK's defaults for every option it leaves out.)"""

NODE_MONITOR_GRACE_S = 2 * KWOK_NODE_LEASE_DURATION_S
"""``--node-monitor-grace-period``: a node is unhealthy after this long without a lease renewal,
i.e. after about 8 missed renewals (a kubelet's defaults allow 5)."""


def kwok(tools: Tools, layout: Layout, ports: Ports) -> list[str]:
    # No client QPS flags: KWOK 0.8 gives its client an always-allow rate limiter.
    return [
        str(tools.kwok),
        f"--kubeconfig={layout.component_kubeconfig('kwok')}",
        f"--config={layout.kwok_stages}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={'='.join(KWOK_ANNOTATION)}",
        # Nodes advertise KWOK's own loopback server as their kubelet endpoint.
        f"--node-ip={LOOPBACK}",
        f"--node-port={ports.kwok}",
        f"--server-address={LOOPBACK}:{ports.kwok}",
        f"--tls-cert-file={layout.pki('kwok-server.crt')}",
        f"--tls-private-key-file={layout.pki('kwok-server.key')}",
        f"--cidr={POD_CIDR}",
        f"--node-lease-duration-seconds={KWOK_NODE_LEASE_DURATION_S}",
    ]


def lws_configuration(layout: Layout, ports: Ports) -> dict[str, object]:
    """The LWS manager's ``--config``: webhooks on loopback with our certificate, no leader
    election, no internal cert rotation (it would write a Secret and patch the webhook
    configurations of an in-cluster Service that does not exist here), no metrics server."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": LOOPBACK, "port": ports.lws_webhook, "certDir": str(layout.lws_cert_dir)},
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{ports.lws_health}"},
        "metrics": {"bindAddress": "0"},
    }


def lws_manager(tools: Tools, layout: Layout, ports: Ports) -> list[str]:
    if tools.lws_manager is None:
        raise ValueError("the LWS manager is not built (e2e/tools/build.sh builds it)")
    return [
        str(tools.lws_manager),
        f"--kubeconfig={layout.component_kubeconfig('lws')}",
        f"--config={layout.lws_config}",
        "--zap-log-level=info",
    ]
