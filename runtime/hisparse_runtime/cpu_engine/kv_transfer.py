"""P/D over NIXL for the CPU engine: the KV cache is NIXL-registered DRAM; decode READs a request's
blocks straight from prefill's cache into its own (the HiSparse host pool, when on), over UCX.

What stands in for vLLM's NixlConnector (and what does not):

- The ``kv_transfer_params`` fields are vLLM 0.33's (``do_remote_prefill``, ``remote_engine_id``,
  ``remote_block_ids``, ``remote_request_id``, ``remote_host``, ``remote_port``, ``tp_size``, ...), so
  llm-d's routing sidecar passes them from the prefill reply to decode as it does with vLLM.
- The side channel listens on ``VLLM_NIXL_SIDE_CHANNEL_HOST``/``_PORT`` like vLLM's, but speaks a small
  JSON-over-HTTP handshake of its own (agent metadata, region addresses, cache layout), not vLLM's
  ZMQ/msgpack one: a real vLLM cannot pair with this engine, and a layout mismatch is refused.
- Decode tells prefill that a request's blocks were read with a NIXL notification (the request id),
  as vLLM does; prefill frees them then, or after ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` seconds.
"""

from __future__ import annotations

import base64
import ctypes
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

import httpx

from hisparse_runtime.engine import env as E
from hisparse_runtime.nixl_check.agent import new_agent

__all__ = ["HANDSHAKE_PATH", "KVLayout", "KVPullError", "NixlKV", "Region"]

log = logging.getLogger("hisparse.cpu_engine.nixl")

HANDSHAKE_PATH: Final = "/hisparse/cpu-engine/v1/handshake"
DEFAULT_SIDE_CHANNEL_PORT: Final = 5600  # vLLM's default for VLLM_NIXL_SIDE_CHANNEL_PORT
ABORT_TIMEOUT_ENV: Final = "VLLM_NIXL_ABORT_REQUEST_TIMEOUT"
DEFAULT_ABORT_TIMEOUT_S: Final = 480.0  # vLLM's default


class KVPullError(RuntimeError):
    """Decode could not read a request's KV from prefill."""


@dataclass(frozen=True)
class Region:
    """A registered cache tensor: ``layers`` x ``slots`` rows of ``row_bytes`` at ``addr``."""

    addr: int
    layers: int
    slots: int
    row_bytes: int

    @property
    def nbytes(self) -> int:
        return self.layers * self.slots * self.row_bytes

    def to_json(self) -> dict[str, int]:
        return {"addr": self.addr, "layers": self.layers, "slots": self.slots, "row_bytes": self.row_bytes}


@dataclass(frozen=True)
class KVLayout:
    """What two engines must agree on to exchange KV blocks (checked at the handshake)."""

    block_size: int
    model_fingerprint: str

    def to_json(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "model_fingerprint": self.model_fingerprint}


@dataclass
class _Peer:
    agent_name: str
    regions: dict[str, Region]


