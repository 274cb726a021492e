"""The store-client half of the Mooncake check, run by ``mooncake_check`` in a child process.

``python -m hisparse_runtime.mooncake_client FD TARGET_JSON`` sets up a store client, puts a random
block, gets it back, compares and removes it, writing one JSON line per step to file descriptor FD.
The first failed step ends the run. The parent enforces the deadline and kills this process if a
native call blocks (``setup`` alone retries a dead master for about 90 s).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, BinaryIO

from hisparse_runtime.mooncake_check import MIN_SEGMENT_BYTES, MooncakeTarget

__all__ = ["client_steps", "main"]

Report = Callable[..., None]

# Status codes seen from mooncake-transfer-engine 0.3.13.
_STATUS = {-200: "no space for the object", -600: "invalid parameters", -704: "object not found",
           -900: "RPC to the master failed"}  # fmt: skip


def main(argv: list[str]) -> None:
    fd, target_json = int(argv[0]), argv[1]
    target = MooncakeTarget.model_validate_json(target_json)
    out: BinaryIO = os.fdopen(fd, "wb", buffering=0)

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message).encode() + b"\n")

    def report(name: str, started: float, ok: bool, detail: str = "", kind: str = "", message: str = "") -> None:
        send({"name": name, "ok": ok, "seconds": time.monotonic() - started, "detail": detail, "kind": kind,
              "message": message})  # fmt: skip

    store = None
    try:
        store = client_steps(target, report)
        send({"end": True})
        if store is not None:
            store.close()  # unmount our segment now rather than at the master's client TTL
    finally:
        out.close()
        sys.stdout.flush()
        sys.stderr.flush()
        # Native destructors of the transfer engine can block at interpreter exit; all is sent.
        os._exit(0)


def client_steps(target: MooncakeTarget, report: Report) -> Any:
    started = time.monotonic()
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        report("setup", started, False, str(exc), "client_unavailable",
               f"the Mooncake store client is not importable ({exc}); install mooncake-transfer-engine"
               " (and Debian libibverbs1 and librdmacm1, which it loads even for tcp).")  # fmt: skip
        return None
    store = MooncakeDistributedStore()
    status = store.setup(
        target.local_hostname, target.metadata_server, target.global_segment_bytes, target.local_buffer_bytes,
        target.protocol, target.rdma_devices, target.master,
    )  # fmt: skip
    if status != 0:
        hint = ""
        if target.global_segment_bytes < MIN_SEGMENT_BYTES or target.local_buffer_bytes < MIN_SEGMENT_BYTES:
            hint = f" The global segment and local buffer must each be at least {MIN_SEGMENT_BYTES >> 20} MiB."
        report("setup", started, False, _describe(status), "setup_failed",
               f"store client setup against master {target.master} failed with {_describe(status)}.{hint}"
               " Check the master and metadata server addresses and the client's local_hostname.")  # fmt: skip
        return None
    report("setup", started, True)

    key = f"hisparse-check/{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex}"
    value = os.urandom(target.block_bytes)
    started = time.monotonic()
    status = store.put(key, value)
    if status != 0:
        if status == -200:
            report("put", started, False, _describe(status), "store_full",
                   f"the store has no space for a {target.block_bytes}-byte block ({_describe(status)}): the"
                   " global segments mounted by the store's clients are full or smaller than the block. Raise"
                   " global_segment_size on the store clients or add clients.")  # fmt: skip
        elif status == -600 and target.block_bytes > target.local_buffer_bytes:
            report("put", started, False, _describe(status), "put_failed",
                   f"a {target.block_bytes}-byte block does not fit the {target.local_buffer_bytes}-byte local"
                   " buffer; raise local_buffer_size.")  # fmt: skip
        else:
            report("put", started, False, _describe(status), "put_failed",
                   f"put of a {target.block_bytes}-byte block failed with {_describe(status)}; check the master"
                   " log and that the client's segment is mounted.")  # fmt: skip
        return store
    report("put", started, True, f"{target.block_bytes} bytes")

    started = time.monotonic()
    got = store.get(key)  # returns b"" on any failure, so only the comparison can tell
    if not got:
        report("get", started, False, f"size status {store.get_size(key)}", "get_failed",
               f"get of the block just put returned nothing (size status {_describe(store.get_size(key))}); the"
               " master may have restarted or evicted it.")  # fmt: skip
        return store
    report("get", started, True, f"{len(got)} bytes")
    started = time.monotonic()
    if got != value:
        report("verify", started, False, f"{len(got)} bytes differ", "data_mismatch",
               "the block read back differs from the block written; the transfer path corrupts data.")  # fmt: skip
        return store
    report("verify", started, True)
    started = time.monotonic()
    status = store.remove(key, force=True)  # our own probe block: skip its lease
    report("remove", started, True, "" if status == 0 else f"left for eviction ({_describe(status)})")
    return store


def _describe(status: int) -> str:
    return f"status {status}" + (f" ({_STATUS[status]})" if status in _STATUS else "")


if __name__ == "__main__":
    main(sys.argv[1:])
