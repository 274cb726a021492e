"""The apiserver's egress proxy (``realnode/egress.py``) against a real network namespace made as the
real node makes it (``host.create_netns``), with no control plane: what it opens inside the namespace,
what on the host's loopback, and what it refuses. The path from the apiserver through it to a webhook
pod is proven in ``test_e2e_helm_real_node.py``.

Needs root (network namespaces, setns); the servers it talks to are the test's own, inside the
namespace it made or on loopback."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hisparse_devcluster import SERVICE_CIDR
from hisparse_devcluster.realnode import host, plan
from hisparse_devcluster.realnode.egress import parse_connect, Refused

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"), pytest.mark.host]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http_server(argv_prefix: list[str], bind: str, port: int, root: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*argv_prefix, sys.executable, "-m", "http.server", "--bind", bind, str(port),
                             "--directory", str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@dataclass(frozen=True)
class Setup:
    names: plan.Names
    socket: Path
    proxy: subprocess.Popen[bytes]
    node_port: int
    host_port: int
    log: Path


def _wait(what: str, check, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _connect(sock_path: Path, target: str, request: bytes | None = b"GET /token HTTP/1.0\r\n\r\n") -> tuple[str, bytes]:
    """CONNECT through the proxy as the apiserver does; returns the proxy's status line and what the
    target answered to ``request``."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(str(sock_path))
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        status = head.split(b"\r\n")[0].decode()
        if not status.startswith("HTTP/1.1 200") or request is None:
            while chunk := s.recv(4096):
                rest += chunk
            return status, rest
        s.sendall(request)
        while chunk := s.recv(4096):
            rest += chunk
        return status, rest


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("egress")
    names = plan.Names.for_workdir(workdir)
    host.delete_netns(names)
    host.create_netns(names)
    servers: list[subprocess.Popen[bytes]] = []
    proxy = None
    try:
        node_root, host_root = workdir / "node-www", workdir / "host-www"
        for root, token in ((node_root, "inside-the-node-namespace"), (host_root, "on-the-host-loopback")):
            root.mkdir()
            (root / "token").write_text(token)
        node_port, host_port = _free_port(), _free_port()
        servers.append(_http_server(["nsenter", f"--net={names.netns_path}", "--"], plan.NODE_IP, node_port, node_root))
        servers.append(_http_server([], "127.0.0.1", host_port, host_root))
        sock = workdir / "egress.sock"
        log = workdir / "egress.log"
        with open(log, "wb") as out:
            proxy = subprocess.Popen(plan.egress_proxy(sys.executable, socket=sock, names=names),
                                     stdout=out, stderr=subprocess.STDOUT)
        _wait("the proxy's socket", sock.exists)
        _wait("the servers", lambda: _connect(sock, f"{plan.NODE_IP}:{node_port}")[0].startswith("HTTP/1.1 200")
              and _connect(sock, f"127.0.0.1:{host_port}")[0].startswith("HTTP/1.1 200"))
        yield Setup(names, sock, proxy, node_port, host_port, log)
    finally:
        for p in [*servers, *([proxy] if proxy else [])]:
            p.terminate()
            p.wait(10)
        host.delete_netns(names)
    assert not host.netns_exists(names) and not host.host_links(names)


def test_node_addresses_are_opened_inside_the_namespace(setup: Setup) -> None:
    status, body = _connect(setup.socket, f"{plan.NODE_IP}:{setup.node_port}")
    assert status.startswith("HTTP/1.1 200"), status
    assert body.endswith(b"inside-the-node-namespace"), body[-300:]
    # The same address is not reachable from the host at all: the proxy is the only way in.
    with socket.socket() as s:
        s.settimeout(2)
        assert s.connect_ex((plan.NODE_IP, setup.node_port)) != 0


