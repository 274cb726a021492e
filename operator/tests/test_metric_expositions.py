"""Every metric an alert, a dashboard panel or a dashboard variable names is in a real ``/metrics``
exposition, read back with ``prometheus_client``'s own text parser.

The expositions, each produced by the code that serves it:

- **vLLM 0.33** (a fresh interpreter, on CPU): vLLM's own ``PrometheusStatLogger`` built from a real
  ``VllmConfig`` (the tiny DSA checkpoint with the ``NixlConnector``, so the NIXL connector's
  ``NixlPromMetrics`` are vLLM's too), and the project's plugin loaded by vLLM's plugin loader with its
  stat logger, all recording one round of scheduler and iteration stats. HiSparse's own connector cannot
  be configured here (vLLM refuses it without CUDA); its payload reaches the plugin's logger as vLLM
  would hand it over.
- **the CPU engine** (the stand-in for ``vllm serve`` on the real node): ``EngineMetrics`` on a fresh
  registry, driven as ``cpu_engine.server.Engine`` drives it.
- **the operator** (a fresh interpreter): the default registry the operator's ``/metrics`` serves, after
  the reconciler recorded a status with conditions and a running canary.

The EPP's names (``EPP_METRIC_PREFIXES``) are checked against a scrape of the real EPP binary in
``e2e/tests/test_e2e_llmd.py``; the kube-apiserver's against a real apiserver in the monitoring e2e.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hisparse_devcluster.monitoring_exprs import DASHBOARD, EPP_METRIC_PREFIXES, named_metrics

APISERVER_METRICS = {"apiserver_admission_webhook_rejection_count", "up"}
"""The kube-apiserver's own series, and ``up``, which Prometheus itself writes for every target it scrapes
(test_e2e_monitoring_real_pods checks both against a real apiserver and Prometheus)."""

VLLM_SCRIPT = textwrap.dedent(
    """
    import os, sys, tempfile
    from pathlib import Path
    from types import SimpleNamespace
    from prometheus_client import REGISTRY, generate_latest
    from hisparse_runtime.cpu_engine import write_checkpoint
    from hisparse_runtime.preflight_report import REPORT_PATH_ENV, CheckOutcome, PreflightReport, write_report
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.plugins import load_general_plugins
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, PrefixCacheStats, SchedulerStats
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
    from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.stats import HiSparseKVConnectorStats
    from hisparse_runtime.plugin.stat_logger import HiSparseStatLogger

    model = Path(tempfile.mkdtemp())
    write_checkpoint(model, seed=0)
    # The preflight report the pod's entrypoint writes before it execs vLLM; the plugin exports it.
    report = model / "preflight.json"
    write_report(PreflightReport(checks=[CheckOutcome(name="memlock", ok=True)]), report)
    os.environ[REPORT_PATH_ENV] = str(report)
    load_general_plugins()  # the hisparse general plugin, as vLLM loads it (once) in every process
    kv = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_consumer")
    config = EngineArgs(model=str(model), skip_tokenizer_init=True, served_model_name=["tiny-dsa"],
                        kv_transfer_config=kv).create_engine_config()
    vllm_logger = PrometheusStatLogger(config, [0])
    plugin_logger = HiSparseStatLogger(config, 0)

    nixl = NixlKVConnectorStats()
    nixl.record_transfer(SimpleNamespace(xferDuration=12_000, postDuration=300, totalBytes=1 << 20, descCount=24))
    nixl.record_failed_transfer()
    scheduler = SchedulerStats(num_running_reqs=1, num_waiting_reqs=1, kv_cache_usage=0.25,
                               prefix_cache_stats=PrefixCacheStats(requests=1, queries=40, hits=16),
                               kv_connector_stats=nixl.to_dict())
    iteration = IterationStats()
    iteration.num_generation_tokens = 8
    iteration.prompt_token_stats.computed = 24
    iteration.prompt_token_stats.total = 40
    iteration.time_to_first_tokens_iter = [0.2]
    iteration.inter_token_latencies_iter = [0.03, 0.04]
    iteration.finished_requests = [FinishedRequestStats(
        finish_reason=FinishReason.LENGTH, e2e_latency=0.5, num_prompt_tokens=40, num_generation_tokens=8,
        queued_time=0.01, prefill_time=0.1, inference_time=0.4, decode_time=0.3, mean_time_per_output_token=0.04)]
    vllm_logger.record(scheduler, iteration)

    hisparse = HiSparseKVConnectorStats()
    hisparse.record_snapshot(90, 10, 10 * 656)
    hisparse.record_host_usage(0.25, 2)
    plugin_logger.record(SchedulerStats(kv_connector_stats={"HiSparseConnector": hisparse.to_dict()}), None)
    Path(sys.argv[1]).write_bytes(generate_latest(REGISTRY))
    """
)

OPERATOR_SCRIPT = textwrap.dedent(
    """
    import importlib, sys
    from pathlib import Path
    from prometheus_client import REGISTRY, generate_latest
    import hisparse_operator.controller.handlers  # what the operator process imports: its registry
    R = importlib.import_module("hisparse_operator.controller.reconcile")

    F = importlib.import_module("hisparse_operator.controller.failure")
    M = importlib.import_module("hisparse_operator.controller.metrics")

    status = {"conditions": [{"type": t, "status": "True"} for t in ("ModelReady", "PrefillReady", "DecodeReady",
                                                                      "RouterReady", "Ready")],
              "canary": {"phase": "Shifting", "weight": 10},
              "prefill": {"replicas": 2, "readyReplicas": 2}, "decode": {"replicas": 1, "readyReplicas": 1}}
    body = {"metadata": {"namespace": "ns", "name": "dsv32"}, "status": status}
    # The status the reconciler decided equals the stored one: it records the metrics and writes nothing.
    R._write_status(None, body, status, status, R.Outcome())
    # A decode pod whose vLLM container last exited with preflight's host_memory code, as the reconciler reads it.
    pod = {"metadata": {"name": "dsv32-decode-0", "labels": {"serving.hisparse.dev/role": "decode"}},
           "status": {"containerStatuses": [{"name": "vllm", "ready": False, "state": {"waiting": {}},
                                             "lastState": {"terminated": {"exitCode": 35}}}]}}
    M.set_preflight_failures("ns", "dsv32", ["prefill", "decode"], F.preflight_failures([pod]))
    Path(sys.argv[1]).write_bytes(generate_latest(REGISTRY))
    """
)


def _child(script: str, out: Path) -> str:
    """What ``script`` writes to ``out`` (its stdout is the program's log: vLLM logs there)."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_PLUGINS="hisparse", HISPARSE_DECODE_KERNELS="vllm")
    run = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=600,
                         env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return out.read_text()


def cpu_engine_exposition() -> str:
    """``EngineMetrics`` on a registry of its own, through the calls ``cpu_engine.server.Engine`` makes."""
    from hisparse_runtime.cpu_engine.metrics import EngineMetrics

    registry = CollectorRegistry()
    m = EngineMetrics("tiny-dsa", registry=registry, kv_row_bytes=656, host_pool_bytes=1 << 30)
    m.scheduler(running=1, waiting=1, blocks_used=3, blocks_total=16)  # Engine._on_step
    m.hot_buffer(hits=90, misses=10, pool_usage=0.25)
    m.nixl_xfer_time.observe(0.012)  # Engine._pull
    m.nixl_bytes.observe(1 << 20)
    m.nixl_failed.inc()
    m.success["length"].inc()  # Engine._on_finish
    m.prompt_tokens.inc(40)
    m.prompt_by_source["local_compute"].inc(1)
    m.prompt_by_source["external_kv_transfer"].inc(39)
    m.prefix_queries.inc(40)
    m.generation_tokens.inc(8)
    m.ttft.observe(0.2)
    m.itl.observe(0.03)
    m.queue_time.observe(0.01)
    m.e2e.observe(0.5)
    return generate_latest(registry).decode()


def sample_names(text: str) -> dict[str, str]:
    """Every sample name in an exposition -> its family's type, as the text parser reads them. A family
    with no samples (a labelled one nothing has set yet) names nothing: a query of it returns nothing."""
    return {s.name: f.type for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("expositions")
    return {
        "vLLM 0.33 (PrometheusStatLogger, NIXL connector, hisparse plugin)": _child(VLLM_SCRIPT, out / "vllm.txt"),
        "CPU engine": cpu_engine_exposition(),
        "operator": _child(OPERATOR_SCRIPT, out / "operator.txt"),
    }


@pytest.fixture(scope="module")
def expositions(texts: dict[str, str]) -> dict[str, dict[str, str]]:
    return {source: sample_names(text) for source, text in texts.items()}


def unexported(named: dict[str, set[str]], expositions: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """Names no exposition has -> where they are named. The EPP's and the apiserver's are left to the
    e2e suites that scrape them."""
    seen = set().union(*expositions.values())
    return {n: sorted(w) for n, w in named.items()
            if n not in seen and n not in APISERVER_METRICS and not n.startswith(EPP_METRIC_PREFIXES)}


pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # the vLLM exposition imports vLLM in a child process


def test_every_named_metric_is_in_a_real_exposition(expositions: dict[str, dict[str, str]]) -> None:
    named = named_metrics()
    assert {"vllm:time_to_first_token_seconds_bucket", "hisparse_operator_canary_phase",
            "hisparse_host_pool_usage_ratio"} <= set(named)
    missing = unexported(named, expositions)
    assert not missing, f"named by alerts or the dashboard, exported by nothing: {missing}"


def test_a_panel_naming_what_nothing_exports_fails(expositions: dict[str, dict[str, str]], tmp_path: Path) -> None:
    """The check is not vacuous: the shipped dashboard with one more panel, naming a misspelt vLLM name, a
    counter without ``_total`` or a histogram read without ``_bucket``, fails it, naming that panel."""
    for wrong in ("vllm:time_to_first_token_second_bucket", "hisparse_hot_buffer_hits", "vllm:nixl_xfer_time_seconds"):
        dash = json.loads(DASHBOARD.read_text())
        dash["panels"].append({**dash["panels"][-1], "id": 999, "title": "Broken",
                               "targets": [{"refId": "A", "expr": f'sum(rate({wrong}{{revision=~"$revision"}}[5m]))'}]})
        broken = tmp_path / "dashboard.json"
        broken.write_text(json.dumps(dash))
        assert unexported(named_metrics(dashboard=broken), expositions) == {wrong: ["panel Broken"]}


def test_each_exposition_holds_what_it_serves(expositions: dict[str, dict[str, str]]) -> None:
    vllm, engine, operator = expositions.values()
    assert {"vllm:time_to_first_token_seconds_bucket", "vllm:nixl_xfer_time_seconds_bucket",
            "vllm:nixl_num_failed_transfers_total", "vllm:prompt_tokens_by_source_total",
            "hisparse_hot_buffer_hits_total", "hisparse_build_info"} <= set(vllm)
    assert {"vllm:request_success_total", "hisparse_swapped_in_bytes_total"} <= set(engine)
    assert {"hisparse_operator_canary_phase", "hisparse_operator_deployments",
            "hisparse_operator_reconcile_duration_seconds_bucket"} <= set(operator)
    assert not any(n.startswith("vllm:") for n in operator)


def test_the_cpu_engine_serves_vllms_families_as_vllm_does(expositions: dict[str, dict[str, str]]) -> None:
    """The stand-in's ``vllm:*`` samples are vLLM's names, with vLLM's types: a panel that reads one off the
    real node reads the same series off a GPU node."""
    vllm, engine, _ = expositions.values()
    theirs = {n: t for n, t in engine.items() if n.startswith("vllm:")}
    assert theirs
    wrong = {n: (t, vllm.get(n)) for n, t in theirs.items() if vllm.get(n) != t}
    assert not wrong, f"the CPU engine's (type, vLLM's type): {wrong}"


def _buckets(text: str) -> dict[str, list[float]]:
    """Histogram family -> its bucket bounds."""
    return {f.name: sorted({float(s.labels["le"]) for s in f.samples if s.name == f.name + "_bucket"})
            for f in text_string_to_metric_families(text) if f.type == "histogram"}


def test_the_cpu_engine_histograms_have_vllms_buckets(texts: dict[str, str]) -> None:
    """Same buckets as vLLM's, so a quantile read off the real node compares with one off a GPU node."""
    vllm, engine, _ = (_buckets(t) for t in texts.values())
    wrong = {f: {"cpu engine": b, "vLLM": vllm.get(f)} for f, b in engine.items()
             if f.startswith("vllm:") and b != vllm.get(f)}
    assert not wrong, wrong
