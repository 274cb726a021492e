"""The entrypoint and the probes with real processes, a real NIXL publisher and a real HTTP server.

vLLM itself needs a GPU: where the entrypoint starts it, a small executable named ``vllm`` on PATH
stands in for it (it records its argv and how it was asked to stop)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hisparse_runtime import podstate, probes
from hisparse_runtime.engine import (
    LIVENESS_PATH,
    READINESS_PATH,
    HiSparseSettings,
    KVTransferSettings,
    ModelSettings,
    NixlSettings,
    ParallelSettings,
    RoleSettings,
    render_argv,
)

CLI = [sys.executable, "-m", "hisparse_runtime"]


def decode_settings(**kw) -> RoleSettings:
    base = dict(
        role="decode", image="img",
        model=ModelSettings(source="hf://zai-org/GLM-5.2-FP8", served_model_name="glm", index_topk=2048),
        parallelism=ParallelSettings(nodes=2, gpus_per_node=8, data_parallel_size=16, data_parallel_size_local=8),
        hisparse=HiSparseSettings(host_pool_gib=100), memory_request_gib=900, peer_host="127.0.0.1",
    )
    base.update(kw)
    return RoleSettings(**base)


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HISPARSE_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _write(tmp_path: Path, s: RoleSettings) -> Path:
    path = tmp_path / f"{s.role}.json"
    path.write_text(json.dumps(s.to_json_dict()))
    return path


def test_dry_run_renders_this_pods_argv(tmp_path):
    config = _write(tmp_path, decode_settings())
    env = {**os.environ, "LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": "glm-decode-0.glm-decode"}
    out = subprocess.run([*CLI, "serve", "--role", "decode", "--config", str(config), "--dry-run"],
                         capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout) == render_argv(decode_settings(), worker_index=1, leader_address="glm-decode-0.glm-decode")


def test_settings_breaking_a_rule_exit_before_anything_runs(tmp_path):
    config = _write(tmp_path, decode_settings(enable_dbo=True))
    out = subprocess.run([*CLI, "serve", "--role", "decode", "--config", str(config), "--skip-preflight"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "enableDbo" in out.stderr
    wrong_role = subprocess.run([*CLI, "serve", "--role", "prefill", "--config", str(config)], capture_output=True, text=True)
    assert wrong_role.returncode == 2 and "holds the decode role" in wrong_role.stderr


def test_sigterm_is_forwarded_and_the_pod_marked_draining(tmp_path, state_dir):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "vllm-record"
    fake = bindir / "vllm"
    fake.write_text(f"""#!{sys.executable}
