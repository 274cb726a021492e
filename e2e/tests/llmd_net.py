"""Network namespaces for the llm-d suite: pod IPs that are real addresses, with no traffic leaving
the machine.

llm-d's routing sidecar listens on every address of its network stack (``:8000``) and reaches its
vLLM at ``localhost``, so a decode pod needs a network stack of its own. The suite makes two
namespaces joined by a veth pair: ``pods`` (prefill pods, pods of another KV build, the EPP and the
stand-in for Envoy) and ``decode`` (the decode pod: sidecar + its engine on loopback). Each pod IP
(the one KWOK wrote into the Pod's status) is an address on the veth end of its namespace, so every
connection the EPP, the sidecar and the stand-in make goes to an address inside a namespace this
suite made. The apiserver (host loopback) is reached through a forwarder whose listening socket
lives on each namespace's loopback at the apiserver's own port, so the cluster's kubeconfig (and
its certificate's 127.0.0.1 SAN) works unchanged inside.

Sockets keep the namespace they were created in, so a thread that has entered a namespace
(``setns``) can open a listening socket there that the rest of the process then serves from.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a thread inside network namespace ``ns``; sockets it opens stay there."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            out["error"] = e

    t = threading.Thread(target=run, name=f"netns-{ns}")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]  # type: ignore[return-value]


class _Forwarder:
    """Accepts on a socket inside a namespace and relays each connection to a host-loopback port."""

    def __init__(self, ns: str, port: int) -> None:
        self._port = port
        self._sock = in_netns(ns, lambda: socket.create_server(("127.0.0.1", port)))
        self._closed = False
        threading.Thread(target=self._accept, name=f"fwd-{ns}-{port}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self._port), timeout=10)
            except OSError:
                conn.close()
                continue
            up.settimeout(None)
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        self._sock.close()


class PodNet:
    """Two namespaces (``pods``, ``decode``) on one veth pair, with pod IPs on each end."""

    def __init__(self, tag: str) -> None:
        self.pods = f"hs-{tag}-pods"
        self.decode = f"hs-{tag}-dec"
        self._veth = (f"hs{tag}p", f"hs{tag}d")
        self._forwarders: list[_Forwarder] = []

    def up(self, pods_ips: Sequence[str], decode_ips: Sequence[str], prefix_len: int, api_port: int) -> None:
        for ns in (self.pods, self.decode):
            _ip("netns", "add", ns)
        _ip("link", "add", self._veth[0], "type", "veth", "peer", "name", self._veth[1])
        for ns, dev, ips in ((self.pods, self._veth[0], pods_ips), (self.decode, self._veth[1], decode_ips)):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            for addr in ips:
                _ip("-n", ns, "addr", "add", f"{addr}/{prefix_len}", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            self._forwarders.append(_Forwarder(ns, api_port))

    def exec_argv(self, ns: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def down(self) -> list[str]:
        """Remove both namespaces (the veth pair goes with them); returns what could not be removed."""
        for f in self._forwarders:
            f.close()
        left = []
        for ns in (self.pods, self.decode):
            r = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
            if r.returncode != 0 and "No such file" not in r.stderr:
                left.append(f"{ns}: {r.stderr.strip()}")
        return left


@contextlib.contextmanager
def pod_net(tag: str) -> Iterator[PodNet]:
    net = PodNet(tag)
    try:
        yield net
    finally:
        left = net.down()
        assert not left, f"network namespaces left behind: {left}"
