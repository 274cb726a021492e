"""A stand-in for llm-d's routing sidecar (``pd-sidecar -connector nixlv2``), for tests on one host.

It drives P/D the way the sidecar's NIXL v2 connector drives vLLM: a completion carrying the
``x-prefiller-host-port`` header is first sent to that prefiller with ``max_tokens: 1``, ``stream:
false`` and ``kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill": false,
"remote_engine_id": null, ...}``; the prefiller's reply's ``kv_transfer_params`` are put into the
original request, which goes to the local decoder. Both legs carry one ``x-request-id``. Without the
header the request goes to the decoder unchanged. No allow-list (SSRF guard), data-parallel fan-out,
chat or streaming: those are the real sidecar's, tested where it runs.
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

__all__ = ["PREFILLER_HEADER", "PDProxy"]

PREFILLER_HEADER = "x-prefiller-host-port"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        r = httpx.get(self.server.decoder + self.path, timeout=30)
        self._send(r.status_code, r.content, r.headers.get("content-type", "application/json"))

    def do_POST(self) -> None:  # noqa: N802
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        prefiller = self.headers.get(PREFILLER_HEADER)
        if not prefiller or self.path != "/v1/completions":
            r = httpx.post(self.server.decoder + self.path, content=raw, timeout=120,
                           headers={"content-type": "application/json"})  # fmt: skip
            self._send(r.status_code, r.content, r.headers.get("content-type", "application/json"))
            return
        try:
            request: dict[str, Any] = json.loads(raw)
        except ValueError as exc:
            self._send(400, json.dumps({"error": {"message": str(exc)}}).encode(), "application/json")
            return
        request_id = str(uuid.uuid4())
        headers = {"content-type": "application/json", "x-request-id": request_id}
        prefill = dict(request)
        prefill["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False,
                                         "remote_engine_id": None, "remote_block_ids": None,
                                         "remote_host": None, "remote_port": None}  # fmt: skip
        prefill["stream"] = False
        prefill.pop("stream_options", None)
        prefill["max_tokens"] = 1
        p = httpx.post(f"http://{prefiller}/v1/completions", json=prefill, headers=headers, timeout=120)
        with self.server.lock:
            self.server.prefills.append({"to": prefiller, "status": p.status_code})
        if not 200 <= p.status_code < 300:
            self._send(p.status_code, p.content, p.headers.get("content-type", "application/json"))
            return
        decode = dict(request)
        decode["kv_transfer_params"] = p.json().get("kv_transfer_params")
        d = httpx.post(self.server.decoder + "/v1/completions", json=decode, headers=headers, timeout=120)
        self._send(d.status_code, d.content, d.headers.get("content-type", "application/json"))

    def _send(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], decoder: str) -> None:
        super().__init__(address, _Handler)
        self.decoder = decoder.rstrip("/")
        self.lock = threading.Lock()
        self.prefills: list[dict[str, Any]] = []


class PDProxy:
    """Serve on ``host:port`` (0: a free port) in front of the decoder at ``decoder_url``."""

    def __init__(self, decoder_url: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = _Server((host, port), decoder_url)
        self._thread = threading.Thread(target=self._server.serve_forever, name="pd-proxy", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def prefills(self) -> list[dict[str, Any]]:
        """The prefill legs sent so far (prefiller and its HTTP status)."""
        with self._server.lock:
            return list(self._server.prefills)

    def __enter__(self) -> PDProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
