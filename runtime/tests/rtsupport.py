"""Helpers shared by the runtime tests: child processes running our CLI, loopback ports, bounded waits.

A plain module (not conftest) so that test files can import it by a name unique in the repository."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Test machines have no RDMA devices. Keeping UCX's ib and rdmacm modules unloaded avoids a crash
# of the NIXL wheel's bundled libnl at interpreter exit, so pytest's exit status stays its own.
os.environ.setdefault("UCX_MODULES", "^ib,rdmacm")

RUNTIME_DIR = Path(__file__).resolve().parents[1]
REPO_DIR = RUNTIME_DIR.parent


def child_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: our source trees first on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(RUNTIME_DIR), str(REPO_DIR / "kernels")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Child:
    """A child process whose stdout lines are read on a thread, so waits can have deadlines."""

    def __init__(self, argv: list[str], **env: str) -> None:
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(**env)
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr_lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def next_json(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return json.loads(self.lines.get(timeout=0.1))
            except queue.Empty:
                exited = self.proc.poll() is not None
                if exited and self.lines.empty() or time.monotonic() > deadline:
                    time.sleep(0.2)  # let the stderr pump catch up
                    raise AssertionError(
                        f"no output within {timeout}s (exit code {self.proc.poll()});"
                        f" stderr tail: {''.join(self.stderr_lines[-20:])}"
                    ) from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "hisparse_runtime", *args]