class NixlKV:
    """One NIXL agent per engine: registers the cache regions, serves the handshake, pulls blocks."""

    def __init__(self, engine_id: str, regions: dict[str, Region], layout: KVLayout,
                 environ: dict[str, str] | None = None) -> None:  # fmt: skip
        env = os.environ if environ is None else environ
        self.engine_id = engine_id
        self.regions = regions
        self.layout = layout
        self.host = env.get(E.VLLM_NIXL_SIDE_CHANNEL_HOST) or "localhost"
        self.port = int(env.get(E.VLLM_NIXL_SIDE_CHANNEL_PORT) or DEFAULT_SIDE_CHANNEL_PORT)
        self.abort_timeout_s = float(env.get(ABORT_TIMEOUT_ENV) or DEFAULT_ABORT_TIMEOUT_S)
        self.agent: Any = new_agent("cpu-engine", ["UCX"])
        self._regs = [self.agent.register_memory([(r.addr, r.nbytes, 0, "")], "DRAM") for r in regions.values()]
        self._peers: dict[str, _Peer] = {}
        self._lock = threading.Lock()
        self.bytes_pulled = 0
        self.document = {
            "engine_id": engine_id,
            "agent_name": self.agent.name,
            "agent_metadata_b64": base64.b64encode(self.agent.get_agent_metadata()).decode("ascii"),
            "layout": layout.to_json(),
            "regions": {name: r.to_json() for name, r in regions.items()},
        }
        self._server = _SideChannel((_bind_host(self.host), self.port), self.document)
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, name="nixl-side-channel", daemon=True).start()

    # ------------------------------------------------------------------ prefill side
    def params_for(self, request_id: str, block_ids: list[int], num_tokens: int) -> dict[str, Any]:
        """The ``kv_transfer_params`` of a prefill reply (vLLM 0.33's NixlConnector field set)."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(block_ids)],  # one KV cache group
            "remote_engine_id": self.engine_id,
            "remote_request_id": request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": num_tokens,
            "remote_blocks_expiry_time": None,
            "remote_registration_generation": 0,
            "transfer_mode": "pull",
        }

    def read_notifications(self) -> list[str]:
        """Request ids whose blocks a decoder has finished reading."""
        done = []
        for messages in self.agent.get_new_notifs().values():
            done += [m.decode() if isinstance(m, bytes) else str(m) for m in messages]
        return done

    # ------------------------------------------------------------------ decode side
    def pull(self, params: dict[str, Any], local_blocks: list[int], *, timeout_s: float = 30.0,
             fault: str = "") -> int:
        """READ the remote request's blocks into ``local_blocks`` of every region; returns the bytes
        moved. Notifies the prefill engine so it frees the blocks. ``fault`` (negative controls only,
        ``HISPARSE_CPU_ENGINE_FAULT_FILE``): ``pull-nothing`` reports the bytes without moving them,
        ``corrupt`` overwrites them once they arrived."""
        try:
            remote_blocks = params["remote_block_ids"]
            if remote_blocks and isinstance(remote_blocks[0], list):
                if len(remote_blocks) != 1:
                    raise KVPullError(f"{len(remote_blocks)} KV cache groups offered; this engine has one")
                remote_blocks = remote_blocks[0]
            peer = self._peer(str(params["remote_engine_id"]), str(params["remote_host"]), int(params["remote_port"]))
            request_id = str(params["remote_request_id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise KVPullError(f"kv_transfer_params lack what a pull needs: {exc!r}") from exc
        if len(remote_blocks) < len(local_blocks):
            raise KVPullError(f"prefill offered {len(remote_blocks)} blocks for {len(local_blocks)} needed")
        bs = self.layout.block_size
        local, remote = [], []
        for name, mine in self.regions.items():
            theirs = peer.regions[name]
            for layer in range(mine.layers):
                for lb, rb in zip(local_blocks, remote_blocks):
                    size = bs * mine.row_bytes
                    local.append((mine.addr + (layer * mine.slots + lb * bs) * mine.row_bytes, size, 0))
                    remote.append((theirs.addr + (layer * theirs.slots + int(rb) * bs) * theirs.row_bytes, size, 0))
        total = sum(d[1] for d in local)
        if fault == "pull-nothing":
            log.warning("request %s: fault injected, %d bytes reported as read and not moved", request_id, total)
            self.agent.send_notif(peer.agent_name, request_id.encode())
            return total
        try:
            handle = self.agent.initialize_xfer("READ", self.agent.get_xfer_descs(local, "DRAM"),
                                                self.agent.get_xfer_descs(remote, "DRAM"), peer.agent_name,
                                                request_id.encode())  # fmt: skip
        except Exception as exc:
            raise KVPullError(f"NIXL could not create the READ from {peer.agent_name}: {exc}") from exc
        try:
            state = self.agent.transfer(handle)
            deadline = time.monotonic() + timeout_s
            while state not in ("DONE", "ERR"):
                if time.monotonic() > deadline:
                    raise KVPullError(f"NIXL READ of {total} bytes not done within {timeout_s:.0f}s")
                time.sleep(0.0005)
                state = self.agent.check_xfer_state(handle)
            if state == "ERR":
                raise KVPullError("NIXL reported ERR for the READ")
        finally:
            try:
                handle.release()
            except Exception:
                log.debug("release failed", exc_info=True)
        if fault == "corrupt":
            log.warning("request %s: fault injected, the %d bytes read are overwritten", request_id, total)
            for addr, size, _ in local:
                ctypes.memset(addr, 0x3C, size)
        with self._lock:
            self.bytes_pulled += total
        return total

    def _peer(self, engine_id: str, host: str, port: int) -> _Peer:
        with self._lock:
            peer = self._peers.get(engine_id)
        if peer is not None:
            return peer
        url = f"http://{_url_host(host)}:{port}{HANDSHAKE_PATH}"
        try:
            doc = httpx.get(url, timeout=10.0).raise_for_status().json()
        except (httpx.HTTPError, ValueError) as exc:
            raise KVPullError(f"NIXL handshake with {url} failed: {exc}") from exc
        if doc.get("engine_id") != engine_id:
            raise KVPullError(f"{url} is engine {doc.get('engine_id')!r}, the params name {engine_id!r}")
        if doc.get("layout") != self.layout.to_json():
            raise KVPullError(f"engine {engine_id} has KV layout {doc.get('layout')}, this engine"
                              f" {self.layout.to_json()}: they cannot exchange blocks")  # fmt: skip
        regions = {name: Region(**r) for name, r in doc["regions"].items()}
        for name, mine in self.regions.items():
            theirs = regions.get(name)
            if theirs is None or (theirs.layers, theirs.row_bytes) != (mine.layers, mine.row_bytes):
                raise KVPullError(f"engine {engine_id} region {name!r} is {theirs}, this engine's {mine}")
        name = self.agent.add_remote_agent(base64.b64decode(doc["agent_metadata_b64"]))
        name = name.decode() if isinstance(name, bytes) else str(name)
        peer = _Peer(name, regions)
        with self._lock:
            self._peers[engine_id] = peer
        return peer

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        for reg in self._regs:
            try:
                self.agent.deregister_memory(reg)
            except Exception:
                log.debug("deregister failed", exc_info=True)
        self._regs = []


def _bind_host(host: str) -> str:
    return "0.0.0.0" if host in ("", "0.0.0.0") else ("127.0.0.1" if host == "localhost" else host)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class _SideChannel(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], document: dict[str, Any]) -> None:
        self.body = json.dumps(document).encode()
        super().__init__(address, _SideChannelHandler)


class _SideChannelHandler(BaseHTTPRequestHandler):
    server: _SideChannel

    def do_GET(self) -> None:  # noqa: N802
        ok = self.path == HANDSHAKE_PATH
        body = self.server.body if ok else b'{"error": "not found"}'
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass
