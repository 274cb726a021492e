"""A container registry on loopback, as a user's cluster has one.

Debian's ``docker-registry`` (the CNCF Distribution registry) serves TLS with a CA of its own on
``127.0.0.1:<port>``. Clients trust that CA as they trust a private registry's: skopeo on the host through
``/etc/containers/certs.d/<host>/ca.crt`` (containers-certs.d(5)), the real node's containerd through its
registry configuration (``hosts.toml``, :meth:`.RealNode.trust_registry`). Inside the node's network
namespace the same address leads to the registry (a socat pair through a unix socket, as the node reaches
the apiserver), so an image reference means the same on both sides.

Its storage is kept in the project's cache (``registry/``, content-addressed): pushing an image the
registry already holds uploads nothing, as with a team's long-lived registry. The access log (one line per
request, with the client's user agent) shows who fetched what: :meth:`LoopbackRegistry.fetches`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Final

import yaml
from hisparse_operator.pki import Pki

from . import _procs
from ._state import cache_home

BINARY: Final = "docker-registry"
"""Debian's package of the Distribution registry (``scripts/setup`` installs it)."""
PORT_RANGE: Final = (20000, 30000)
"""Where the preferred port of a storage lies (below Linux's ephemeral ports, 32768 and up)."""
HOST_TRUST_DIR: Final = Path("/etc/containers/certs.d")
"""Where skopeo, buildah and podman look for a registry's CA (containers-certs.d(5))."""


class RegistryError(RuntimeError):
    pass


def storage_dir() -> Path:
    return cache_home() / "registry"


def _port_for(storage: Path) -> int:
    """The same port for the same storage whenever it is free, else any free one. skopeo remembers which
    compressed layers a registry holds by its address: at the same address a push of an image it holds
    compresses nothing again (a 10 GiB image: seconds instead of about 90 s on 2 cores)."""
    preferred = PORT_RANGE[0] + int(hashlib.sha256(str(storage.resolve()).encode()).hexdigest(), 16) % (
        PORT_RANGE[1] - PORT_RANGE[0])
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise RegistryError("no free port on 127.0.0.1")


class LoopbackRegistry:
    """``start()`` / ``stop()`` (or ``with``): the registry on ``host``, trusted on the host while it runs."""

    def __init__(self, workdir: Path, *, storage: Path | None = None) -> None:
        self.workdir = workdir
        self.storage = storage or storage_dir()
        self.port = _port_for(self.storage)
        self.host = f"127.0.0.1:{self.port}"
        self.log = workdir / "registry.log"
        self._procs: list[tuple[_procs.ProcRecord, object]] = []
        self._node_trust: list[tuple[object, str]] = []
        self._pki: Pki | None = None

    @property
    def ca_pem(self) -> bytes:
        assert self._pki is not None, "start() first"
        return self._pki.ca_pem

    def start(self, timeout: float = 30.0) -> LoopbackRegistry:
        if shutil.which(BINARY) is None:
            raise RegistryError(f"{BINARY} is not installed: scripts/setup installs Debian's docker-registry package")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(parents=True, exist_ok=True)
        self._pki = Pki(self.workdir / "pki", ca_name="hisparse-registry-ca")
        cert = self._pki.issue("registry", "127.0.0.1", server_ips=("127.0.0.1",))
        config = self.workdir / "config.yml"
        config.write_text(yaml.safe_dump({
            "version": 0.1,
            "log": {"level": "info", "accesslog": {"disabled": False}, "formatter": "json"},
            "storage": {"filesystem": {"rootdirectory": str(self.storage)}, "delete": {"enabled": True}},
            "http": {"addr": self.host, "tls": {"certificate": str(cert.cert), "key": str(cert.key)}},
        }))
        rec, proc = _procs.spawn("registry", [BINARY, "serve", str(config)], self.log, tie_to_parent=True)
        self._procs.append((rec, proc))
        trust = HOST_TRUST_DIR / self.host
        trust.mkdir(parents=True, exist_ok=True)
        (trust / "ca.crt").write_bytes(self.ca_pem)
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"https://{self.host}/v2/", context=context, timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if not _procs.is_running(rec) or time.monotonic() > deadline:
                self.stop()
                raise RegistryError(f"the registry did not answer on https://{self.host}/v2/ within {timeout:.0f}s:\n"
                                    + _procs.log_tail(self.log))
            time.sleep(0.2)

    def expose_in(self, node: object) -> None:
        """Make ``host`` lead to the registry inside ``node``'s network namespace and have its containerd
        trust the registry's CA (a :class:`.RealNode`)."""
        from .realnode import plan

        names = node.names  # type: ignore[attr-defined]
        sock = names.run_dir / f"registry-{self.port}.sock"
        for name, argv in (
            ("registry-socat-host", ["socat", f"UNIX-LISTEN:{sock},fork,unlink-early", f"TCP:{self.host}"]),
            ("registry-socat-node", plan.in_netns(names, [
                "socat", f"TCP-LISTEN:{self.port},bind=127.0.0.1,fork,reuseaddr", f"UNIX-CONNECT:{sock}"])),
        ):
            rec, proc = _procs.spawn(name, argv, self.workdir / f"{name}.log", tie_to_parent=True)
            self._procs.append((rec, proc))
            time.sleep(0.2)
            if not _procs.is_running(rec):
                raise RegistryError(f"{name} exited at once:\n" + _procs.log_tail(rec.log))
        node.trust_registry(self.host, self.ca_pem)  # type: ignore[attr-defined]
        self._node_trust.append((node, self.host))

    def fetches(self) -> list[dict[str, str]]:
        """Requests served so far, oldest first: ``method``, ``uri``, ``status`` and ``useragent``."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines() if self.log.exists() else []:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict) or "http.request.uri" not in entry or "http.response.status" not in entry:
                continue
            out.append({"method": str(entry.get("http.request.method")), "uri": str(entry["http.request.uri"]),
                        "status": str(entry["http.response.status"]),
                        "useragent": str(entry.get("http.request.useragent", ""))})
        return out

    def stop(self) -> None:
        for node, host in self._node_trust:
            node.distrust_registry(host)  # type: ignore[attr-defined]
        self._node_trust.clear()
        for rec, proc in reversed(self._procs):
            _procs.stop(rec, reap=proc.poll)  # type: ignore[attr-defined]
        self._procs.clear()
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(HOST_TRUST_DIR / self.host)

    def __enter__(self) -> LoopbackRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
