"""A real Kubernetes control plane on loopback, from locally built binaries.

``Cluster.start(workdir)`` runs etcd, kube-apiserver (RBAC on),
kube-controller-manager, kube-scheduler and KWOK as child processes, waits for
each to be healthy, installs the upstream CRDs our objects use and returns a
handle with an admin kubeconfig. ``Cluster.attach(workdir)`` finds the same
cluster from another process through ``<workdir>/state.json``; ``stop()`` ends
every process group and verifies that nothing is left.

Every server listens on 127.0.0.1 only. Nodes are fake: KWOK marks annotated
Node objects Ready and pods bound to them Running, so scheduling, controllers,
garbage collection and admission are all real, but no container ever runs.
"""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from . import _components, _gomod, _procs, faults, nodes, versions
from ._procs import ProcRecord
from ._state import ClusterState
from ._tools import Tools, ToolsNotBuiltError

FIELD_MANAGER = "hisparse-devcluster"
"""Server-side apply field manager for what the harness installs."""

# Start order; stop runs in reverse so clients go before the servers they use.
_ORDER = ("etcd", "apiserver-egress", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
          "lws-manager")
# A start that loses a port race is retried this many times in all.
_START_ATTEMPTS = 3
# Directories and files a start creates in the workdir (and a clean stop removes).
_OWNED = ("pki", "kubeconfigs", "etcd-data", "logs", "kwok", "lws", "crds", "kubeconfig",
          "egress.sock", "egress-selector.yaml", "state.json")
_SUN_PATH_MAX = 107
"""Bytes of a unix socket path (``sun_path`` less its terminating NUL)."""


class ClusterError(RuntimeError):
    """The dev cluster could not start, or a command against it failed."""


class PortTakenError(ClusterError):
    """A server could not bind the free port chosen for it (another process took it first)."""