def test_loopback_and_the_node_name_are_opened_on_the_host(setup: Setup) -> None:
    for target in (f"127.0.0.1:{setup.host_port}", f"localhost:{setup.host_port}"):
        status, body = _connect(setup.socket, target)
        assert status.startswith("HTTP/1.1 200") and body.endswith(b"on-the-host-loopback"), (target, status, body[-300:])


def _own_addresses() -> list[str]:
    out = subprocess.run(["ip", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


@pytest.mark.parametrize("target", ["own-address", "example.org:443", "10.244.0.5:80", "8.8.8.8:53", "10.250.2.1:80"])
def test_every_other_target_is_refused_before_any_connection(setup: Setup, target: str) -> None:
    targets = [f"[{a}]:80" if ":" in a else f"{a}:80" for a in _own_addresses()] if target == "own-address" else [target]
    assert targets, "this host has no global address to try"
    for t in targets:
        status, body = _connect(setup.socket, t, request=None)
        assert status.startswith("HTTP/1.1 403"), (t, status)
        assert b"neither loopback nor inside the real node's network namespace" in body, body
        assert f"refused {t.removeprefix('[').replace(']:', ':')}" in setup.log.read_text()
    assert "connect example.org" not in setup.log.read_text()


def test_only_connect_is_served(setup: Setup) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(setup.socket))
        s.sendall(b"GET http://10.96.0.1/ HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 405")


def test_an_unreachable_node_address_is_a_bad_gateway(setup: Setup) -> None:
    # A ClusterIP with no kube-proxy rule behind it (no node components run here): refused or timed out.
    ip = ipaddress.ip_network(SERVICE_CIDR)[200]
    status, body = _connect(setup.socket, f"{ip}:443", request=None)
    assert status.startswith("HTTP/1.1 502"), status
    assert f"connect to {ip}:443 (node)".encode() in body, body


def test_the_namespace_routes_the_service_range_and_the_host_does_not(setup: Setup) -> None:
    inside = subprocess.run(["ip", "-n", setup.names.netns, "route", "show", SERVICE_CIDR],
                            capture_output=True, text=True, check=True).stdout
    assert f"dev {setup.names.veth[0]}" in inside and f"src {plan.NODE_IP}" in inside, inside
    outside = subprocess.run(["ip", "route", "show", SERVICE_CIDR], capture_output=True, text=True, check=True).stdout
    assert outside.strip() == "", f"a host route for the service range: {outside}"


def test_without_a_node_namespace_the_answer_says_so(tmp_path: Path, setup: Setup) -> None:
    """Last: a proxy for a cluster whose node is not running."""
    names = plan.Names.for_workdir(tmp_path)
    sock = tmp_path / "egress.sock"
    proxy = subprocess.Popen(plan.egress_proxy(sys.executable, socket=sock, names=names),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait("the proxy's socket", sock.exists)
        status, body = _connect(sock, "10.96.0.10:443", request=None)
        assert status.startswith("HTTP/1.1 503") and b"no real node runs" in body, (status, body)
        status, _ = _connect(sock, f"127.0.0.1:{setup.host_port}")
        assert status.startswith("HTTP/1.1 200"), "loopback targets do not need the node"
    finally:
        proxy.terminate()
        assert proxy.wait(10) == 0
    assert not sock.exists(), "the proxy removes its socket when it stops"


@pytest.mark.parametrize(("head", "status"), [
    (b"CONNECT 10.96.0.1:443 HTTP/1.1\r\n\r\n", None),
    (b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n", None),
    (b"CONNECT 10.96.0.1 HTTP/1.1\r\n\r\n", 400),
    (b"CONNECT 10.96.0.1:99999 HTTP/1.1\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\n\r\n", 405),
    (b"garbage\r\n\r\n", 400),
])
def test_parse_connect(head: bytes, status: int | None) -> None:
    if status is None:
        host_, port = parse_connect(head)
        assert port == 443 and host_ in ("10.96.0.1", "::1")
    else:
        with pytest.raises(Refused) as err:
            parse_connect(head)
        assert err.value.status == status
