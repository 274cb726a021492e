"""The real Prometheus Operator (v0.85.0, built from its Go module) on the real node: it runs Prometheus
(3.5.0, built from its Go module) from images built here, turns PodMonitors into scrape configuration its
config reloader hands to Prometheus, and loads the chart's PrometheusRule, as on a connected cluster.

The tests run in file order on one node and one stack (:mod:`hisparse_devcluster.monitoring`).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from e2e_realnode import BUSYBOX_IMAGE, busybox_archive, busybox_pod, wait_pods_ready
from hisparse_devcluster import Cluster, monitoring, monitoring_exprs, versions
from hisparse_devcluster.realnode import NODE_NAME, RealNode

pytestmark = [pytest.mark.slow, pytest.mark.host]

PROBE_NS = "monitoring-probe"
PROBE_METRIC = "hisparse_e2e_probe_value"


@pytest.fixture(scope="module")
def stack(cluster: Cluster, node: RealNode) -> Iterator[monitoring.PrometheusStack]:
    s = monitoring.PrometheusStack(cluster, node)
    started = time.monotonic()
    s.install()
    print(f"stack installed in {time.monotonic() - started:.0f}s (images included)")
    try:
        yield s
    finally:
        s.uninstall()


def _target(stack: monitoring.PrometheusStack, job_part: str) -> dict[str, Any] | None:
    return next((t for t in stack.targets() if job_part in t["scrapePool"]), None)


def test_prometheus_runs_on_the_real_node_from_the_local_images(stack: monitoring.PrometheusStack) -> None:
    pod = stack.pod()
    assert pod["spec"]["nodeName"] == NODE_NAME
    images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
    assert images["prometheus"] == stack.images["prometheus"]
    assert images["config-reloader"] == stack.images["prometheus-config-reloader"]
    assert all(s["ready"] for s in pod["status"]["containerStatuses"]), pod["status"]["containerStatuses"]
    info = stack.get("/api/v1/status/buildinfo")
    assert info["version"].startswith(versions.PROMETHEUS_VERSION.removeprefix("v")), info
    flags = stack.get("/api/v1/status/flags")
    assert flags["config.file"].startswith("/etc/prometheus/config_out/"), "not the operator's generated config"


def test_the_operators_own_pod_monitor_is_scraped(stack: monitoring.PrometheusStack) -> None:
    job = f"podMonitor/{monitoring.NAMESPACE}/{monitoring.OPERATOR_NAME}/0"
    stack.wait_for(f"target {job} up", lambda: (_target(stack, job) or {}).get("health") == "up", timeout=120)
    series = stack.query('prometheus_operator_reconcile_operations_total{controller="prometheus"}')
    assert series, "the Prometheus Operator's own reconcile counter was not scraped"
    labels = series[0]["metric"]
    assert labels["namespace"] == monitoring.NAMESPACE and labels["pod"].startswith(monitoring.OPERATOR_NAME)


def test_the_apiserver_is_scraped_with_the_service_account(stack: monitoring.PrometheusStack) -> None:
    """HTTPS through the ``kubernetes`` Service's EndpointSlice, Prometheus's token authorized for
    ``/metrics`` by its ClusterRole, the certificate checked against the cluster CA."""
    job = f"serviceMonitor/{monitoring.NAMESPACE}/apiserver/0"
    stack.wait_for(f"target {job} up", lambda: (_target(stack, job) or {}).get("health") == "up", timeout=120)
    (up,) = stack.query('up{namespace="default", service="kubernetes"}')
    assert up["value"][1] == "1", up


@pytest.fixture(scope="module")
def probe_pod(cluster: Cluster, node: RealNode, stack: monitoring.PrometheusStack,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A pod in another namespace serving a metrics file, with no monitor yet."""
    node.import_image(busybox_archive(tmp_path_factory.mktemp("images") / "busybox.tar"))
    cluster.kubectl("create", "namespace", PROBE_NS)
    pod = busybox_pod("exporter", PROBE_NS,
                      "/bin/busybox mkdir -p /tmp/www && "
                      f"printf '# TYPE {PROBE_METRIC} gauge\\n{PROBE_METRIC} 42\\n' > /tmp/www/metrics.txt && "
                      "exec /bin/busybox httpd -f -p 8080 -h /tmp/www", labels={"app": "exporter"}, port=8080)
    pod["spec"]["containers"][0]["ports"][0]["name"] = "metrics"
    assert pod["spec"]["containers"][0]["image"] == BUSYBOX_IMAGE
    cluster.apply([pod])
    wait_pods_ready(cluster, PROBE_NS, ["exporter"])
    try:
        yield "exporter"
    finally:
        cluster.kubectl("delete", "namespace", PROBE_NS, "--wait=false", check=False)


