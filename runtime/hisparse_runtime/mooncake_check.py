"""Mooncake store check: the master answers and a store client can put and get a block.

The check runs in three bounded steps: a TCP connect to the master's RPC port, an HTTP request to
the metadata server, then a store client in a child process (``mooncake_client``) that sets up, puts
a random block, gets it back, compares and removes it. The client runs in a child because ``setup``
retries a dead master for about 90 s and native calls cannot be interrupted; the parent kills it at
the deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MooncakeCheckResult", "MooncakeTarget", "StepResult", "add_parser", "check_mooncake", "run"]

MIB = 1 << 20
MIN_SEGMENT_BYTES = 16 * MIB
"""Smallest global segment or local buffer the store client accepts."""

MooncakeFailure = Literal[
    "client_unavailable",
    "master_unreachable",
    "metadata_unreachable",
    "setup_failed",
    "store_full",
    "put_failed",
    "get_failed",
    "data_mismatch",
    "timeout",
]
"""Why the check failed; each maps to its own exit code in ``EXIT_CODES``."""

EXIT_CODES: dict[MooncakeFailure, int] = {
    "client_unavailable": 20,
    "master_unreachable": 21,
    "metadata_unreachable": 22,
    "setup_failed": 23,
    "store_full": 24,
    "put_failed": 25,
    "get_failed": 26,
    "data_mismatch": 27,
    "timeout": 28,
}

class MooncakeTarget(BaseModel):
    """Where the store is and how the probing client joins it (the fields of Mooncake's setup)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    master: str = Field(pattern=r"^[^:\s]+:\d+$", description="Master RPC address, host:port.")
    metadata_server: str = Field(
        description="Transfer-engine metadata server: http://host:port/metadata, or P2PHANDSHAKE."
    )
    local_hostname: str = Field(default="127.0.0.1", description="Address this client advertises to peers.")
    protocol: Literal["tcp", "rdma"] = Field(default="tcp", description="Transfer protocol.")
    rdma_devices: str = Field(default="", description="Comma-separated RDMA devices; empty for tcp.")
    global_segment_bytes: int = Field(
        default=MIN_SEGMENT_BYTES, ge=0, description="Segment this client contributes to the store (>= 16 MiB)."
    )
    local_buffer_bytes: int = Field(default=MIN_SEGMENT_BYTES, gt=0, description="Client staging buffer (>= 16 MiB).")
    block_bytes: int = Field(default=MIB, gt=0, description="Size of the block put and read back.")


class StepResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Literal["master_tcp", "metadata_http", "setup", "put", "get", "verify", "remove"]
    ok: bool
    seconds: float = Field(ge=0)
    detail: str = ""


class MooncakeCheckResult(BaseModel):
    """The single outcome of one Mooncake check."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    master: str
    steps: list[StepResult]
    failure: MooncakeFailure | None = None
    error: str | None = Field(default=None, description="What went wrong and what to do; None when ok.")

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else EXIT_CODES[self.failure or "setup_failed"]


class _Failed(Exception):
    def __init__(self, kind: MooncakeFailure, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def check_mooncake(
    target: MooncakeTarget, *, timeout_s: float = 30.0, connect_timeout_s: float = 3.0
) -> MooncakeCheckResult:
    """Run the check; never raises and returns within about ``timeout_s`` plus the connect timeouts."""
    steps: list[StepResult] = []
    try:
        _probe_master(target, steps, connect_timeout_s)
        _probe_metadata(target, steps, connect_timeout_s)
        _run_client(target, steps, timeout_s)
    except _Failed as exc:
        return MooncakeCheckResult(ok=False, master=target.master, steps=steps, failure=exc.kind, error=exc.message)
    return MooncakeCheckResult(ok=True, master=target.master, steps=steps)


def _probe_master(target: MooncakeTarget, steps: list[StepResult], timeout_s: float) -> None:
    host, port = target.master.rsplit(":", 1)
    started = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        steps.append(StepResult(name="master_tcp", ok=False, seconds=time.monotonic() - started, detail=str(exc)))
        raise _Failed(
            "master_unreachable",
            f"Mooncake master at {target.master} is not accepting connections ({exc}). Check that the"
            " mooncake_master pod is running and that --rpc_port and the Service port match.",
        ) from exc
    steps.append(StepResult(name="master_tcp", ok=True, seconds=time.monotonic() - started))


def _probe_metadata(target: MooncakeTarget, steps: list[StepResult], timeout_s: float) -> None:
    if not target.metadata_server.startswith(("http://", "https://")):
        return  # P2PHANDSHAKE or etcd: nothing to probe over HTTP
    started = time.monotonic()
    try:
        # Any HTTP answer proves the server is up; a missing key answers 404.
        response = httpx.get(target.metadata_server, params={"key": "hisparse-check"}, timeout=timeout_s)
    except httpx.HTTPError as exc:
        steps.append(StepResult(name="metadata_http", ok=False, seconds=time.monotonic() - started, detail=str(exc)))
        raise _Failed(
            "metadata_unreachable",
            f"metadata server {target.metadata_server} did not answer ({type(exc).__name__}: {exc}). Start the"
            " master with --enable_http_metadata_server=true or point --metadata-server at the right address.",
        ) from exc
    steps.append(
        StepResult(name="metadata_http", ok=True, seconds=time.monotonic() - started, detail=f"HTTP {response.status_code}")
    )


def _run_client(target: MooncakeTarget, steps: list[StepResult], timeout_s: float) -> None:
    # A fresh interpreter (not multiprocessing) so the caller's __main__ is never re-imported; the
    # steps come back as JSON lines on a dedicated pipe, away from the client library's own output.
    # The client's log goes to a file, not a pipe: the transfer engine logs freely, and a full pipe
    # nobody reads until the end would block it mid-setup.
    log = tempfile.TemporaryFile()
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hisparse_runtime.mooncake_client", str(write_fd), target.model_dump_json()],
        pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )  # fmt: skip
    os.close(write_fd)
    reports: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe, selectors.DefaultSelector() as sel:
            sel.register(pipe, selectors.EVENT_READ)
            buffer = b""
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    proc.kill()  # a blocked native call never returns; its log says where it was
                    proc.wait(timeout=5)
                    tail = _log_tail(log)
                    raise _Failed(
                        "timeout",
                        f"the store client did not finish within {timeout_s:.0f}s (last step: "
                        f"{reports[-1]['name'] if reports else 'starting'}). The master may be overloaded or a"
                        " transfer is stuck; check the master's log and the client's network path."
                        + (f" Client log: {tail}" if tail else ""),
                    )
                chunk = pipe.read(65536)
                if not chunk:
                    proc.wait(timeout=5)
                    raise _Failed(
                        "setup_failed",
                        f"the store client exited unexpectedly (exit code {proc.returncode}) after"
                        f" {reports[-1]['name'] if reports else 'start'}: {_log_tail(log)}",
                    )
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    report = json.loads(line)
                    if report.get("end"):
                        return
                    reports.append(report)
                    steps.append(StepResult(name=report["name"], ok=report["ok"], seconds=report["seconds"],
                                            detail=report["detail"]))  # fmt: skip
                    if not report["ok"]:
                        raise _Failed(report["kind"], report["message"])
    finally:
        if proc.poll() is None:
            try:
                proc.wait(timeout=5)  # the client closes its store after the last step
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        log.close()


def _log_tail(log: Any) -> str:
    log.seek(0)
    text = log.read().decode(errors="replace").strip().splitlines()
    return " | ".join(text[-3:])


# --- command line -----------------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "mooncake-check",
        help="check the Mooncake master is reachable and a store client can put and get a block",
        description="Prints one JSON result on stdout; exit code 0 when the block round-tripped.",
    )
    parser.add_argument("--config", default=os.environ.get("MOONCAKE_CONFIG_PATH"),
                        help="Mooncake JSON config as the serving pod has it (default $MOONCAKE_CONFIG_PATH):"
                             " master, metadata server and protocol are read from it; flags override")  # fmt: skip
    parser.add_argument("--master", help="master RPC address host:port")
    parser.add_argument("--metadata-server", help="http://host:port/metadata or P2PHANDSHAKE")
    parser.add_argument("--local-hostname",
                        default=os.environ.get("POD_IP") or os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST"),
                        help="address this client advertises"
                             " (default $POD_IP, $VLLM_NIXL_SIDE_CHANNEL_HOST or 127.0.0.1)")  # fmt: skip
    parser.add_argument("--protocol", choices=["tcp", "rdma"])
    parser.add_argument("--global-segment-mib", type=int)
    parser.add_argument("--local-buffer-mib", type=int)
    parser.add_argument("--block-kib", type=int, default=1024, help="block size in KiB (default 1024)")
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline for the store client (default 30 s)")


def target_from_args(args: argparse.Namespace) -> MooncakeTarget:
    fields: dict[str, Any] = {}
    if args.config:
        with open(args.config, encoding="utf-8") as fh:
            config = json.load(fh)
        # Addresses and protocol only: the sizes in that file are the serving engine's (often GiB);
        # the check mounts its own small segment unless the flags ask for more.
        renames = {"master_server_address": "master", "metadata_server": "metadata_server",
                   "local_hostname": "local_hostname", "protocol": "protocol", "device_name": "rdma_devices"}  # fmt: skip
        fields.update({ours: config[theirs] for theirs, ours in renames.items() if theirs in config})
    flags = {"master": args.master, "metadata_server": args.metadata_server, "local_hostname": args.local_hostname,
             "protocol": args.protocol,
             "global_segment_bytes": args.global_segment_mib * MIB if args.global_segment_mib is not None else None,
             "local_buffer_bytes": args.local_buffer_mib * MIB if args.local_buffer_mib is not None else None}  # fmt: skip
    fields.update({k: v for k, v in flags.items() if v is not None})
    fields["block_bytes"] = args.block_kib * 1024
    return MooncakeTarget(**fields)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        target = target_from_args(args)
    except (ValidationError, OSError, ValueError) as exc:
        print(json.dumps({"ok": False, "failure": "setup_failed", "error": f"invalid check settings: {exc}"}))
        return EXIT_CODES["setup_failed"]
    result = check_mooncake(target, timeout_s=args.timeout)
    print(result.model_dump_json(), flush=True)
    return result.exit_code
