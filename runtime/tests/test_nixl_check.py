"""NIXL link check with real agents: in-process, and across two processes over UCX on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from rtsupport import Child, cli, free_port

from hisparse_runtime.nixl_check import (
    EXIT_CODES,
    PublishedBuffer,
    Publisher,
    check_loopback,
    fetch_document,
    read_peer,
)
from hisparse_runtime.nixl_check.agent import load_nixl, new_agent, pattern_bytes
from hisparse_runtime.nixl_check.transfer import Progress, attach_peer, read_parts

try:
    load_nixl()
except Exception as exc:  # capability, not failure: the package is absent from this environment
    pytest.skip(f"NIXL is not installed: {exc}", allow_module_level=True)

SEED = 7
MIB = 1 << 20


def start_publisher(children: list[Child], *, size_mib: int = 16, parts: int = 8) -> tuple[Child, str]:
    child = Child(
        cli("nixl-check", "publish", "--host", "127.0.0.1", "--port", "0",
            "--size-mib", str(size_mib), "--parts", str(parts), "--seed", str(SEED))  # fmt: skip
    )
    children.append(child)
    ready = child.next_json(timeout=60)
    assert ready["event"] == "ready", ready
    assert ready["bytes"] == size_mib * MIB and ready["parts"] == parts
    return child, ready["url"]


def test_loopback_moves_every_part_intact() -> None:
    result = check_loopback(size_bytes=4 * MIB, parts=8)
    assert result.ok, result.error
    assert result.mode == "loopback"
    assert (result.parts_done, result.parts_total) == (8, 8)
    assert result.bytes_verified == result.bytes_total == 4 * MIB
    assert result.bandwidth_bytes_per_s > 0 and result.failure is None


def test_loopback_refuses_a_backend_that_does_not_load() -> None:
    result = check_loopback(size_bytes=MIB, parts=2, backends=["UCX", "NO_SUCH_BACKEND"])
    assert not result.ok
    assert result.failure == "backend_unavailable"
    assert "NO_SUCH_BACKEND" in (result.error or "")
    assert result.bytes_verified == 0 and result.exit_code == EXIT_CODES["backend_unavailable"]


def test_bytes_read_from_another_process_equal_what_it_published(children: list[Child]) -> None:
    # Independent of the check's own checksums: compare with the publisher's seeded pattern.
    _, url = start_publisher(children, size_mib=8, parts=4)
    document = fetch_document(url)
    agent = new_agent("test-decode", ["UCX"])
    remote = attach_peer(agent, document)
    dst = np.zeros(document.total_bytes, dtype=np.uint8)
    done: list[int] = []
    read_parts(agent, remote, document, dst, Progress(), deadline=time.monotonic() + 30, on_part_done=done.append)
    assert sorted(done) == [0, 1, 2, 3]
    assert np.array_equal(dst, pattern_bytes(8 * MIB, SEED))


def test_read_between_processes_reports_each_part_once_and_bandwidth(children: list[Child]) -> None:
    _, url = start_publisher(children, size_mib=16, parts=8)
    seen: list[int] = []
    result = read_peer(url, timeout_s=30, max_in_flight=3, on_part_done=seen.append)
    assert result.ok, result.error
    assert sorted(seen) == list(range(8)), "every part reported exactly once"
    assert result.parts_done == result.parts_total == 8
    assert result.bytes_verified == 16 * MIB and result.bandwidth_bytes_per_s > 0


def test_cli_read_prints_one_result_and_exits_zero(children: list[Child]) -> None:
    _, url = start_publisher(children, size_mib=4, parts=4)
    env = children_env()
    env.pop("UCX_MODULES", None)  # all UCX modules, as in a pod: the exit code must still be ours
    run = subprocess.run(cli("nixl-check", "read", "--peer", url, "--timeout", "20"),
                         capture_output=True, text=True, timeout=90, env=env)  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(lines) == 1
    assert json.loads(lines[0])["bytes_verified"] == 4 * MIB


def test_peer_killed_mid_transfer_gives_one_failure_and_no_data(children: list[Child]) -> None:
    publisher, url = start_publisher(children, size_mib=32, parts=32)
    killed: list[int] = []

    def kill_after_first_part(index: int) -> None:
        if not killed:
            os.kill(publisher.proc.pid, signal.SIGKILL)
            publisher.proc.wait(timeout=10)
            killed.append(index)

    started = time.monotonic()
    result = read_peer(url, timeout_s=15, max_in_flight=1, on_part_done=kill_after_first_part)
    elapsed = time.monotonic() - started
    assert killed, "the publisher was killed after the first part"
    assert not result.ok
    assert result.failure in ("transfer_failed", "timeout")
    assert 1 <= result.parts_done < result.parts_total, "done is not claimed for parts never read"
    assert result.bytes_verified == 0 and result.bandwidth_bytes_per_s == 0
    assert elapsed < 15 + 10, "bounded by the deadline plus grace"


def test_unreachable_peer_fails_fast_with_one_report() -> None:
    port = free_port()  # nothing listens here
    started = time.monotonic()
    run = subprocess.run(cli("nixl-check", "read", "--peer", f"http://127.0.0.1:{port}", "--wait", "1"),
                         capture_output=True, text=True, timeout=60, env=children_env())  # fmt: skip
    elapsed = time.monotonic() - started
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert run.returncode == EXIT_CODES["peer_unreachable"]
    assert result["failure"] == "peer_unreachable" and str(port) in result["error"]
    assert elapsed < 30


def test_http_server_that_is_not_a_publisher_is_reported_unreachable(children: list[Child]) -> None:
    _, url = start_publisher(children, size_mib=1, parts=1)
    result = read_peer(url + "/not-here", timeout_s=5)
    assert result.failure == "peer_unreachable" and "404" in (result.error or "")


@pytest.mark.parametrize(
    ("tamper", "failure", "needle"),
    [
        (lambda d: d.model_copy(update={"agent_metadata_b64": "bm90IG1ldGFkYXRh"}), "bad_metadata", "metadata"),
        (lambda d: d.model_copy(update={"agent_metadata_b64": "%%%"}), "bad_metadata", "base64"),
        (lambda d: d.model_copy(update={"agent_name": "someone-else"}), "bad_metadata", "someone-else"),
        (
            lambda d: d.model_copy(update={"parts": [p.model_copy(update={"addr": p.addr + (1 << 40)}) for p in d.parts]}),
            "bad_metadata",
            "registered",
        ),
        (
            lambda d: d.model_copy(update={"parts": [d.parts[0], d.parts[1].model_copy(update={"sha256": "0" * 64})]}),
            "checksum_mismatch",
            "parts [1]",
        ),
    ],
    ids=["garbage-metadata", "not-base64", "wrong-agent-name", "unregistered-address", "wrong-checksum"],
)
def test_tampered_documents_give_one_clear_failure(children: list[Child], tamper, failure: str, needle: str) -> None:
    # The real publisher runs in a child process; we re-serve its document with one field altered.
    _, url = start_publisher(children, size_mib=2, parts=2)
    with Publisher(tamper(fetch_document(url)), "127.0.0.1", 0) as forged:
        result = read_peer(forged.url, timeout_s=10)
    assert not result.ok and result.failure == failure, result
    assert needle in (result.error or "")
    assert result.bytes_verified == 0


def test_document_of_another_protocol_version_is_refused(children: list[Child]) -> None:
    _, url = start_publisher(children, size_mib=1, parts=1)
    raw = json.loads(fetch_document(url).model_dump_json())
    raw["protocol"] = "hisparse.nixl-check/v9"
    with _RawServer(json.dumps(raw).encode()) as server:
        result = read_peer(server.url, timeout_s=5)
    assert result.failure == "bad_metadata" and "v9" in (result.error or "")


def test_published_document_round_trips_through_its_model(children: list[Child]) -> None:
    _, url = start_publisher(children, size_mib=1, parts=3)
    document = fetch_document(url)
    assert isinstance(document, PublishedBuffer)
    assert document.total_bytes == MIB and len(document.parts) == 3
    assert document.parts[1].addr == document.parts[0].addr + document.parts[0].length


def children_env() -> dict[str, str]:
    from rtsupport import child_env

    return child_env()


class _RawServer:
    """Serves fixed bytes at the buffer path: a peer speaking some other version of the protocol."""

    def __init__(self, body: bytes) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> _RawServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_default_port_is_the_engines_link_check_port() -> None:
    from hisparse_runtime.engine import NixlSettings
    from hisparse_runtime.nixl_check import DEFAULT_PORT

    assert NixlSettings().link_check_port == DEFAULT_PORT


def test_ucx_warnings_stay_off_stdout() -> None:
    # cuda_ipc does not exist on a CPU machine: UCX warns (to stdout by default) and uses tcp.
    env = children_env()
    env["UCX_TLS"] = "cuda_ipc,tcp"
    env.pop("UCX_LOG_FILE", None)
    run = subprocess.run(cli("nixl-check", "loopback", "--size-mib", "1", "--parts", "2"),
                         capture_output=True, text=True, timeout=90, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(run.stdout.strip().splitlines()) == 1 and json.loads(run.stdout)["ok"] is True
    assert "cuda_ipc" in run.stderr


def test_publisher_stops_cleanly_on_sigterm(children: list[Child]) -> None:
    publisher, url = start_publisher(children, size_mib=1, parts=1)
    publisher.proc.send_signal(signal.SIGTERM)
    assert publisher.next_json(timeout=15) == {"event": "stopped"}
    assert publisher.proc.wait(timeout=15) == 0
    assert read_peer(url, timeout_s=5).failure == "peer_unreachable"