class KubectlError(ClusterError):
    """``kubectl`` exited non-zero; ``stdout``/``stderr`` hold its output."""

    def __init__(self, argv: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        self.argv = list(argv)
        self.returncode = result.returncode
        self.stdout = result.stdout
        self.stderr = result.stderr
        super().__init__(
            f"kubectl {' '.join(argv)} exited {result.returncode}:\n{result.stderr.strip()}"
        )


@dataclass(frozen=True)
class Timeouts:
    """Seconds to wait for each step before failing with the component's log tail.

    Generous because a 2-core machine that is also compiling can be slow.
    """

    etcd: float = 60.0
    apiserver: float = 180.0
    controllers: float = 120.0
    kwok: float = 60.0
    crds: float = 180.0
    nodes: float = 120.0
    stop_grace: float = 15.0
    """SIGTERM to SIGKILL, per process."""


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _https_get(port: int, path: str, ctx: ssl.SSLContext, timeout: float = 5.0) -> tuple[int, str]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def _http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def _unverified_ctx() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class Cluster:
    """Handle on a running dev cluster. Use :meth:`start` or :meth:`attach`."""

    def __init__(self, state: ClusterState, *, timeouts: Timeouts | None = None) -> None:
        self._state = state
        self.timeouts = timeouts or Timeouts()
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # ---- lifecycle -------------------------------------------------------

    @classmethod
    def start(
        cls,
        workdir: str | Path,
        *,
        tools: Tools | None = None,
        install_crds: bool = True,
        lws: bool = False,
        detach: bool = False,
        timeouts: Timeouts | None = None,
    ) -> Cluster:
        """Start a fresh cluster whose files live in ``workdir``.

        ``lws=True`` also runs the LeaderWorkerSet controller manager (built by
        ``e2e/tools/build.sh``) with its admission webhooks served on loopback, so
        LeaderWorkerSets get their leader and worker pods.

        ``detach=False`` (tests) ties every server to the calling thread: if it
        dies, even by SIGKILL, the kernel terminates them. ``detach=True``
        (``hisparse dev up``) lets them outlive this process; find them again
        with :meth:`attach`.
        """
        wd = Path(workdir).expanduser().resolve()
        wd.mkdir(parents=True, exist_ok=True)
        old = ClusterState.load(wd)
        if old is not None:
            alive = [p.name for p in old.processes if _procs.is_running(p)]
            if alive:
                raise ClusterError(
                    f"a dev cluster is already running from {wd} ({', '.join(alive)}); "
                    "stop it first (hisparse dev down, or Cluster.attach(workdir).stop())"
                )
        tools = tools or Tools.locate()
        if lws and not install_crds:
            raise ClusterError("lws=True needs install_crds=True (the LeaderWorkerSet CRD)")
        if lws and tools.lws_manager is None:
            raise ToolsNotBuiltError(
                "the LeaderWorkerSet manager (lws-manager) is not built: run e2e/tools/build.sh"
            )
        for attempt in range(_START_ATTEMPTS):
            for name in _OWNED:
                _remove(wd / name)
            state = ClusterState(workdir=wd, detached=detach, tools=_tool_paths(tools))
            cluster = cls(state, timeouts=timeouts)
            try:
                cluster._bring_up(tools, install_crds=install_crds, lws=lws)
                return cluster
            except BaseException as e:
                try:
                    cluster.stop()
                except ClusterError as cleanup:
                    e.add_note(f"cleanup after the failed start also failed: {cleanup}")
                # Ports are picked free just before use, but another process can
                # take one in between: start over with fresh ones.
                if not isinstance(e, PortTakenError) or attempt == _START_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def attach(cls, workdir: str | Path, *, timeouts: Timeouts | None = None) -> Cluster:
        """A handle on the cluster another process started in ``workdir``."""
        wd = Path(workdir).expanduser().resolve()
        state = ClusterState.load(wd)
        if state is None:
            raise ClusterError(f"no dev cluster state in {wd} (start one with hisparse dev up)")
        return cls(state, timeouts=timeouts)

    def stop(self, *, clean: bool = False) -> None:
        """Stop every server (reverse start order) and check that none is left.

        The state file is removed so later :meth:`attach` calls fail clearly;
        ``clean=True`` also removes certificates, data and logs.
        """
        errors = []
        # A real node first: it needs the apiserver to leave the API clean.
        from .realnode import RealNode, RealNodeError

        node = RealNode.attach(self)
        if node is not None:
            try:
                node.stop()
            except RealNodeError as e:
                errors.append(str(e))
        for rec in sorted(self._state.processes, key=lambda p: -_ORDER.index(p.name)):
            child = self._children.get(rec.name)
            try:
                _procs.stop(
                    rec,
                    grace_s=self.timeouts.stop_grace,
                    reap=child.poll if child is not None and child.pid == rec.pid else None,
                )
            except RuntimeError as e:
                errors.append(str(e))
        left = self.leftover_processes()
        if errors or left:
            raise ClusterError(f"processes left after stop: {left or errors}")
        self._children.clear()
        _remove(self._state.path)
        if clean:
            for name in _OWNED:
                _remove(self._state.workdir / name)

    def leftover_processes(self) -> dict[str, list[int]]:
        """Live PIDs in each recorded process group; empty once everything is stopped."""
        left = {}
        for rec in self._state.processes:
            child = self._children.get(rec.name)
            if child is not None and child.pid == rec.pid:
                child.poll()  # reap, so an exited child is not counted as a zombie
            members = _procs.group_members(rec.pid)
            if _procs.is_running(rec) or (members and rec.pid not in members):
                left[rec.name] = members or [rec.pid]
        return left

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- accessors -------------------------------------------------------

    @property
    def workdir(self) -> Path:
        return self._state.workdir

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (client cert in ``system:masters``)."""
        return Path(self._state.kubeconfig)

    @property
    def server(self) -> str:
        return self._state.server

    @property
    def detached(self) -> bool:
        """Whether the servers outlive the process that started them (``hisparse dev up``)."""
        return self._state.detached

    @property
    def processes(self) -> tuple[ProcRecord, ...]:
        return tuple(self._state.processes)

    @property
    def kubectl_path(self) -> Path:
        return Path(self._state.tools["kubectl"])

    @property
    def helm_path(self) -> Path | None:
        p = self._state.tools.get("helm")
        return Path(p) if p else None

    def status(self) -> dict[str, bool]:
        """Whether each server process is running."""
        return {p.name: _procs.is_running(p) for p in self._state.processes}

    def log_path(self, name: str) -> Path:
        return Path(self._state.proc(name).log)

    # ---- talking to the cluster ------------------------------------------

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the cluster's own kubectl with the admin kubeconfig."""
        argv = [f"--kubeconfig={self.kubeconfig}", *args]
        res = subprocess.run(
            [str(self.kubectl_path), *argv],
            input=input, capture_output=True, text=True, timeout=timeout, check=False,
        )
        if check and res.returncode != 0:
            raise KubectlError(argv, res)
        return res

    def apply(
        self, objects: Iterable[dict[str, Any]], *, dry_run: bool = False, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Server-side apply ``objects``; ``dry_run`` validates on the server and writes nothing."""
        args = ["apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-"]
        if dry_run:
            args.insert(1, "--dry-run=server")
        # JSON, not YAML: a string PyYAML writes plain, such as a hash like 12e4567890, is a number to kubectl's
        # YAML 1.2 reader (a label value then fails to decode). A stream of objects, not a List: kubectl checks
        # a List's items against its own copy of the OpenAPI schema, so the apiserver's own verdict (field
        # validation, CEL rules) would never be reached.
        return self.kubectl(*args, input="\n".join(json.dumps(o) for o in objects), check=check)

    def api_get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET ``path`` from kube-apiserver as admin: (HTTP status, body)."""
        return _https_get(self._state.ports["apiserver"], path, self.admin_ssl_context(), timeout)

    def client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for the admin kubeconfig (needs the kubernetes package)."""
        from kubernetes import config  # optional dependency

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    # ---- nodes -----------------------------------------------------------

    def add_gpu_nodes(
        self,
        count: int,
        spec: nodes.GpuNodeSpec | None = None,
        *,
        prefix: str = "gpu-node-",
        zones: tuple[str, ...] = ("zone-a", "zone-b"),
        nodes_per_rack: int = 4,
        wait: bool = True,
    ) -> list[str]:
        """Create ``count`` KWOK GPU nodes named ``<prefix>NNN``; wait until Ready.

        Numbering continues after existing nodes with the same prefix, and so
        does rack and zone placement (see :func:`nodes.placement`).
        """
        spec = spec or nodes.GpuNodeSpec()
        out = self.kubectl("get", "nodes", "-o", "name").stdout.split()
        taken = {n.removeprefix("node/") for n in out}
        names: list[str] = []
        manifests = []
        i = 0
        while len(names) < count:
            name = f"{prefix}{i:03d}"
            if name not in taken:
                zone, rack = nodes.placement(i, zones, nodes_per_rack)
                manifests.append(nodes.gpu_node_manifest(name, spec, zone=zone, rack=rack))
                names.append(name)
            i += 1
        if not manifests:
            return []
        self.kubectl("create", "-f", "-", input=yaml.safe_dump_all(manifests))
        if wait:
            t = self.timeouts.nodes
            try:
                self.kubectl(
                    "wait", "--for=condition=Ready", f"--timeout={int(t)}s",
                    *[f"node/{n}" for n in names], timeout=t + 30,
                )
            except KubectlError as e:
                raise ClusterError(
                    f"KWOK did not make nodes Ready within {t:.0f}s: {e}\n"
                    f"kwok log ({self.log_path('kwok')}):\n{_procs.log_tail(self.log_path('kwok'))}"
                ) from e
        return names

    # ---- apiserver restart -------------------------------------------------

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again with the same flags and port.

        etcd keeps running, so every object survives; the other components
        reconnect on their own.
        """
        rec = self._state.proc("kube-apiserver")
        child = self._children.get(rec.name)
        _procs.stop(rec, grace_s=self.timeouts.stop_grace,
                    reap=child.poll if child is not None else None)
        new = self._spawn("kube-apiserver", rec.argv)
        self._wait_apiserver(new)

    # ---- bring-up ----------------------------------------------------------

    def _spawn(self, name: str, argv: Sequence[str]) -> ProcRecord:
        rec, child = _procs.spawn(
            name, argv, self.workdir / "logs" / f"{name}.log",
            tie_to_parent=not self._state.detached,
        )
        self._children[name] = child
        self._state.record(rec)
        return rec

    def _wait(self, what: str, rec: ProcRecord, timeout: float, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            child = self._children.get(rec.name)
            if child is not None:
                child.poll()
            if not _procs.is_running(rec):
                tail = _procs.log_tail(rec.log)
                error = PortTakenError if "address already in use" in tail else ClusterError
                raise error(
                    f"{rec.name} exited while waiting for {what}; last lines of {rec.log}:\n{tail}"
                )
            try:
                if ready():
                    return
            except (OSError, ValueError, http.client.HTTPException, subprocess.SubprocessError) as e:
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"timed out after {timeout:.0f}s waiting for {what}"
                    f"{' (last error: ' + last + ')' if last else ''}; "
                    f"last lines of {rec.log}:\n{_procs.log_tail(rec.log)}"
                )
            time.sleep(0.25)

    def admin_ssl_context(self) -> ssl.SSLContext:
        """TLS as the admin: the cluster CA, and the client certificate the apiserver also uses for kubelets."""
        pki = _components.Layout(self.workdir).pki
        ctx = ssl.create_default_context(cafile=str(pki("ca.crt")))
        ctx.load_cert_chain(str(pki("admin-client.crt")), str(pki("admin-client.key")))
        return ctx

    def _wait_apiserver(self, rec: ProcRecord) -> None:
        port = self._state.ports["apiserver"]

        def ready() -> bool:
            status, _ = _https_get(port, "/readyz", self.admin_ssl_context())
            return status == 200

        self._wait("kube-apiserver /readyz", rec, self.timeouts.apiserver, ready)

    def _bring_up(self, tools: Tools, *, install_crds: bool, lws: bool) -> None:
        st = self._state
        layout = _components.Layout(self.workdir)
        ports = _components.Ports(*_free_ports(len(_components.Ports.names())))
        st.ports = ports.as_dict()
        st.server = f"https://127.0.0.1:{ports.apiserver}"
        st.kubeconfig = str(layout.admin_kubeconfig)

        # Read upstream files first, so a missing module fails before anything runs.
        _write_kwok_stages(layout.kwok_stages)
        crds = _crd_manifests(layout.crds) if install_crds else []
        webhooks = _lws_webhook_configurations(ports) if lws else []
        _components.make_credentials(layout, st.server)
        st.save()

        def start(name: str, argv: Callable[..., list[str]]) -> ProcRecord:
            return self._spawn(name, argv(tools, layout, ports))

        def healthz(port: int, ctx: ssl.SSLContext) -> Callable[[], bool]:
            return lambda: _https_get(port, "/healthz", ctx)[0] == 200

        def etcd_healthy() -> bool:
            status, body = _http_get(ports.etcd_client, "/health")
            return status == 200 and json.loads(body).get("health") == "true"

        self._wait("etcd /health", start("etcd", _components.etcd), self.timeouts.etcd,
                   etcd_healthy)
        self._start_egress(layout)
        self._wait_apiserver(start("kube-apiserver", _components.kube_apiserver))
        kcm = start("kube-controller-manager", _components.kube_controller_manager)
        scheduler = start("kube-scheduler", _components.kube_scheduler)
        kwok = start("kwok", _components.kwok)
        # CRDs need only the apiserver: install them while the others start.
        if crds:
            self._install_crds(crds)

        # Both serve /healthz with a self-signed cert made at startup: nothing to verify against.
        self._wait("kube-controller-manager /healthz", kcm, self.timeouts.controllers,
                   healthz(ports.controller_manager, _unverified_ctx()))
        self._wait("kube-scheduler /healthz", scheduler, self.timeouts.controllers,
                   healthz(ports.scheduler, _unverified_ctx()))
        kwok_ctx = ssl.create_default_context(cafile=str(layout.pki("ca.crt")))
        self._wait("kwok /healthz", kwok, self.timeouts.kwok, healthz(ports.kwok, kwok_ctx))
        if lws:
            self._start_lws(tools, layout, ports, webhooks)
        # The default ServiceAccount appears once the controllers really work;
        # pods cannot be admitted into a namespace before it exists.
        self._wait("the default ServiceAccount (kube-controller-manager running)", kcm,
                   self.timeouts.controllers,
                   lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default",
                                        check=False).returncode == 0)

    def _start_egress(self, layout: _components.Layout) -> None:
        """The apiserver's egress proxy, before the apiserver (which reads its configuration once)."""
        from .realnode import plan as node_plan

        sock = layout.egress_socket
        if len(str(sock).encode()) > _SUN_PATH_MAX:
            raise ClusterError(f"the workdir {self.workdir} is too long for the egress proxy's unix socket "
                               f"({sock}: over {_SUN_PATH_MAX} bytes); use a shorter workdir")
        layout.egress_config.write_text(yaml.safe_dump(node_plan.egress_selector_configuration(sock)))
        names = node_plan.Names.for_workdir(self.workdir)
        rec = self._spawn("apiserver-egress", node_plan.egress_proxy(sys.executable, socket=sock, names=names))
        self._wait("the apiserver's egress proxy socket", rec, self.timeouts.etcd, sock.exists)

    def _start_lws(self, tools: Tools, layout: _components.Layout, ports: _components.Ports,
                   webhooks: list[dict[str, Any]]) -> None:
        """Run the LWS manager, then register its webhooks (they fail closed, so not before)."""
        layout.lws_config.parent.mkdir(parents=True, exist_ok=True)
        layout.lws_config.write_text(
            yaml.safe_dump(_components.lws_configuration(layout, ports), sort_keys=False))
        rec = self._spawn("lws-manager", _components.lws_manager(tools, layout, ports))
        self._wait("lws-manager /readyz", rec, self.timeouts.controllers,
                   lambda: _http_get(ports.lws_health, "/readyz")[0] == 200)
        ca = base64.b64encode(layout.pki("ca.crt").read_bytes()).decode()
        for config in webhooks:
            for hook in config["webhooks"]:
                hook["clientConfig"]["caBundle"] = ca
        layout.lws_webhooks.write_text(yaml.safe_dump_all(webhooks, sort_keys=False))
        self.kubectl("apply", "--server-side", f"--field-manager={FIELD_MANAGER}",
                     "-f", str(layout.lws_webhooks))

    def _install_crds(self, manifests: list[tuple[Path, list[str]]]) -> None:
        t = self.timeouts.crds
        files = [arg for path, _ in manifests for arg in ("-f", str(path))]
        # Server-side: the larger CRDs exceed the client-side last-applied annotation limit.
        self.kubectl("apply", "--server-side", "--force-conflicts",
                     f"--field-manager={FIELD_MANAGER}", *files, timeout=t)
        names = [f"crd/{name}" for _, crd_names in manifests for name in crd_names]
        self.kubectl("wait", "--for=condition=Established", f"--timeout={int(t)}s", *names,
                     timeout=t + 30)


def _tool_paths(tools: Tools) -> dict[str, str]:
    return {
        "kube-apiserver": str(tools.kube_apiserver),
        "kube-controller-manager": str(tools.kube_controller_manager),
        "kube-scheduler": str(tools.kube_scheduler),
        "kubectl": str(tools.kubectl),
        "etcd": str(tools.etcd),
        "kwok": str(tools.kwok),
        **({"helm": str(tools.helm)} if tools.helm else {}),
        **({"lws-manager": str(tools.lws_manager)} if tools.lws_manager else {}),
    }


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _write_kwok_stages(out: Path) -> None:
    """KWOK's Stages, read from the kwok module: the default "fast" set that
    kwokctl uses (node status heartbeats for nodes with leases), plus upstream's
    chaos Stages, which act only on nodes and pods carrying their opt-in label
    (see :mod:`.faults`)."""
    stages = _gomod.module_dir("sigs.k8s.io/kwok", versions.KWOK_VERSION) / "kustomize" / "stage"
    docs = _gomod.load_documents(
        _gomod.kustomize_resources(stages / "fast")
        + _gomod.yaml_files(stages, ("node/chaos", "pod/chaos"))
    )
    names = {d["metadata"]["name"] for d in docs if d.get("kind") == "Stage"}
    missing = {"node-initialize", "pod-ready", *faults.STAGES} - names
    if missing:
        raise ClusterError(f"KWOK Stages {sorted(missing)} not found under {stages}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def _lws_webhook_configurations(ports: _components.Ports) -> list[dict[str, Any]]:
    """LWS's webhook configurations as its kustomization builds them (manifests plus its
    JSON patches, which limit the pod webhooks to LWS pods, and the ``lws-`` name prefix),
    each Service reference turned into a loopback URL; ``caBundle`` is filled in later."""
    root = _gomod.module_dir("sigs.k8s.io/lws", versions.LWS_VERSION) / "config"
    kust = yaml.safe_load((root / "webhook" / "kustomization.yaml").read_text())
    docs = _gomod.load_documents(root / "webhook" / r for r in kust["resources"])
    configs = [d for d in docs if d.get("kind", "").endswith("WebhookConfiguration")]
    prefix = yaml.safe_load((root / "default" / "kustomization.yaml").read_text())["namePrefix"]
    for patch in kust.get("patches", []):
        target = patch["target"]
        config = next(c for c in configs
                      if c["kind"] == target["kind"] and c["metadata"]["name"] == target["name"])
        for op in yaml.safe_load((root / "webhook" / patch["path"]).read_text()):
            where = op["path"].removeprefix("/webhooks/")
            if op["op"] != "replace" or not where.isdigit():
                raise ClusterError(f"LWS webhook patch {patch['path']}: cannot apply {op}")
            config["webhooks"][int(where)] = op["value"]
    for config in configs:
        config["metadata"] = {"name": prefix + config["metadata"]["name"]}
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://{_components.LOOPBACK}:{ports.lws_webhook}{path}"}
    if not configs:
        raise ClusterError(f"no webhook configurations under {root / 'webhook'}")
    return configs


def _crd_manifests(out_dir: Path) -> list[tuple[Path, list[str]]]:
    """Per upstream module, a file with its CRDs (other kinds there are skipped) and their names."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifests = []
    for up in versions.UPSTREAM_CRDS:
        root = _gomod.module_dir(up.module, up.version)
        docs = [d for d in _gomod.load_documents(_gomod.yaml_files(root, up.paths))
                if d.get("kind") == "CustomResourceDefinition"]
        if not docs:
            raise ClusterError(f"no CRDs in {up.module}@{up.version} at {', '.join(up.paths)}")
        f = out_dir / f"{up.module.replace('/', '_')}@{up.version}.json"
        # A v1 List in JSON: kubectl reads it, and it is far quicker to write than YAML.
        f.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
        manifests.append((f, [d["metadata"]["name"] for d in docs]))
    return manifests
