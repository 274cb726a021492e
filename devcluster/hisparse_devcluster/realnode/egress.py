"""The apiserver's egress proxy: HTTP CONNECT over a unix socket, as the apiserver's egress selector
speaks it (``--egress-selector-config-file``, proxy protocol ``HTTPConnect``, transport ``uds``).

The apiserver runs on the host; the real node's pods and Services live in a network namespace of
their own that has no link to the host. For each ``CONNECT host:port`` the proxy opens the
connection where :func:`.plan.egress_way` says the target lives: from a socket made inside the node's
namespace (a ClusterIP, a pod address, the node IP), or on the host's loopback; it answers 403 for
any other target and 503 while there is no node. Then it copies bytes both ways until either side
closes. One line per connection goes to stdout (the cluster's log of this process).

    python -m hisparse_devcluster.realnode.egress --socket=PATH --netns=/run/netns/NAME
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Final

from .plan import EgressWay, egress_way

CLONE_NEWNET: Final = 0x40000000
CONNECT_TIMEOUT_S: Final = 10.0
MAX_HEADER: Final = 8192
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def socket_in_netns(netns: Path, family: int = socket.AF_INET) -> socket.socket:
    """A TCP socket that belongs to the network namespace at ``netns`` (a socket keeps the namespace
    it was made in): this thread enters the namespace, makes it, and returns at once."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(netns, os.O_RDONLY)
        try:
            _setns(target)
            try:
                return socket.socket(family, socket.SOCK_STREAM)
            finally:
                try:
                    _setns(own)
                except OSError:  # never keep serving from the node's namespace
                    os._exit(70)
        finally:
            os.close(target)
    finally:
        os.close(own)


class Refused(Exception):
    def __init__(self, status: int, reason: str, detail: str) -> None:
        self.status, self.reason, self.detail = status, reason, detail
        super().__init__(f"{status} {reason}: {detail}")


def parse_connect(head: bytes) -> tuple[str, int]:
    """``(host, port)`` of a ``CONNECT host:port HTTP/1.1`` request head."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refused(400, "Bad Request", f"not an HTTP/1.x request line: {line[:200]!r}")
    method, target, _ = parts
    if method != "CONNECT":
        raise Refused(405, "Method Not Allowed", f"only CONNECT is served, not {method}")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise Refused(400, "Bad Request", f"CONNECT target {target!r} is not host:port")
    return host.removeprefix("[").removesuffix("]"), int(port)


async def _open(way: EgressWay, host: str, port: int, netns: Path) -> socket.socket:
    addr = "127.0.0.1" if host == "localhost" else host
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    if way == "node":
        if not netns.exists():
            raise Refused(503, "Service Unavailable", f"{host}:{port} is inside the real node's network namespace "
                          f"{netns.name}, and no real node runs (start it: hisparse dev up)")
        try:
            sock = socket_in_netns(netns, family)
        except OSError as e:
            raise Refused(503, "Service Unavailable", f"{host}:{port}: cannot open a socket in the real node's "
                          f"network namespace {netns} ({e}); the egress proxy needs root (CAP_SYS_ADMIN)") from e
    else:
        sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (addr, port)), CONNECT_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError) as e:
        sock.close()
        raise Refused(502, "Bad Gateway", f"connect to {host}:{port} ({way}): {type(e).__name__}: {e}") from e
    return sock


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, netns: Path) -> None:
    target = "?"
    try:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError) as e:
            raise Refused(400, "Bad Request", f"no complete request head: {type(e).__name__}") from e
        host, port = parse_connect(head)
        target = f"{host}:{port}"
        way = egress_way(host)
        if way is None:
            raise Refused(403, "Forbidden", f"{target} is neither loopback nor inside the real node's network "
                          "namespace (the service range, the node's pod subnet, the node IP)")
        upstream = await _open(way, host, port, netns)
    except (ConnectionError, OSError):  # the apiserver went away before asking
        writer.close()
        return
    except Refused as e:
        print(f"refused {target}: {e}", flush=True)
        with contextlib.suppress(OSError):
            writer.write(f"HTTP/1.1 {e.status} {e.reason}\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
                         f"{e.detail}\n".encode())
            await writer.drain()
        writer.close()
        return
    print(f"connect {target} ({way})", flush=True)
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    up_reader, up_writer = await asyncio.open_connection(sock=upstream)
    try:
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    finally:
        for w in (writer, up_writer):
            w.close()


async def serve(socket_path: Path, netns: Path) -> None:
    socket_path.unlink(missing_ok=True)
    server = await asyncio.start_unix_server(lambda r, w: _serve(r, w, netns), path=str(socket_path),
                                             limit=MAX_HEADER)
    socket_path.chmod(0o600)  # the apiserver runs as the same user
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"serving HTTP CONNECT on {socket_path} (node namespace {netns})", flush=True)
    async with server:
        await stop.wait()
    socket_path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hisparse_devcluster.realnode.egress", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", type=Path, required=True, help="unix socket the apiserver connects to")
    parser.add_argument("--netns", type=Path, required=True, help="the real node's network namespace (a path)")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.socket, args.netns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