def _probe_monitor() -> dict[str, Any]:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": {"name": "exporter", "namespace": PROBE_NS},
            "spec": {"selector": {"matchLabels": {"app": "exporter"}},
                     # .txt: busybox httpd then sends text/plain, which Prometheus 3 requires of the text format.
                     "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics.txt"}]}}


def test_a_new_pod_monitor_is_reconciled_scraped_and_dropped(cluster: Cluster, stack: monitoring.PrometheusStack,
                                                            probe_pod: str) -> None:
    """Nothing scrapes the pod until a PodMonitor names it; the operator regenerates the configuration,
    the reloader reloads Prometheus, the pod's series arrive with its identity; deleting the monitor
    removes the target again."""
    job = f"podMonitor/{PROBE_NS}/exporter/0"
    assert _target(stack, job) is None
    assert not stack.query(PROBE_METRIC)
    cluster.apply([_probe_monitor()])
    started = time.monotonic()
    stack.wait_for(f"target {job} up", lambda: (_target(stack, job) or {}).get("health") == "up", timeout=180)
    stack.wait_for(f"{PROBE_METRIC} scraped", lambda: bool(stack.query(PROBE_METRIC)), timeout=60)
    print(f"PodMonitor -> series in {time.monotonic() - started:.1f}s")
    (series,) = stack.query(PROBE_METRIC)
    assert series["value"][1] == "42"
    assert series["metric"]["namespace"] == PROBE_NS and series["metric"]["pod"] == probe_pod

    cluster.kubectl("delete", "podmonitor", "exporter", "-n", PROBE_NS)
    stack.wait_for(f"target {job} gone", lambda: _target(stack, job) is None, timeout=180)


def _chart_rule(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """The chart's PrometheusRule exactly as Helm renders it with ``monitoring.prometheusRule.enabled``."""
    from hisparse_operator.chart_values import CHART_DIR

    helm = cluster.helm_path
    if helm is None:
        pytest.fail("helm is not built: run e2e/tools/build.sh helm", pytrace=False)
    res = subprocess.run([str(helm), "template", "rel", str(CHART_DIR), "--namespace", namespace,
                          "--set", "monitoring.prometheusRule.enabled=true"], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    (rule,) = [d for d in yaml.safe_load_all(res.stdout) if d and d["kind"] == "PrometheusRule"]
    return dict(rule)


def test_the_charts_rules_are_loaded_and_every_alert_evaluates(cluster: Cluster,
                                                               stack: monitoring.PrometheusStack) -> None:
    ns = "hisparse-rules"
    cluster.kubectl("create", "namespace", ns)
    try:
        cluster.apply([_chart_rule(cluster, ns)])
        wanted = {r["alert"] for r in monitoring_exprs.alert_rules()}

        def loaded() -> bool:
            rules = {r["name"]: r for r in stack.rules() if r["type"] == "alerting"}
            return wanted <= set(rules) and all(rules[n].get("lastEvaluation", "").startswith("20") for n in wanted)

        stack.wait_for("the chart's alerts loaded and evaluated", loaded, timeout=180)
        rules = {r["name"]: r for r in stack.rules() if r["type"] == "alerting"}
        bad = {n: rules[n].get("lastError") for n in wanted if rules[n]["health"] != "ok"}
        assert not bad, f"alerts Prometheus {versions.PROMETHEUS_VERSION} could not evaluate: {bad}"
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_every_expression_is_valid_promql_for_this_prometheus(stack: monitoring.PrometheusStack) -> None:
    """Each alert's signal and each panel's query is accepted by the real query engine (syntax, types and
    functions of this release); whether they return series is the real-pods suite's job."""
    exprs = [monitoring_exprs.alert_signal(r["expr"]) for r in monitoring_exprs.alert_rules()]
    exprs += [monitoring_exprs.panel_query(e) for _, e in monitoring_exprs.dashboard_targets()]
    for expr in exprs:
        stack.query(expr)  # raises MonitoringError with Prometheus's error on a bad expression
    with pytest.raises(monitoring.MonitoringError, match="bad_data"):
        stack.query("sum by (pod) (rate(hisparse_hot_buffer_hits_total[5m])")
