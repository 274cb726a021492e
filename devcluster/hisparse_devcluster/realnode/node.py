"""One real node beside the KWOK nodes: containerd, runc, the CNI bridge, a kubelet, kube-proxy and
CoreDNS, all in a network namespace of its own (see :mod:`.plan` for the layout).

    node = RealNode(cluster).start()
    node.import_image(Path("app.tar"))          # docker-archive or OCI tar, into containerd's k8s.io
    ...                                         # pods with real_node_placement() run there
    node.stop()                                 # nothing left: processes, mounts, cgroups, netns

``RealNode.attach(cluster)`` finds a node another process started (``<workdir>/realnode/state.json``).
A start that fails at any step undoes everything it did and raises :class:`RealNodeError`, whose
message names the step, the cause and the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from hisparse_operator.pki import CertFiles, issue_leaf, pem_cert, pem_key
from .. import _procs, versions
from .._components import Layout
from ..cluster import ClusterError, _https_get
from .._kubeconfig import write_kubeconfig
from .._tools import Tools, ToolsNotBuiltError
from . import host, image_store, plan
from .archive import write_image_archive
from .plan import NODE_IP, NODE_LABEL, NODE_NAME, NODE_TAINT, Names, Ports

if TYPE_CHECKING:
    from ..cluster import Cluster

__all__ = ["HostProblem", "NodeTimeouts", "RealNode", "RealNodeError", "check_host", "host_problems"]

STATE_FILE: Final = "state.json"
IMAGE_NAMESPACE: Final = "k8s.io"
"""containerd namespace the CRI plugin (so the kubelet) sees."""
COREDNS_IMAGE: Final = f"localhost/coredns:{versions.COREDNS_VERSION.removeprefix('v')}"
# Start order; stop goes the other way.
_ORDER: Final = ("socat-api-host", "socat-api-node", "socat-kubelet-node", "socat-kubelet-host",
                 "containerd", "kubelet", "kube-proxy")
# Debian packages (scripts/setup installs them) and the executables each provides.
_PACKAGES: Final = {
    "containerd": ("containerd", "ctr", "containerd-shim-runc-v2"),
    "runc": ("runc",),
    "socat": ("socat",),
    "nftables": ("nft",),
    "iproute2": ("ip",),
    "util-linux": ("nsenter", "umount"),
}
_CNI_PLUGINS: Final = ("bridge", "host-local", "loopback")


class RealNodeError(ClusterError):
    """The real node could not start or stop; the message names the step, the cause and the fix."""

    def __init__(self, step: str, cause: str, fix: str) -> None:
        self.step, self.cause, self.fix = step, cause, fix
        super().__init__(f"real node: {step} failed: {cause}\nfix: {fix}")


@dataclass(frozen=True)
class NodeTimeouts:
    """Seconds to wait for each step (a 2-core machine that is also compiling can be slow)."""

    containerd: float = 60.0
    register: float = 120.0
    """kubelet start -> Node Ready."""
    kube_proxy: float = 60.0
    coredns: float = 120.0
    stop_grace: float = 15.0


@dataclass(frozen=True)
class HostProblem:
    """Something that keeps this host from running the node."""

    cause: str
    fix: str
    installable: bool
    """True when installing or building something fixes it; False when this host cannot run the
    node at all (not root, no cgroup v1 hierarchy)."""


def host_problems(tools: Tools | None = None) -> list[HostProblem]:
    """What keeps this host from running the node; empty when it can."""
    problems: list[HostProblem] = []
    if os.geteuid() != 0:
        problems.append(HostProblem("the real node needs root (network namespaces, mounts, cgroups)",
                                    "run as root, or pass --no-real-node", installable=False))
    missing = sorted({pkg for pkg, exes in _PACKAGES.items() for exe in exes if shutil.which(exe) is None})
    cni = [p for p in _CNI_PLUGINS if not (Path(plan.CNI_BIN_DIR) / p).is_file()]
    if cni:
        missing.append("containernetworking-plugins")
    if missing:
        problems.append(HostProblem(f"missing Debian packages: {', '.join(missing)}",
                                    f"run scripts/setup (or: apt-get install {' '.join(missing)}), "
                                    "or pass --no-real-node", installable=True))
    if not host.cgroup_v1_hybrid():
        problems.append(HostProblem("this host has no cgroup v1 memory hierarchy; the node's kubelet and "
                                    "runc configuration is written for a cgroup v1 (hybrid) host",
                                    "use a cgroup v1 host, or pass --no-real-node", installable=False))
    if tools is None:
        try:
            tools = Tools.locate()
        except ToolsNotBuiltError as e:
            problems.append(HostProblem(str(e).splitlines()[0], "run e2e/tools/build.sh", installable=True))
            return problems
    absent = [n for n, p in (("kubelet", tools.kubelet), ("kube-proxy", tools.kube_proxy),
                             ("pause", tools.pause), ("coredns", tools.coredns)) if p is None]
    if absent:
        problems.append(HostProblem(f"not built: {', '.join(absent)}",
                                    "run e2e/tools/build.sh kubernetes coredns (scripts/setup does), "
                                    "or pass --no-real-node", installable=True))
    return problems


def check_host(tools: Tools | None = None) -> None:
    """Raise :class:`RealNodeError` (step "check the host") unless this host can run the node."""
    problems = host_problems(tools)
    if problems:
        raise RealNodeError("check the host", "; ".join(p.cause for p in problems),
                            "; ".join(dict.fromkeys(p.fix for p in problems)))


@dataclass
class _State:
    instance: str
    ports: dict[str, int]
    detached: bool
    processes: list[_procs.ProcRecord] = field(default_factory=list)
    containerd_root: str = ""
    """The node's containerd root: the machine's image store (:mod:`.image_store`) or its own folder."""

    def save(self, path: Path) -> None:
        data = {"instance": self.instance, "ports": self.ports, "detached": self.detached,
                "processes": [p.to_json() for p in self.processes], "containerd_root": self.containerd_root}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> _State | None:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        return cls(instance=data["instance"], ports={k: int(v) for k, v in data["ports"].items()},
                   detached=bool(data["detached"]),
                   processes=[_procs.ProcRecord.from_json(p) for p in data["processes"]],
                   containerd_root=str(data.get("containerd_root", "")))


class RealNode:
    """The real node of one dev cluster (see the module docstring)."""

    name: Final = NODE_NAME
    label: Final = NODE_LABEL
    taint: Final = NODE_TAINT
    ip: Final = NODE_IP

    def __init__(self, cluster: Cluster, *, tools: Tools | None = None,
                 timeouts: NodeTimeouts | None = None) -> None:
        self.cluster = cluster
        self.names = Names.for_workdir(cluster.workdir)
        self.timeouts = timeouts or NodeTimeouts()
        self._tools = tools
        self._state: _State | None = _State.load(self._state_path)
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    @classmethod
    def attach(cls, cluster: Cluster, *, timeouts: NodeTimeouts | None = None) -> RealNode | None:
        """The node started from ``cluster``'s workdir, or None when there is none."""
        node = cls(cluster, timeouts=timeouts)
        return node if node._state is not None else None

    # ---- accessors ------------------------------------------------------------------------------

    @property
    def containerd_address(self) -> Path:
        """containerd's socket (for ``ctr --address``); images the kubelet sees are in ``k8s.io``."""
        return self.names.containerd_sock

    @property
    def netns(self) -> str:
        return self.names.netns

    @property
    def processes(self) -> tuple[_procs.ProcRecord, ...]:
        return tuple(self._state.processes) if self._state else ()

    def status(self) -> dict[str, bool]:
        return {p.name: _procs.is_running(p) for p in self.processes}

    def log_path(self, name: str) -> Path:
        return self.cluster.workdir / "logs" / f"realnode-{name}.log"

    def kubelet_get(self, path: str, timeout: float = 10.0) -> tuple[int, str]:
        """GET ``path`` (``/configz``, ``/healthz``) from the kubelet's own API as the apiserver reaches it: its
        serving certificate checked against the cluster CA, the apiserver's kubelet client certificate. (The
        apiserver's node proxy refuses this node: its name, ``localhost``, is a loopback address.)"""
        if self._state is None:
            raise RealNodeError("the real node is not running: nothing answers on the kubelet's port")
        # The admin client certificate is the one the apiserver is given for kubelets.
        return _https_get(self._state.ports["kubelet"], path, self.cluster.admin_ssl_context(), timeout)

    @property
    def _state_path(self) -> Path:
        return self.names.dir / STATE_FILE

    # ---- images ---------------------------------------------------------------------------------

    def ctr(self, *args: str, timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        return host.run("ctr", f"--address={self.containerd_address}", f"--namespace={IMAGE_NAMESPACE}",
                        *args, check=check, timeout=timeout)

    def import_image(self, archive: Path) -> list[str]:
        """Load a docker-archive or OCI tar into the node's containerd (namespace ``k8s.io``);
        returns the image names it held. Pods refer to them with ``imagePullPolicy: Never`` or
        ``IfNotPresent`` (nothing can be pulled here)."""
        archive = Path(archive)
        if not archive.is_file():
            raise RealNodeError("import an image", f"{archive} is not a file",
                                "pass the path of a docker-archive or OCI image tar")
        store = self._store_base()
        if store is not None:
            try:
                wanted = image_store.archive_digests(archive)
            except (OSError, ValueError, KeyError, tarfile.TarError):
                wanted = {}  # not an image archive: ctr's own refusal below says so
            if image_store.held(self.ctr, wanted):  # imported by an earlier node of this machine, unchanged
                image_store.record_use(store, list(wanted))
                return list(wanted)
        before = set(self.images())
        try:
            # containerd stores the layers, then unpacks them: minutes for the CPU runtime image (~10 GB).
            self.ctr("images", "import", str(archive), timeout=max(300.0, archive.stat().st_size / (8 << 20)))
        except host.HostError as e:
            raise RealNodeError("import an image", f"ctr images import {archive}: {e}",
                                "check that the file is a docker-archive or OCI image tar "
                                "(skopeo copy ... docker-archive:FILE:NAME writes one)") from e
        names = _archive_names(archive)
        missing = [n for n in names if n not in self.images()]
        if missing or not names:
            new = sorted(set(self.images()) - before)
            raise RealNodeError("import an image", f"{archive}: imported {new or 'nothing'}, "
                                f"expected {names or 'a named image'}",
                                "give the image a name in the archive (RepoTags, or the OCI "
                                "annotation org.opencontainers.image.ref.name)")
        if store is not None:
            image_store.record_use(store, names)
        return names

    def trust_registry(self, host: str, ca_pem: bytes) -> Path:
        """Configure containerd to pull from the registry ``host`` (``<ip>:<port>``, reachable from inside the
        node's network namespace) over TLS signed by ``ca_pem``, as a cluster's nodes are configured for a
        private registry; read at each pull, no restart. Returns the host's directory (removed by
        :meth:`distrust_registry`)."""
        d = self.names.registry_hosts_dir / host
        d.mkdir(parents=True, exist_ok=True)
        (d / "ca.crt").write_bytes(ca_pem)
        (d / "hosts.toml").write_text(plan.registry_hosts(f"https://{host}", d / "ca.crt"))
        return d

    def distrust_registry(self, host: str) -> None:
        shutil.rmtree(self.names.registry_hosts_dir / host, ignore_errors=True)

    def images(self) -> list[str]:
        out = self.ctr("images", "list", "--quiet").stdout
        return [ln.strip() for ln in out.splitlines() if ln.strip()]

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> RealNode:
        """Bring the node up and wait until it is Ready, kube-proxy has synced and CoreDNS serves."""
        if self._state is not None and any(_procs.is_running(p) for p in self._state.processes):
            raise RealNodeError("start", f"a real node is already running from {self.names.dir}",
                                "stop it first (hisparse dev down, or RealNode.attach(cluster).stop())")
        if self._state is not None or host.netns_exists(self.names):
            self._teardown()  # what a crashed run left
        check_host(self._tools)
        tools = self._tools or Tools.locate()
        ports = Ports(apiserver=_port_of(self.cluster.server), kubelet=_free_port())
        self._state = _State(instance=self.names.instance, ports={"apiserver": ports.apiserver,
                                                                 "kubelet": ports.kubelet},
                             detached=self.cluster.detached)
        self.names.dir.mkdir(parents=True, exist_ok=True)
        self._state.save(self._state_path)
        try:
            store = image_store.claim(self._state_path, alive=_node_alive)
            self._state.containerd_root = str(store or self.names.containerd_root)
            self._state.save(self._state_path)
            with self._step("write the node's certificates and configuration",
                            f"see the error above; the files are under {self.names.dir}"):
                self._write_files(tools, ports)
            with self._step("create the network namespace and cgroup root",
                            "check that iproute2 works here (ip netns add) and /sys/fs/cgroup is writable"):
                host.create_netns(self.names)
                host.create_cgroup_root(self.names)
            with self._step("start the socat bridges", "see the socat logs under logs/"):
                self.names.run_dir.mkdir(parents=True, exist_ok=True)
                for name, argv in plan.socats(self.names, ports).items():
                    self._spawn(name, argv)
            with self._step("start containerd", f"see {self.log_path('containerd')}"):
                self._start_containerd(tools)
            with self._step("import the pause and CoreDNS images", "see the error above"):
                self._import_node_images(tools)
            with self._step("register the node (kubelet)",
                            f"see {self.log_path('kubelet')} (and the kube-apiserver log)"):
                self.cluster.apply(plan.node_rbac())
                self._start_kubelet(tools)
            with self._step("start kube-proxy", f"see {self.log_path('kube-proxy')}"):
                self.cluster.apply(plan.kubernetes_endpoints(ports))
                self._start_kube_proxy(tools)
            with self._step("start CoreDNS", "see `kubectl -n kube-system describe pod -l k8s-app=kube-dns`"):
                self._start_coredns()
        except BaseException as e:
            try:
                self._teardown()
            except RealNodeError as cleanup:
                e.add_note(f"cleanup after the failed start also failed: {cleanup}")
            raise
        return self

    def enforce_network_policies(self) -> None:
        """Start kube-router's network policy controller in the node's namespace, so NetworkPolicies hold
        for the node's pods (iptables in the forward path of the bridge, hence ``br_netfilter`` on); returns
        once it serves /healthz. Traffic from the node itself (probes, the tests' port-forwards) stays
        allowed, as kube-router allows a pod's own node."""
        tools = self._tools or Tools.locate()
        if tools.kube_router is None:
            raise RealNodeError("start kube-router", "its binary is not built",
                                "run e2e/tools/build.sh kube_router (scripts/setup does)")
        missing = [exe for exe in ("iptables", "iptables-save", "iptables-restore", "ipset") if shutil.which(exe) is None]
        if missing:
            raise RealNodeError("start kube-router", f"missing {', '.join(missing)}",
                                "install Debian's iptables and ipset (scripts/setup does)")
        n, layout = self.names, Layout(self.cluster.workdir)
        with self._step("start kube-router", f"see {self.log_path('kube-router')}"):
            issue = _issuer(layout.pki("ca.crt"), layout.pki("ca.key"), n.pki)
            client = issue("kube-router-client", plan.KUBE_ROUTER_USER, client=True)
            kubeconfig = n.config("kube-router.kubeconfig")
            write_kubeconfig(kubeconfig, server=f"https://127.0.0.1:{_port_of(self.cluster.server)}",
                             ca=layout.pki("ca.crt"), client=client, user=plan.KUBE_ROUTER_USER)
            self.cluster.apply(plan.kube_router_rbac())
            host.run(*plan.in_netns(n, ["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"]))
            rec = self._spawn("kube-router", plan.kube_router(str(tools.kube_router), n, kubeconfig=kubeconfig))
            self._wait("kube-router's /healthz", rec, self.timeouts.kube_proxy,
                       self._healthz_in_netns(plan.KUBE_ROUTER_HEALTH_PORT))

    def stop(self, *, clean: bool = False) -> None:
        """Stop everything and check that nothing is left; ``clean`` also removes configs and logs."""
        self._teardown()
        if clean:
            host.remove_tree(self.names.dir)

    def restart_kubelet(self) -> None:
        """Stop the kubelet and start it again with the same flags; wait until the node is Ready."""
        rec = self._proc("kubelet")
        _procs.stop(rec, grace_s=self.timeouts.stop_grace, reap=self._reaper(rec))
        new = self._spawn("kubelet", rec.argv)
        self._wait_ready(new, since=time.time())

    def leftovers(self) -> dict[str, list[str]]:
        """What of this node is still on the host; empty once stopped."""
        n = self.names
        procs = sorted({*(p.pid for p in self.processes if _procs.is_running(p)),
                        *host.shim_pids(n), *host.cgroup_pids(n), *host.netns_pids(n)})
        left = {
            "processes": [f"{pid} {' '.join(host._cmdline(pid))[:120]}" for pid in procs],
            "mounts": [str(p) for p in host.mounts_under(n.owned_paths)],
            "cgroups": [str(p) for p in host.cgroup_dirs(n)],
            "netns": [n.netns] if host.netns_exists(n) else [],
            "links": host.host_links(n),
            "container log links": [str(p) for p in host.container_log_links(n)],
        }
        return {k: v for k, v in left.items() if v}

    # ---- steps ----------------------------------------------------------------------------------

    @contextmanager
    def _step(self, step: str, fix: str) -> Iterator[None]:
        try:
            yield
        except RealNodeError:
            raise
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as e:
            raise RealNodeError(step, f"{type(e).__name__}: {e}", fix) from e

    def _write_files(self, tools: Tools, ports: Ports) -> None:
        n, layout = self.names, Layout(self.cluster.workdir)
        for d in (n.pki, n.cni_conf_dir, n.cni_ipam_dir, n.images, n.pod_logs, n.kubelet_root, n.registry_hosts_dir):
            d.mkdir(parents=True, exist_ok=True)
        ca_cert, ca_key = layout.pki("ca.crt"), layout.pki("ca.key")
        issue = _issuer(ca_cert, ca_key, n.pki)
        server = f"https://127.0.0.1:{ports.apiserver}"
        kubelet_client = issue("kubelet-client", f"system:node:{NODE_NAME}", organizations=("system:nodes",),
                               client=True)
        kubelet_serving = issue("kubelet-serving", f"system:node:{NODE_NAME}",
                                server_ips=(NODE_IP, "127.0.0.1"), server_dns=(NODE_NAME,))
        proxy_client = issue("kube-proxy-client", "system:kube-proxy", client=True)
        write_kubeconfig(n.config("kubelet.kubeconfig"), server=server, ca=ca_cert, client=kubelet_client,
                         user=f"system:node:{NODE_NAME}")
        write_kubeconfig(n.config("kube-proxy.kubeconfig"), server=server, ca=ca_cert, client=proxy_client,
                         user="system:kube-proxy")
        assert self._state is not None
        n.config("containerd.toml").write_text(plan.containerd_config(
            n, pause_image=_pause_image(tools), runc=str(shutil.which("runc")),
            root=Path(self._state.containerd_root or n.containerd_root)))
        (n.cni_conf_dir / "10-hisparse.conflist").write_text(json.dumps(plan.cni_config(n), indent=2))
        n.config("kubelet.yaml").write_text(yaml.safe_dump(plan.kubelet_config(
            n, ports, ca_file=ca_cert, cert_file=kubelet_serving.cert, key_file=kubelet_serving.key)))
        n.config("kube-proxy.yaml").write_text(yaml.safe_dump(plan.kube_proxy_config(
            n, kubeconfig=n.config("kube-proxy.kubeconfig"))))
        n.config("resolv.conf").write_text(plan.RESOLV_CONF)

    def _start_containerd(self, tools: Tools) -> None:
        rec = self._spawn("containerd", plan.containerd(str(shutil.which("containerd")), self.names))

        def up() -> bool:
            return self.names.containerd_sock.exists() and host.run(
                "ctr", f"--address={self.containerd_address}", "version", check=False, timeout=10).returncode == 0

        self._wait("containerd to serve its socket", rec, self.timeouts.containerd, up)

    def _import_node_images(self, tools: Tools) -> None:
        assert tools.pause is not None and tools.coredns is not None
        with tempfile.TemporaryDirectory(prefix="rootfs-", dir=self.names.images) as tmp:
            for ref, binary, user in ((_pause_image(tools), tools.pause, "65535:65535"),
                                      (COREDNS_IMAGE, tools.coredns, "65532:65532")):
                root = Path(tmp) / binary.name
                root.mkdir()
                shutil.copy2(binary, root / binary.name)
                archive = write_image_archive(self.names.images / f"{binary.name}.tar", ref, root,
                                              entrypoint=[f"/{binary.name}"], user=user)
                self.import_image(archive)

    def _start_kubelet(self, tools: Tools) -> None:
        assert tools.kubelet is not None
        since = time.time()
        rec = self._spawn("kubelet", plan.kubelet(str(tools.kubelet), self.names))
        self._wait_ready(rec, since=since)

    def _wait_ready(self, rec: _procs.ProcRecord, *, since: float) -> None:
        def ready() -> bool:
            res = self.cluster.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            if res.returncode:
                return False
            for c in json.loads(res.stdout).get("status", {}).get("conditions", []):
                if c["type"] == "Ready":
                    return bool(c["status"] == "True" and _rfc3339(c["lastHeartbeatTime"]) >= since - 1)
            return False

        self._wait(f"node {NODE_NAME} to register and become Ready", rec, self.timeouts.register, ready)

    def _start_kube_proxy(self, tools: Tools) -> None:
        assert tools.kube_proxy is not None
        rec = self._spawn("kube-proxy", plan.kube_proxy(str(tools.kube_proxy), self.names))
        self._wait("kube-proxy to sync its rules (/healthz)", rec, self.timeouts.kube_proxy,
                   self._healthz_in_netns(plan.KUBE_PROXY_HEALTHZ_PORT))

    def _healthz_in_netns(self, port: int) -> Callable[[], bool]:
        """A check that ``http://127.0.0.1:<port>/healthz`` answers 200 inside the node's namespace (where
        kube-proxy and kube-router serve it)."""
        probe = plan.in_netns(self.names, [
            sys.executable, "-c",
            "import sys, urllib.request\n"
            f"try: sys.exit(urllib.request.urlopen('http://127.0.0.1:{port}/healthz', timeout=2).status != 200)\n"
            "except OSError: sys.exit(1)"])
        return lambda: host.run(*probe, check=False).returncode == 0

    def _start_coredns(self) -> None:
        self.cluster.apply(plan.coredns_objects(image=COREDNS_IMAGE))
        t = self.timeouts.coredns
        res = self.cluster.kubectl("-n", "kube-system", "rollout", "status", f"deployment/{plan.COREDNS_NAME}",
                                   f"--timeout={int(t)}s", check=False, timeout=t + 30)
        if res.returncode:
            pods = self.cluster.kubectl("-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-dns",
                                        "-o", "wide", check=False).stdout
            raise RealNodeError("start CoreDNS", f"not available within {t:.0f}s: {res.stderr.strip()}\n{pods}",
                                "see `kubectl -n kube-system describe pod -l k8s-app=kube-dns` and "
                                f"{self.log_path('kubelet')}")

    # ---- teardown -------------------------------------------------------------------------------

    def _teardown(self) -> None:
        n, grace = self.names, self.timeouts.stop_grace
        errors: list[str] = []
        recs = {p.name: p for p in self.processes}

        def stop(name: str) -> None:
            if name in recs:
                try:
                    _procs.stop(recs[name], grace_s=grace, reap=self._reaper(recs[name]))
                except RuntimeError as e:
                    errors.append(str(e))

        # The kubelet first, so it restarts nothing; then the containers (by cgroup: every process
        # of every pod), containerd, and the shims that outlive it.
        stop("kube-router")
        stop("kube-proxy")
        stop("kubelet")
        host.kill_all(host.cgroup_pids(n))
        host.wait_gone(host.cgroup_pids(n), 10.0)
        store = self._store_base()
        # A containerd that never started left the store as it was; one that did must leave images only.
        store_clean = store is not None and ("containerd" not in recs
                                             or self._leave_images_only(store, recs["containerd"]))
        stop("containerd")
        host.kill_all(host.shim_pids(n))
        host.wait_gone(host.shim_pids(n), 10.0)
        for name in reversed(_ORDER[:4]):
            stop(name)
        host.kill_all(host.netns_pids(n))
        host.wait_gone(host.netns_pids(n), 10.0)
        owned = n.owned_paths + ((store / "root",) if store is not None else ())
        still = host.unmount_all(owned)
        if still:
            errors.append(f"still mounted: {', '.join(map(str, still))}")
        try:
            host.delete_netns(n)
        except host.HostError as e:
            errors.append(str(e))
        left_cgroups = host.remove_cgroup_root(n)
        if left_cgroups:
            errors.append(f"cgroups not removable: {', '.join(map(str, left_cgroups))}")
        for link in host.container_log_links(n):
            link.unlink(missing_ok=True)
        for d in (n.run_dir, n.kubelet_root, n.containerd_root, n.cni_ipam_dir, n.pod_logs):
            host.remove_tree(d)
        if store is not None:
            image_store.release(store, self._state_path, clean=store_clean and not still)
        self._forget_node_objects()
        left = self.leftovers()
        if errors or left:
            raise RealNodeError("tear down", "; ".join(errors) or f"left behind: {left}",
                                f"see the logs under {self.cluster.workdir / 'logs'}; run the stop again "
                                "once the processes named are gone")
        self._state_path.unlink(missing_ok=True)
        self._state = None
        self._children.clear()

    def _forget_node_objects(self) -> None:
        """Remove the Node and its pods from the API (when it still answers), so a later start of the
        node in the same cluster finds no stale pods."""
        if not self.cluster.status().get("kube-apiserver"):
            return
        try:
            self.cluster.kubectl("delete", "pods", "--all-namespaces",
                                 f"--field-selector=spec.nodeName={NODE_NAME}", "--force", "--grace-period=0",
                                 "--wait=false", check=False, timeout=60)
            self.cluster.kubectl("delete", "node", NODE_NAME, "--ignore-not-found", "--wait=false", check=False,
                                 timeout=60)
        except subprocess.TimeoutExpired:
            pass  # a slow apiserver: the host is clean either way, and a later start re-registers

    def _store_base(self) -> Path | None:
        """The image store's folder when this node holds it (see :mod:`.image_store`)."""
        if self._state is None or not self._state.containerd_root:
            return None
        return image_store.holder_root(self._state_path, Path(self._state.containerd_root))

    def _leave_images_only(self, store: Path, containerd: _procs.ProcRecord) -> bool:
        """Delete every task and container (pods and sandboxes) through the still-running containerd, and
        the store's stale images; False when that could not be done (the store is then wiped)."""
        if not _procs.is_running(containerd):
            return False
        def ctr(*args: str) -> subprocess.CompletedProcess[str]:
            return self.ctr(*args, check=False, timeout=120)

        try:
            deadline = time.monotonic() + 30
            while containers := ctr("containers", "list", "--quiet").stdout.split():
                if time.monotonic() > deadline:
                    print(f"real node: the image store is wiped, containers {containers} could not be removed",
                          file=sys.stderr)
                    return False
                # The pods' processes are gone: their tasks are deleted (a task that exited already is
                # "not found"), then the containers with their snapshots.
                for task in ctr("tasks", "list", "--quiet").stdout.split():
                    ctr("tasks", "delete", "--force", task)
                ctr("containers", "delete", *containers)
            image_store.remove_unused(store, self.ctr, self.images())
            return True
        except (host.HostError, subprocess.SubprocessError, OSError) as e:
            print(f"real node: the image store is wiped, its containers could not be removed: {e}", file=sys.stderr)
            return False

    # ---- processes ------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str] | tuple[str, ...]) -> _procs.ProcRecord:
        assert self._state is not None
        rec, child = _procs.spawn(name, argv, self.log_path(name), tie_to_parent=not self._state.detached)
        self._children[name] = child
        self._state.processes = [p for p in self._state.processes if p.name != name] + [rec]
        self._state.save(self._state_path)
        return rec

    def _proc(self, name: str) -> _procs.ProcRecord:
        for p in self.processes:
            if p.name == name:
                return p
        raise RealNodeError(name, f"no process named {name} in {self._state_path}", "start the node first")

    def _reaper(self, rec: _procs.ProcRecord) -> Callable[[], object] | None:
        child = self._children.get(rec.name)
        return child.poll if child is not None and child.pid == rec.pid else None

    def _wait(self, what: str, rec: _procs.ProcRecord, timeout: float, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout
        reap = self._reaper(rec)
        while True:
            if reap is not None:
                reap()
            if not _procs.is_running(rec):
                raise RuntimeError(f"{rec.name} exited while waiting for {what}; last lines of {rec.log}:\n"
                                   f"{_procs.log_tail(rec.log)}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}; last lines of "
                                   f"{rec.log}:\n{_procs.log_tail(rec.log)}")
            time.sleep(0.25)


# ---- helpers --------------------------------------------------------------------------------------------


def _issuer(ca_cert: Path, ca_key: Path, out: Path) -> Callable[..., CertFiles]:
    cert = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    key = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)

    def issue(stem: str, cn: str, **kw: Any) -> CertFiles:
        leaf_key, leaf = issue_leaf(key, cert, cn, **kw)  # type: ignore[arg-type]
        files = CertFiles(cert=out / f"{stem}.crt", key=out / f"{stem}.key")
        files.cert.write_bytes(pem_cert(leaf))
        files.key.write_bytes(pem_key(leaf_key))
        files.key.chmod(0o600)
        return files

    return issue


def _node_alive(state: Path) -> bool:
    """Whether the node of ``state`` is running, or still starting (nothing spawned yet)."""
    st = _State.load(state) if state.is_file() else None
    return st is not None and (not st.processes or any(_procs.is_running(p) for p in st.processes))


def _pause_image(tools: Tools) -> str:
    """``localhost/pause:<tag>``, the tag upstream's Makefile gives the pause binary (it prints it)."""
    assert tools.pause is not None
    out = subprocess.run([str(tools.pause), "-v"], capture_output=True, text=True, timeout=10).stdout
    # "pause.c v3.10.1-v1.35.4"
    tag = out.split()[-1].removeprefix("v").split("-")[0] if out.strip() else "unknown"
    return f"localhost/pause:{tag}"


def _archive_names(archive: Path) -> list[str]:
    """Image names an archive carries: docker-archive RepoTags, or OCI index annotations."""
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        if "manifest.json" in names:
            f = tar.extractfile("manifest.json")
            assert f is not None
            return [_normalize(t) for m in json.load(f) for t in (m.get("RepoTags") or [])]
        if "index.json" in names:
            f = tar.extractfile("index.json")
            assert f is not None
            annotations = [m.get("annotations") or {} for m in json.load(f).get("manifests", [])]
            return [_normalize(a.get("io.containerd.image.name") or a["org.opencontainers.image.ref.name"])
                    for a in annotations
                    if a.get("io.containerd.image.name") or a.get("org.opencontainers.image.ref.name")]
    return []


def _normalize(ref: str) -> str:
    """What containerd stores a short name as (``busybox:1`` -> ``docker.io/library/busybox:1``)."""
    first = ref.split("/", 1)[0]
    if "/" not in ref:
        return f"docker.io/library/{ref}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{ref}"
    return ref


def _port_of(server: str) -> int:
    return int(server.rsplit(":", 1)[1])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rfc3339(ts: str) -> float:
    import datetime as dt

    return dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()
