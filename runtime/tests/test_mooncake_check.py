"""Mooncake check against a real ``mooncake_master`` on loopback ports."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rtsupport import child_env, cli, free_port

from hisparse_runtime.mooncake_check import EXIT_CODES, MIB, MooncakeTarget, check_mooncake

MASTER_BIN = shutil.which("mooncake_master") or str(Path(sys.executable).with_name("mooncake_master"))
pytest.importorskip("mooncake.store", reason="mooncake-transfer-engine is not installed")
if not Path(MASTER_BIN).exists():
    pytest.skip("the mooncake_master binary is not installed", allow_module_level=True)


class Master:
    """A real mooncake_master with its HTTP metadata server, on free loopback ports."""

    def __init__(self) -> None:
        self.rpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Master:
        self.proc = subprocess.Popen(
            [MASTER_BIN, f"--rpc_port={self.rpc_port}", "--rpc_address=127.0.0.1",
             "--enable_http_metadata_server=true", f"--http_metadata_server_port={self.http_port}",
             "--http_metadata_server_host=127.0.0.1", f"--metrics_port={self.metrics_port}",
             "--metrics_host=127.0.0.1"],  # fmt: skip
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with {self.proc.returncode}")
            if _accepts(self.rpc_port) and _accepts(self.http_port):
                return self
            time.sleep(0.1)
        raise RuntimeError("mooncake_master did not open its ports within 20 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def target(self, **overrides: int) -> MooncakeTarget:
        return MooncakeTarget(
            master=f"127.0.0.1:{self.rpc_port}",
            metadata_server=f"http://127.0.0.1:{self.http_port}/metadata",
            **overrides,
        )


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def master() -> Iterator[Master]:
    m = Master().start()
    yield m
    m.stop()


def test_healthy_store_puts_and_gets_a_block(master: Master) -> None:
    result = check_mooncake(master.target(block_bytes=4 * MIB), timeout_s=60)
    assert result.ok, result.error
    assert [s.name for s in result.steps] == ["master_tcp", "metadata_http", "setup", "put", "get", "verify", "remove"]
    assert all(s.ok for s in result.steps)
    assert result.steps[4].detail == f"{4 * MIB} bytes"


def test_master_down_fails_fast_and_names_the_address() -> None:
    port = free_port()
    target = MooncakeTarget(master=f"127.0.0.1:{port}", metadata_server=f"http://127.0.0.1:{free_port()}/metadata")
    started = time.monotonic()
    result = check_mooncake(target, timeout_s=60)
    assert time.monotonic() - started < 5, "no 90 s setup retry loop"
    assert not result.ok and result.failure == "master_unreachable"
    assert f"127.0.0.1:{port}" in (result.error or "")
    assert result.exit_code == EXIT_CODES["master_unreachable"]


def test_p2p_handshake_metadata_needs_no_http_server(master: Master) -> None:
    target = MooncakeTarget(master=f"127.0.0.1:{master.rpc_port}", metadata_server="P2PHANDSHAKE")
    result = check_mooncake(target, timeout_s=60)
    assert result.ok, result.error
    assert "metadata_http" not in [s.name for s in result.steps]
    assert result.steps[-1].name == "remove" and result.steps[-1].detail == "", "the probe block was removed"


def test_a_port_that_is_not_a_master_times_out_within_the_deadline() -> None:
    # A TCP listener that accepts and never speaks: the client's setup would retry for ~90 s.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        target = MooncakeTarget(master=f"127.0.0.1:{port}", metadata_server="P2PHANDSHAKE")
        started = time.monotonic()
        result = check_mooncake(target, timeout_s=4)
        elapsed = time.monotonic() - started
    assert result.failure == "timeout" and "setup" not in [s.name for s in result.steps if s.ok]
    assert "Client log: " in (result.error or ""), "the blocked client's own log says where it was"
    assert elapsed < 4 + 10, "deadline plus the kill grace"


def test_metadata_server_down_is_its_own_failure(master: Master) -> None:
    target = MooncakeTarget(master=f"127.0.0.1:{master.rpc_port}", metadata_server=f"http://127.0.0.1:{free_port()}/metadata")
    result = check_mooncake(target, timeout_s=30)
    assert result.failure == "metadata_unreachable"
    assert [s.name for s in result.steps] == ["master_tcp", "metadata_http"]


def test_master_restart_is_reported_then_recovers(master: Master) -> None:
    assert check_mooncake(master.target(), timeout_s=60).ok
    master.stop()
    down = check_mooncake(master.target(), timeout_s=30)
    assert down.failure == "master_unreachable"
    master.start()  # same ports, fresh master state
    again = check_mooncake(master.target(), timeout_s=60)
    assert again.ok, again.error


def test_block_larger_than_every_segment_reports_a_full_store(master: Master) -> None:
    target = master.target(global_segment_bytes=16 * MIB, local_buffer_bytes=32 * MIB, block_bytes=24 * MIB)
    result = check_mooncake(target, timeout_s=60)
    assert not result.ok and result.failure == "store_full"
    assert "global_segment_size" in (result.error or "") and "-200" in (result.error or "")
    assert result.steps[-1].name == "put" and not result.steps[-1].ok


def test_global_segment_under_the_minimum_is_a_clear_setup_error(master: Master) -> None:
    result = check_mooncake(master.target(global_segment_bytes=1 * MIB), timeout_s=60)
    assert result.failure == "setup_failed"
    assert "at least 16 MiB" in (result.error or "")


def test_cli_prints_one_result_and_uses_the_failure_exit_code(master: Master, tmp_path: Path) -> None:
    config = tmp_path / "mooncake.json"
    config.write_text(json.dumps({
        "local_hostname": "127.0.0.1", "metadata_server": f"http://127.0.0.1:{master.http_port}/metadata",
        "master_server_address": f"127.0.0.1:{master.rpc_port}", "protocol": "tcp",
        "global_segment_size": 16 * MIB, "local_buffer_size": 16 * MIB,
    }))  # fmt: skip
    ok = subprocess.run(cli("mooncake-check", "--config", str(config), "--block-kib", "64"),
                        capture_output=True, text=True, timeout=120, env=child_env())  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr[-2000:]
    assert len(ok.stdout.strip().splitlines()) == 1 and json.loads(ok.stdout)["ok"] is True
    master.stop()
    down = subprocess.run(cli("mooncake-check", "--config", str(config)),
                          capture_output=True, text=True, timeout=120, env=child_env())  # fmt: skip
    assert down.returncode == EXIT_CODES["master_unreachable"]
    assert json.loads(down.stdout)["failure"] == "master_unreachable"
