"""``hisparse-runtime nixl-check {loopback,publish,read}``: argument wiring and exit codes."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from hisparse_runtime.nixl_check.models import DEFAULT_PORT

PORT_ENV = "HISPARSE_NIXL_CHECK_PORT"
"""Overrides the publisher's default port (5590, the engine's ``nixl.linkCheckPort`` default)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "nixl-check",
        help="prove NIXL moves bytes: in-process, or from a prefill pod to a decode pod",
        description="Prints one JSON result on stdout; exit code 0 when every byte arrived verified.",
    )
    modes = parser.add_subparsers(dest="nixl_mode", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", action="append", dest="backends", metavar="NAME",
                        help="NIXL backend to load (repeatable; default UCX)")  # fmt: skip
    common.add_argument("--timeout", type=float, default=30.0, help="transfer deadline in seconds (default 30)")

    loop = modes.add_parser("loopback", parents=[common], help="two agents in this process (preflight)")
    loop.add_argument("--size-mib", type=int, default=8, help="buffer size in MiB (default 8)")
    loop.add_argument("--parts", type=int, default=8, help="number of part transfers (default 8)")

    pub = modes.add_parser("publish", parents=[common], help="prefill side: register a buffer and serve it")
    pub.add_argument("--host", default=os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "0.0.0.0"),
                     help="address to listen on (default $VLLM_NIXL_SIDE_CHANNEL_HOST or 0.0.0.0)")  # fmt: skip
    pub.add_argument("--port", type=int, default=int(os.environ.get(PORT_ENV, DEFAULT_PORT)),
                     help=f"HTTP port (default ${PORT_ENV} or {DEFAULT_PORT}; 0 picks a free one)")  # fmt: skip
    pub.add_argument("--size-mib", type=int, default=64, help="buffer size in MiB (default 64)")
    pub.add_argument("--parts", type=int, default=16, help="number of parts (default 16)")
    pub.add_argument("--seed", type=int, default=0, help="seed of the buffer's bytes")
    pub.add_argument("--duration", type=float, default=None,
                     help="stop after this many seconds (default: until SIGTERM)")  # fmt: skip

    read = modes.add_parser("read", parents=[common], help="decode side: READ a publisher's buffer and verify")
    read.add_argument("--peer", required=True, help=f"publisher URL, e.g. http://10.0.0.7:{DEFAULT_PORT}")
    read.add_argument("--wait", type=float, default=0.0,
                      help="keep retrying an unreachable publisher this many seconds (default 0)")  # fmt: skip
    read.add_argument("--max-in-flight", type=int, default=4, help="parts posted at once (default 4)")


def run(args: argparse.Namespace) -> int:
    backends = args.backends or ["UCX"]
    if args.nixl_mode == "loopback":
        from hisparse_runtime.nixl_check.loopback import check_loopback

        result = check_loopback(
            size_bytes=args.size_mib << 20, parts=args.parts, backends=backends, timeout_s=args.timeout
        )
    elif args.nixl_mode == "read":
        from hisparse_runtime.nixl_check.reader import read_peer

        result = read_peer(
            args.peer, backends=backends, timeout_s=args.timeout, wait_s=args.wait,
            max_in_flight=args.max_in_flight,
        )  # fmt: skip
    else:
        return _publish(args, backends)
    print(result.model_dump_json(), flush=True)
    return result.exit_code


def _publish(args: argparse.Namespace, backends: list[str]) -> int:
    from hisparse_runtime.nixl_check.agent import CheckFailure
    from hisparse_runtime.nixl_check.models import EXIT_CODES
    from hisparse_runtime.nixl_check.publisher import publish
    from hisparse_runtime.nixl_check.source import SourceBuffer

    try:
        source = SourceBuffer(args.size_mib << 20, args.parts, backends=backends, seed=args.seed)
    except CheckFailure as exc:
        print(json.dumps({"event": "failed", "failure": exc.kind, "error": exc.message}), flush=True)
        return EXIT_CODES[exc.kind]  # type: ignore[index]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with source, publish(source, args.host, args.port) as server:
        ready = {"event": "ready", "url": server.url, "agent": source.agent.name,
                 "bytes": source.document.total_bytes, "parts": len(source.document.parts)}  # fmt: skip
        print(json.dumps(ready), flush=True)
        stop.wait(args.duration)
    print(json.dumps({"event": "stopped"}), flush=True)
    sys.stdout.flush()
    return 0
