"""Canary analysis steps against a real Prometheus (Debian's ``prometheus`` package, on loopback) that
scrapes a real HTTP server exporting per-pod series of both fleets."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from hisparse_operator.api.spec import AnalysisStep
from hisparse_operator.controller import analysis as A

PROMETHEUS = shutil.which("prometheus")
NS, NAME = "ns", "dsv32"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus scraping, every second, an exporter with the series a vLLM fleet would give: the
    candidate's pods with a 20% error ratio and a 90 ms inter-token p99, the stable's 1% and 80 ms."""
    assert PROMETHEUS, "Debian's prometheus package is missing: scripts/setup installs it"
    registry = CollectorRegistry()
    errors = Gauge("hisparse_test_error_ratio", "errors per request", ["pod"], registry=registry)
    itl = Gauge("hisparse_test_itl_p99_seconds", "inter-token latency p99", ["pod"], registry=registry)
    for pod, e, t in ((f"{NAME}-canary-decode-7d9f-abcde", 0.20, 0.090), (f"{NAME}-decode-5c6b-fghij", 0.01, 0.080),
                      (f"{NAME}-decode-5c6b-klmno", 0.01, 0.080)):
        errors.labels(pod).set(e)
        itl.labels(pod).set(t)
    exporter_port = _port()
    server, thread = start_http_server(exporter_port, addr="127.0.0.1", registry=registry)
    tmp = tmp_path_factory.mktemp("prometheus")
    config = tmp / "prometheus.yml"
    config.write_text(f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n"
                      f"scrape_configs:\n- job_name: fleet\n  static_configs:\n  - targets: ['127.0.0.1:{exporter_port}']\n")
    port = _port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=open(tmp / "prometheus.log", "w"))  # noqa: SIM115 (closed with the process)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                A.instant(url, "sum(hisparse_test_error_ratio)")
                break
            except A.Inconclusive:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError((tmp / "prometheus.log").read_text()[-2000:]) from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.shutdown()
        thread.join(timeout=10)


def _step(url: str | None, **query: object) -> AnalysisStep:
    return AnalysisStep.model_validate({"prometheusUrl": url, "queries": [{"name": "q", **query}]} if url else
                                       {"queries": [{"name": "q", **query}]})


CANDIDATE = A.fleet(NS, f"{NAME}-canary", "cand000001", NAME)
STABLE = A.fleet(NS, NAME, "stab000001", NAME)


def test_the_candidate_s_error_rate_above_its_threshold_fails(prometheus: str) -> None:
    result, message = A.evaluate(_step(prometheus, query='max(hisparse_test_error_ratio{pod=~"{{pods}}"})', max=0.05),
                                 None, CANDIDATE, STABLE)
    assert result == "failed" and "q=0.2" in message
    ok, message = A.evaluate(_step(prometheus, query='max(hisparse_test_error_ratio{pod=~"{{pods}}"})', max=0.05),
                             None, STABLE, STABLE)
    assert ok == "passed" and "q=0.01" in message


def test_latency_against_the_stable_revision_s_and_the_operator_s_default_url(prometheus: str) -> None:
    query = 'max(hisparse_test_itl_p99_seconds{pod=~"{{pods}}"})'
    assert A.evaluate(_step(None, query=query, maxRatioToStable=1.2), prometheus, CANDIDATE, STABLE)[0] == "passed"
    result, message = A.evaluate(_step(None, query=query, maxRatioToStable=1.1), prometheus, CANDIDATE, STABLE)
    assert result == "failed" and "max 0.088" in message  # 1.1 x the stable's 80 ms


def test_no_answer_is_inconclusive_never_a_pass(prometheus: str, tmp_path: Path) -> None:
    empty = A.evaluate(_step(prometheus, query='max(hisparse_test_error_ratio{pod=~"nothing-.*"})', max=1), None, CANDIDATE, STABLE)
    many = A.evaluate(_step(prometheus, query="hisparse_test_error_ratio", max=1), None, CANDIDATE, STABLE)
    bad = A.evaluate(_step(prometheus, query="max(", max=1), None, CANDIDATE, STABLE)
    down = A.evaluate(_step(f"http://127.0.0.1:{_port()}", query="up", max=1), None, CANDIDATE, STABLE)
    unset = A.evaluate(_step(None, query="up", max=1), None, CANDIDATE, STABLE)
    for (result, message), why in ((empty, "0 series"), (many, "3 series"), (bad, "bad_data"), (down, "did not answer"),
                                   (unset, "HISPARSE_PROMETHEUS_URL")):
        assert result == "inconclusive" and why in message, (result, message)
    urllib.request.urlopen(prometheus + "/-/ready", timeout=5).close()  # it was up all along


def test_a_failed_analysis_step_rolls_the_candidate_back_through_the_reconciler(
    prometheus: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from test_rollout import GOOD, Sim, _doc, _new_image

    query = {"name": "error-ratio", "query": 'max(hisparse_test_error_ratio{pod=~"{{pods}}"})', "max": 0.05}
    sim = Sim(monkeypatch, _doc(steps=[{"weight": 50, "pauseSeconds": 0},
                                       {"analysis": {"prometheusUrl": prometheus, "queries": [query], "delaySeconds": 30}}]))
    sim.until(lambda: sim.status().get("stableRevision"))
    sim.edit(_new_image("rt:errors"))
    sim.until(lambda: sim.job() is not None)
    sim.finish_job(summary=GOOD)
    sim.until(lambda: sim.phase() != "Parity")
    sim.until(lambda: sim.phase() == "RolledBack")
    message = sim.status()["canary"]["message"]
    assert "analysis at step 2 failed" in message and "error-ratio=0.2" in message, message
    sim.until(lambda: "replicas" not in sim.status()["canary"])
    assert not sim.violations and sim.weights[-1] == [100]