import signal, sys, time, json
open({str(record)!r}, "w").write(json.dumps(sys.argv[1:]))
def stop(signum, frame):
    open({str(record)!r} + ".signal", "w").write(str(signum))
    time.sleep(0.5)  # unpinning
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(0.1)
""")
    fake.chmod(0o755)
    config = _write(tmp_path, decode_settings(parallelism=ParallelSettings(gpus_per_node=8, data_parallel_size=8, data_parallel_size_local=8)))
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "HISPARSE_STATE_DIR": str(state_dir)}
    probe_port = _free_port()
    proc = subprocess.Popen([*CLI, "serve", "--role", "decode", "--config", str(config), "--skip-preflight",
                             "--probe-port", str(probe_port)], env=env)
    deadline = time.monotonic() + 30
    while not record.exists():
        assert time.monotonic() < deadline, "the stand-in vLLM never started"
        time.sleep(0.05)
    assert json.loads(record.read_text())[0] == "serve"
    # The entrypoint answers the kubelet's probes itself: this stand-in serves no /health, so not ready, and why.
    status, body = _get(probe_port, READINESS_PATH)
    assert status == 503 and "/health unreachable" in body, (status, body)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert (tmp_path / "vllm-record.signal").read_text() == str(int(signal.SIGTERM))
    assert (state_dir / podstate.DRAINING).exists()
    assert probes.live(decode_settings(), 1.0)[0] == probes.EXIT_OK  # a draining pod is alive


@pytest.fixture
def vllm_stand_in():
    """A real HTTP server answering /health and /v1/completions like vLLM (and the sidecar in front)."""
    from hisparse_runtime.testing.completions_server import CompletionsServer

    with CompletionsServer(lambda prompt, n: [1] * n, model="glm") as server:
        yield server


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_decode_ready_only_after_a_real_transfer(vllm_stand_in, state_dir):
    from hisparse_runtime.nixl_check import Publisher, SourceBuffer, publish

    port = _port(vllm_stand_in.url)
    settings = decode_settings(kv_transfer=KVTransferSettings(nixl=NixlSettings(link_check_port=_free_port())))
    # No prefill publisher yet: not ready, and the reason names the link check.
    code, why = probes.ready(settings, 5.0, vllm_port=port, sidecar_port=port, prefill_http_port=port)
    assert code == probes.EXIT_FAIL and "NIXL link check" in why
    with SourceBuffer(1 << 20, 4, backends=["UCX"]) as source:
        publisher: Publisher = publish(source, "127.0.0.1", settings.kv_transfer.nixl.link_check_port)
        try:
            before = vllm_stand_in.requests
            code, why = probes.ready(settings, 20.0, vllm_port=port, sidecar_port=port, prefill_http_port=port)
            assert code == probes.EXIT_OK, why
            assert vllm_stand_in.requests == before + 1  # one completion went through the "sidecar"
        finally:
            publisher.close()
    # Verified once: later probes only check health (the publisher is gone now).
    assert probes.ready(settings, 5.0, vllm_port=port)[0] == probes.EXIT_OK
    podstate.mark(podstate.DRAINING)
    assert probes.ready(settings, 5.0, vllm_port=port) == (probes.EXIT_FAIL, "draining")


def test_one_broken_prefill_pod_does_not_decide_decode_readiness(vllm_stand_in, state_dir, monkeypatch):
    """Two prefill pods behind the Service, one of them broken (nothing listens at 127.0.0.2): decode is
    ready through the other, whichever order the probe tries them in; with both broken it is not, and
    the reason names each pod."""
    from hisparse_runtime.nixl_check import Publisher, SourceBuffer, publish

    port = _port(vllm_stand_in.url)
    settings = decode_settings(kv_transfer=KVTransferSettings(nixl=NixlSettings(link_check_port=_free_port())))
    monkeypatch.setattr(probes, "prefill_addresses", lambda host: ["127.0.0.2", "127.0.0.1"])
    with SourceBuffer(1 << 20, 4, backends=["UCX"]) as source:
        publisher: Publisher = publish(source, "127.0.0.1", settings.kv_transfer.nixl.link_check_port)
        try:
            for broken_first in (False, True):  # the probe's shuffle, fixed: the broken pod last, then first
                monkeypatch.setattr(probes.random, "shuffle", lambda xs, r=broken_first: xs.sort(reverse=r))
                podstate.clear(podstate.DATA_PATH_OK)
                before = vllm_stand_in.requests
                code, why = probes.ready(settings, 20.0, vllm_port=port, sidecar_port=port, prefill_http_port=port)
                assert code == probes.EXIT_OK, why
                assert vllm_stand_in.requests == before + 1
                proof = json.loads((state_dir / podstate.DATA_PATH_OK).read_text())
                assert proof["prefill"] == "127.0.0.1" and proof["nixl_bytes_verified"] > 0
            assert proof["prefill_failed"][0].startswith("127.0.0.2: NIXL link check failed")
        finally:
            publisher.close()
    # Re-verification with every prefill pod broken: decode leaves the pool, each pod's reason named.
    os.utime(state_dir / podstate.DATA_PATH_OK, (0, 0))
    code, why = probes.ready(settings, 5.0, vllm_port=port, sidecar_port=port, prefill_http_port=port)
    assert code == probes.EXIT_FAIL
    assert "no prefill pod of 2 proved the data path" in why and "127.0.0.1:" in why and "127.0.0.2:" in why


def test_no_ready_prefill_pod_is_named_as_such(monkeypatch):
    def nothing(host):
        raise OSError(f"{host} has no addresses (no prefill pod published yet)")

    monkeypatch.setattr(probes, "prefill_addresses", nothing)
    why = probes.verify_data_path(decode_settings(), timeout=1.0)
    assert why is not None and why.startswith("no ready prefill pod") and "no addresses" in why


def test_unhealthy_vllm_is_not_live_or_ready():
    port = _free_port()
    assert probes.live(decode_settings(), 1.0, vllm_port=port)[0] == probes.EXIT_FAIL
    code, why = probes.ready(decode_settings(), 1.0, vllm_port=port)
    assert code == probes.EXIT_FAIL and "/health unreachable" in why


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_MARKER = """
import sys
from hisparse_runtime import podstate
for i in range(200):
    podstate.mark(podstate.DATA_PATH_OK, f"writer {sys.argv[1]} mark {i}")
