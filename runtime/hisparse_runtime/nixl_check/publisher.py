"""The prefill side: serve a registered buffer's NIXL metadata and descriptors over a small HTTP port.

It runs beside vLLM's NIXL side channels (5600 + DP rank) on ``DEFAULT_PORT`` (5590). It only answers
``GET /nixl-check/v1/buffer`` (the ``PublishedBuffer`` JSON) and ``GET /healthz``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hisparse_runtime.nixl_check.models import BUFFER_PATH, PublishedBuffer
from hisparse_runtime.nixl_check.source import SourceBuffer


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path == BUFFER_PATH:
            self._reply(200, self.server.document.model_dump_json().encode())
        elif self.path == "/healthz":
            self._reply(200, b'{"ok": true}')
        else:
            self._reply(404, json.dumps({"error": f"unknown path {self.path}"}).encode())

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # one access line per probe would drown the pod log


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    document: PublishedBuffer


class Publisher:
    """Serves ``document`` on ``host:port`` (port 0 picks a free one) from a background thread."""

    def __init__(self, document: PublishedBuffer, host: str, port: int) -> None:
        self._server = _Server((host, port), _Handler)
        self._server.document = document
        self._thread = threading.Thread(target=self._server.serve_forever, name="nixl-check-http", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Publisher:
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Publisher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def publish(source: SourceBuffer, host: str, port: int) -> Publisher:
    """Start serving ``source``'s document; the caller keeps ``source`` open while peers read."""
    return Publisher(source.document, host, port).start()
