"""The serving container's liveness and readiness over HTTP, answered by the entrypoint itself.

``GET /livez`` and ``GET /readyz`` on :data:`~hisparse_runtime.engine.PROBE_PORT` answer what
``hisparse-runtime probe live|ready`` answers (:mod:`hisparse_runtime.probes`): 200, or 503 with the reason
as the body. The kubelet makes these GETs itself; an exec probe starts a Python process in the container at
every period instead, about a second of CPU each on a busy node, which on a node of many serving pods is
cores spent on probing.

A readiness answer may run a decode pod's data-path proof (a NIXL read and a completion through the
sidecar). Proofs run one at a time, and a failed answer is reused for :data:`MIN_RECHECK_SECONDS`, so
requests from anything that can reach the port cannot make the pod prove its data path in a loop. Each
change of an answer is logged with its reason: the kubelet's Event for an HTTP probe shows the status code,
the container log says why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

from hisparse_runtime import probes
from hisparse_runtime.engine import LIVENESS_PATH, PROBE_CHECK_SECONDS, PROBE_PORT, READINESS_PATH, RoleSettings

log = logging.getLogger("hisparse.probes")

MIN_RECHECK_SECONDS: Final = 1.0
"""A failed answer younger than this is given again instead of checking again."""

Check = Callable[[], tuple[int, str]]


class _Answer:
    """One probe kind: checks one at a time, reuses a fresh failure, logs each change."""

    def __init__(self, kind: str, check: Check) -> None:
        self.kind, self.check = kind, check
        self.lock = threading.Lock()
        self.last: tuple[int, str, float] | None = None

    def __call__(self) -> tuple[int, str]:
        with self.lock:
            now = time.monotonic()
            if self.last is not None and self.last[0] != probes.EXIT_OK and now - self.last[2] < MIN_RECHECK_SECONDS:
                return self.last[0], self.last[1]
            try:
                code, message = self.check()
            except Exception as exc:  # a bug in a check is a failed probe with its reason, never a dead server
                code, message = probes.EXIT_FAIL, f"the {self.kind} check raised {type(exc).__name__}: {exc}"
            if self.last is None or (self.last[0] == probes.EXIT_OK) != (code == probes.EXIT_OK):
                log.log(logging.INFO if code == probes.EXIT_OK else logging.WARNING, "%s: %s (%s)", self.kind,
                        "passing" if code == probes.EXIT_OK else "failing", message)
            self.last = (code, message, now)
            return code, message


class ProbeServer:
    """``/livez`` and ``/readyz`` for ``settings``, on a thread of the entrypoint. The ports default to the
    pod's; tests on one host pass their own."""

    def __init__(self, settings: RoleSettings, *, host: str = "0.0.0.0", port: int = PROBE_PORT,
                 timeout: float = PROBE_CHECK_SECONDS, vllm_port: int | None = None, **ready_ports: int) -> None:
        answers = {
            LIVENESS_PATH: _Answer("liveness", lambda: probes.live(settings, timeout, vllm_port=vllm_port)),
            READINESS_PATH: _Answer("readiness", lambda: probes.ready(settings, timeout, vllm_port=vllm_port,
                                                                      **ready_ports)),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                answer = answers.get(self.path.split("?", 1)[0])
                if answer is None:
                    code, status, message = probes.EXIT_FAIL, 404, f"no probe at {self.path}"
                else:
                    code, message = answer()
                    status = 200 if code == probes.EXIT_OK else 503
                body = (message + "\n").encode()
                self.send_response(status)
                self.send_header("content-type", "text/plain; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass  # one line per kubelet GET would drown the log; changes are logged by _Answer

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="probe-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> ProbeServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