"""


def test_probes_marking_the_same_state_at_once_all_succeed(tmp_path: Path) -> None:
    """Four processes mark the data-path proof 200 times each at once, as the kubelet's readiness probe and
    an exec can: every write succeeds (with one shared temporary name, a writer whose file another had
    already renamed failed with FileNotFoundError, as on the real node), the file holds one whole write,
    and no temporary file is left."""
    env = {**os.environ, "HISPARSE_STATE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", _MARKER, str(n)], env=env, stderr=subprocess.PIPE, text=True)
             for n in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    text = (tmp_path / podstate.DATA_PATH_OK).read_text()
    assert text.startswith("writer ") and text.endswith(" mark 199"), text
    assert sorted(p.name for p in tmp_path.iterdir()) == [podstate.DATA_PATH_OK]


def _get(port: int, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_probe_server_answers_what_the_probes_answer_over_http(vllm_stand_in, state_dir):
    """The kubelet's HTTP probes get the probes' verdicts: 200, or 503 with the reason as the body."""
    from hisparse_runtime.nixl_check import Publisher, SourceBuffer, publish
    from hisparse_runtime.probe_server import ProbeServer

    port = _port(vllm_stand_in.url)
    settings = decode_settings(kv_transfer=KVTransferSettings(nixl=NixlSettings(link_check_port=_free_port())))
    server = ProbeServer(settings, host="127.0.0.1", port=0, timeout=10.0, vllm_port=port, sidecar_port=port,
                         prefill_http_port=port).start()
    try:
        assert _get(server.port, LIVENESS_PATH) == (200, "vLLM healthy\n")
        status, body = _get(server.port, READINESS_PATH)
        assert status == 503 and "NIXL link check" in body, body  # no prefill publisher yet
        assert _get(server.port, "/nothing")[0] == 404
        with SourceBuffer(1 << 20, 4, backends=["UCX"]) as source:
            publisher: Publisher = publish(source, "127.0.0.1", settings.kv_transfer.nixl.link_check_port)
            try:
                time.sleep(1.1)  # past the reuse of the failed answer
                before = vllm_stand_in.requests
                status, body = _get(server.port, READINESS_PATH)
                assert status == 200 and "transfer verified" in body, body
                assert vllm_stand_in.requests == before + 1  # the proof's completion, through the "sidecar"
            finally:
                publisher.close()
        podstate.mark(podstate.DRAINING)
        assert _get(server.port, READINESS_PATH) == (503, "draining\n")
        assert _get(server.port, LIVENESS_PATH)[0] == 200  # a draining pod is alive
    finally:
        server.close()


def test_a_failed_readiness_is_reused_for_a_moment_not_proven_again(state_dir, monkeypatch):
    """Anything that reaches the port cannot make the pod run data-path proofs in a loop: a failure younger
    than MIN_RECHECK_SECONDS is answered again; a check that raises is a 503 with its reason."""
    from hisparse_runtime import probe_server

    calls = []

    def failing(settings, timeout, **kw):
        calls.append(time.monotonic())
        if len(calls) == 3:
            raise RuntimeError("a bug in the check")
        return probes.EXIT_FAIL, "no prefill pod proved the data path"

    monkeypatch.setattr(probes, "ready", failing)
    server = probe_server.ProbeServer(decode_settings(), host="127.0.0.1", port=0).start()
    try:
        for _ in range(5):
            assert _get(server.port, READINESS_PATH) == (503, "no prefill pod proved the data path\n")
        assert len(calls) == 1
        time.sleep(probe_server.MIN_RECHECK_SECONDS + 0.1)
        assert _get(server.port, READINESS_PATH)[0] == 503 and len(calls) == 2
        time.sleep(probe_server.MIN_RECHECK_SECONDS + 0.1)
        status, body = _get(server.port, READINESS_PATH)
        assert status == 503 and "RuntimeError: a bug in the check" in body, body
    finally:
        server.close()
