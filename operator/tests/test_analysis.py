"""Canary analysis steps against a real Prometheus (Debian's ``prometheus`` package, on loopback) that
scrapes a real HTTP server exporting per-pod series of both fleets: what one measurement gives, and
whole analyses (count, interval, limits, an operator restart, Prometheus unreachable) through the
reconciler."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from hisparse_operator import names
from hisparse_operator.api import HiSparseDeployment
from hisparse_operator.api.spec import AnalysisStep
from hisparse_operator.controller import analysis as A
from hisparse_operator.controller import rollout as R
from hisparse_operator.render import revision

PROMETHEUS = shutil.which("prometheus")
NS, NAME = "ns", "dsv32"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _analysed_fleet() -> str:
    """The candidate fleet of the image ``rt:analysed`` that :func:`_sim` rolls out (named by its revision)."""
    from test_rollout import _doc, _new_image

    doc = _doc()
    _new_image("rt:analysed")(doc)
    doc["metadata"].update(namespace=NS, name=NAME)
    return names.fleet(NAME, revision(HiSparseDeployment.model_validate(doc)))


ANALYSED = _analysed_fleet()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus scraping, every second, an exporter with the series a vLLM fleet would give: the
    candidate's pods with a 20% error ratio and a 90 ms inter-token p99, the stable's 1% and 80 ms."""
    assert PROMETHEUS, "Debian's prometheus package is missing: scripts/setup installs it"
    registry = CollectorRegistry()
    errors = Gauge("hisparse_test_error_ratio", "errors per request", ["pod"], registry=registry)
    itl = Gauge("hisparse_test_itl_p99_seconds", "inter-token latency p99", ["pod"], registry=registry)
    for pod, e, t in ((f"{ANALYSED}-decode-7d9f-abcde", 0.20, 0.090), (f"{NAME}-decode-5c6b-fghij", 0.01, 0.080),
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
            except (A.QueryError, A.NoData):
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


CANDIDATE = A.fleet(NS, ANALYSED, "cand000001", NAME)
STABLE = A.fleet(NS, NAME, "stab000001", NAME)


def _measure(url: str | None, default: str | None = None, fleet: A.Fleet = CANDIDATE, **query: object) -> R.Measurement:
    step = _step(url, **query)
    return A.measure(step, tuple(step.queries), default, fleet, STABLE)["q"]


def test_the_candidate_s_error_rate_above_its_threshold_fails(prometheus: str) -> None:
    query = 'max(hisparse_test_error_ratio{pod=~"{{pods}}"})'
    m = _measure(prometheus, query=query, max=0.05)
    assert m.kind == "failed" and "q=0.2" in m.message
    ok = _measure(prometheus, fleet=STABLE, query=query, max=0.05)
    assert ok.kind == "passed" and "q=0.01" in ok.message


def test_latency_against_the_stable_revision_s_and_the_operator_s_default_url(prometheus: str) -> None:
    query = 'max(hisparse_test_itl_p99_seconds{pod=~"{{pods}}"})'
    assert _measure(None, prometheus, query=query, maxRatioToStable=1.2).kind == "passed"
    m = _measure(None, prometheus, query=query, maxRatioToStable=1.1)
    assert m.kind == "failed" and "max 0.088" in m.message  # 1.1 x the stable's 80 ms


def test_no_data_is_inconclusive_never_a_pass_and_no_number_is_an_error(prometheus: str) -> None:
    nothing = 'max(hisparse_test_error_ratio{pod=~"nothing-.*"})'
    cases = [
        (_measure(prometheus, query=nothing, max=1), "inconclusive", "empty vector"),
        (_measure(prometheus, query=nothing, max=1, emptyResult="Failed"), "failed", "empty vector"),
        (_measure(prometheus, query="vector(0) / vector(0)", max=1), "inconclusive", "NaN"),
        (_measure(prometheus, query=f"{nothing} or vector(0)", max=1), "passed", "q=0"),  # the query's own rule
        (_measure(prometheus, query='max(hisparse_test_itl_p99_seconds{pod=~"{{pods}}"})', maxRatioToStable=2,
                  fleet=A.fleet(NS, "other", "x", NAME)), "inconclusive", "empty vector"),
        (_measure(prometheus, query="hisparse_test_error_ratio", max=1), "error", "3 series"),
        (_measure(prometheus, query="max(", max=1), "error", "bad_data"),
        (_measure(prometheus, query='label_replace(vector(1), "a", "b", "", "")[5m:1m]', max=1), "error", "not a number"),
        (_measure(f"http://127.0.0.1:{_port()}", query="up", max=1), "error", "did not answer"),
        (_measure(None, query="up", max=1), "error", "HISPARSE_PROMETHEUS_URL"),
    ]
    for m, kind, why in cases:
        assert m.kind == kind and why in m.message, (kind, why, m)
    urllib.request.urlopen(prometheus + "/-/ready", timeout=5).close()  # it was up all along


QUERY = {"name": "error-ratio", "query": 'max(hisparse_test_error_ratio{pod=~"{{pods}}"})'}


def _sim(monkeypatch: pytest.MonkeyPatch, analysis: dict[str, Any]) -> Any:
    """A rollout through the reconciler, at its analysis step (the second: a weight step first)."""
    from test_rollout import GOOD, Sim, _doc, _new_image

    sim = Sim(monkeypatch, _doc(steps=[{"weight": 50, "pauseSeconds": 0}, {"analysis": analysis}]))
    sim.until(lambda: sim.status().get("stableRevision"))
    sim.edit(_new_image("rt:analysed"))
    sim.until(lambda: sim.job() is not None)
    sim.finish_job(summary=GOOD)
    sim.until(lambda: sim.phase() != "Parity")
    return sim


def test_a_failed_analysis_step_rolls_the_candidate_back_through_the_reconciler(
    prometheus: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = _sim(monkeypatch, {"prometheusUrl": prometheus, "queries": [{**QUERY, "max": 0.05}], "delaySeconds": 30})
    sim.until(lambda: sim.phase() == "RolledBack")
    message = sim.status()["canary"]["message"]
    assert "analysis at step 2 failed" in message and "error-ratio=0.2" in message, message
    sim.until(lambda: "replicas" not in sim.status()["canary"])
    assert not sim.violations and sim.weights[-1] == [100]


def test_an_analysis_counts_its_measurements_at_the_interval_across_an_operator_restart(
    prometheus: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three measurements 20 s apart, the operator replaced (new caches, nothing in memory) after the
    second: the third comes 20 s after the second, and the analysis passes with 3 of 3."""
    from test_reconcile_caches import Operator

    sim = _sim(monkeypatch, {"prometheusUrl": prometheus, "delaySeconds": 10,
                             "queries": [{**QUERY, "max": 0.5, "count": 3, "intervalSeconds": 20}]})
    seen: list[dict[str, Any]] = []

    def counters() -> dict[str, Any]:
        q = ((sim.status().get("canary") or {}).get("analysis") or {}).get("queries", {}).get("error-ratio")
        if q and (not seen or seen[-1]["lastAt"] != q["lastAt"]):
            seen.append(q)
        return q or {}

    sim.until(lambda: counters().get("measured") == 2, seconds=1)
    sim.op = Operator(sim.kube)
    sim.until(lambda: counters().get("measured") == 3 or sim.status()["canary"]["step"] != 1, seconds=1)
    assert [q["measured"] for q in seen] == [1, 2] and sim.status()["canary"]["step"] == 2  # passed, next step
    times = [R._time(q["lastAt"], sim.t) for q in seen]
    assert (times[1] - times[0]).total_seconds() == 20
    assert (sim.t - times[1]).total_seconds() <= 21  # the third on time after the restart, not at once


def test_an_unreachable_prometheus_is_retried_at_the_interval_then_rolls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    down = f"http://127.0.0.1:{_port()}"
    sim = _sim(monkeypatch, {"prometheusUrl": down, "delaySeconds": 5,
                             "queries": [{**QUERY, "max": 0.5, "intervalSeconds": 15, "consecutiveErrorLimit": 2}]})
    errors: list[tuple[int, str]] = []

    def note() -> bool:
        q = ((sim.status().get("canary") or {}).get("analysis") or {}).get("queries", {}).get("error-ratio")
        if q and (not errors or errors[-1][1] != q["lastAt"]):
            errors.append((q["consecutiveErrors"], q["lastAt"]))
        return sim.phase() == "RolledBack"

    sim.until(note, seconds=1)
    assert [n for n, _ in errors] == [1, 2, 3]
    gaps = [(R._time(b, sim.t) - R._time(a, sim.t)).total_seconds() for (_, a), (_, b) in zip(errors, errors[1:])]
    assert gaps == [15, 15]
    message = sim.status()["canary"]["message"]
    assert "3 errors in a row, consecutiveErrorLimit 2" in message and "did not answer" in message, message
