"""The monitoring stack's plan without a cluster: upstream's manifests changed only where this cluster
differs, images the operator will really run, and the expressions ready for Prometheus."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hisparse_devcluster import monitoring, monitoring_exprs, versions
from hisparse_devcluster.images import _spec
from hisparse_devcluster.realnode import real_node_placement

REPO = Path(__file__).resolve().parents[2]
IMAGES = {"prometheus-operator": "localhost/prometheus-operator:v0.85.0",
          "prometheus-config-reloader": "localhost/prometheus-config-reloader:v0.85.0",
          "prometheus": "localhost/prometheus:v0.305.0"}


@pytest.fixture(scope="module")
def objs() -> list[dict[str, Any]]:
    return monitoring.plan(IMAGES)


def _one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return obj


def test_operator_deployment_is_upstreams_with_local_images_on_the_real_node(objs: list[dict[str, Any]]) -> None:
    upstream = _one(monitoring.upstream_manifests(), "Deployment")
    dep = _one(objs, "Deployment")
    assert dep["metadata"]["namespace"] == monitoring.NAMESPACE
    spec, up_spec = dep["spec"]["template"]["spec"], upstream["spec"]["template"]["spec"]
    (c,), (up_c,) = spec["containers"], up_spec["containers"]
    assert c["image"] == IMAGES["prometheus-operator"] and c["imagePullPolicy"] == "Never"
    assert f"--prometheus-config-reloader={IMAGES['prometheus-config-reloader']}" in c["args"]
    assert not [a for a in c["args"] if a.startswith("--kubelet-")]
    # Everything else is upstream's (security context, resources, service account, ports), but a smaller
    # CPU request: the real node's 2 CPUs also hold the CPU example and a canary's parity Job.
    for key in ("securityContext", "ports", "env"):
        assert c[key] == up_c[key], key
    up_resources = {**up_c["resources"], "requests": {**up_c["resources"]["requests"],
                                                      "cpu": monitoring.STACK_CPU_REQUEST}}
    assert c["resources"] == up_resources
    assert spec["securityContext"] == up_spec["securityContext"] and spec["securityContext"]["runAsNonRoot"]
    assert spec["serviceAccountName"] == up_spec["serviceAccountName"]
    placement = real_node_placement()
    assert placement["nodeSelector"].items() <= spec["nodeSelector"].items()
    assert all(t in spec["tolerations"] for t in placement["tolerations"])


def test_rbac_is_upstreams_bound_in_the_namespace(objs: list[dict[str, Any]]) -> None:
    upstream = {(o["kind"], o["metadata"]["name"]): o for o in monitoring.upstream_manifests()}
    for role in ("prometheus-operator", "prometheus"):
        assert _one(objs, "ClusterRole", role)["rules"] == upstream[("ClusterRole", role)]["rules"]
        binding = _one(objs, "ClusterRoleBinding", role)
        assert binding["roleRef"]["name"] == role
        assert [(s["name"], s["namespace"]) for s in binding["subjects"]] == [(role, monitoring.NAMESPACE)]
    # Prometheus only reads: no verb that writes anywhere.
    verbs = {v for r in _one(objs, "ClusterRole", "prometheus")["rules"] for v in r["verbs"]}
    assert verbs <= {"get", "list", "watch"}, verbs


def test_prometheus_selects_every_monitor_and_rule_and_runs_debians_release(objs: list[dict[str, Any]]) -> None:
    spec = _one(objs, "Prometheus")["spec"]
    for field in ("serviceMonitor", "podMonitor", "rule"):
        assert spec[f"{field}Selector"] == {} and spec[f"{field}NamespaceSelector"] == {}, field
    assert spec["image"] == IMAGES["prometheus"] and spec["version"] == versions.PROMETHEUS_VERSION
    assert spec["securityContext"]["runAsNonRoot"] and spec["serviceAccountName"] == monitoring.PROMETHEUS_SA
    assert real_node_placement()["nodeSelector"].items() <= spec["nodeSelector"].items()


def test_prometheus_is_the_operators_default_release_from_the_module_it_requires() -> None:
    """The version the Prometheus resource declares is the operator's default (the newest of its
    compatibility matrix), the release its own module requires, and the one e2e/tools/prometheus pins."""
    root = monitoring.module_root()
    matrix = re.findall(r'^\s*"(v\d+\.\d+\.\d+)",', (root / "pkg" / "operator" / "defaults.go").read_text(), re.M)
    assert matrix and matrix[-1] == versions.PROMETHEUS_VERSION, matrix[-3:]
    required = dict(line.split()[:2] for line in (root / "go.mod").read_text().splitlines()
                    if line.strip().startswith("github.com/prometheus/prometheus "))
    assert required["github.com/prometheus/prometheus"] == versions.PROMETHEUS_MODULE_VERSION
    major, minor, patch = versions.PROMETHEUS_VERSION.removeprefix("v").split(".")
    assert versions.PROMETHEUS_MODULE_VERSION == f"v0.{int(major) * 100 + int(minor)}.{patch}"
    pins = (REPO / "e2e" / "tools" / "prometheus" / "go.mod").read_text()
    assert f"github.com/prometheus/prometheus {versions.PROMETHEUS_MODULE_VERSION}" in pins


def test_debians_prometheus_cannot_read_what_the_operator_generates(tmp_path: Path) -> None:
    """Why Prometheus is built from its module: Debian 12's package has no Kubernetes discovery."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("Debian's prometheus package is missing: scripts/setup installs it", pytrace=False)
    cfg = tmp_path / "k8s-sd.yaml"
    cfg.write_text("scrape_configs:\n- job_name: pods\n  kubernetes_sd_configs:\n  - role: pod\n")
    res = subprocess.run([promtool, "check", "config", str(cfg)], capture_output=True, text=True, check=False)
    assert res.returncode != 0 and "kubernetes_sd_configs not found" in res.stdout + res.stderr, \
        "Debian's Prometheus reads Kubernetes discovery now: it could stand in again"


def test_images_sit_where_the_operator_runs_them() -> None:
    """The operator runs the reloader by an absolute path of upstream's image, and Prometheus by the image's
    entrypoint; Debian 12 merges /bin into /usr/bin."""
    source = (monitoring.module_root() / "pkg" / "operator" / "config_reloader.go").read_text()
    (path,) = re.findall(r'Command:\s*\[\]string\{"([^"]+)"\}', source)
    assert path == "/bin/prometheus-config-reloader"
    assert _spec.PROMETHEUS_CONFIG_RELOADER.path == "/usr" + path
    assert _spec.PROMETHEUS_OPERATOR.family == _spec.PROMETHEUS_CONFIG_RELOADER.family == "prometheus_operator"
    assert (_spec.PROMETHEUS.family, _spec.PROMETHEUS.binary) == ("prometheus", "prometheus")
    assert set(monitoring.IMAGES) <= set(_spec.SHIPPED)


def test_plan_refuses_a_missing_image() -> None:
    with pytest.raises(monitoring.MonitoringError, match="no image reference for .*prometheus"):
        monitoring.plan({k: v for k, v in IMAGES.items() if k != "prometheus"})


# ---- expressions -----------------------------------------------------------------------------------------

def test_every_alert_has_a_signal_that_differs_from_it() -> None:
    rules = monitoring_exprs.alert_rules()
    assert len(rules) >= 10
    for rule in rules:
        signal = monitoring_exprs.alert_signal(rule["expr"])
        assert signal != rule["expr"].strip() and monitoring_exprs.metric_names(signal) == \
            monitoring_exprs.metric_names(rule["expr"]), rule["alert"]
    assert monitoring_exprs.alert_signal("min(x) - time() < 7 * 86400") == "min(x) - time()"
    assert monitoring_exprs.alert_signal("sum(rate(y[5m])) * 60 > 1") == "sum(rate(y[5m])) * 60"
    with pytest.raises(ValueError):
        monitoring_exprs.alert_signal("sum(rate(y[5m]))")


def test_panel_queries_set_every_variable_to_all() -> None:
    targets = monitoring_exprs.dashboard_targets()
    assert len(targets) >= 10
    for title, expr in targets:
        query = monitoring_exprs.panel_query(expr)
        assert "$" not in query, title
    with pytest.raises(ValueError, match="not used as"):
        monitoring_exprs.panel_query('x{a="$namespace"}')


def test_panel_queries_take_one_selected_value_as_an_exact_match() -> None:
    """As Grafana sends a single selected value: regex metacharacters escaped, so ``a.b`` selects only
    ``a.b`` (the backslash doubled inside PromQL's string literal); unset variables stay "all"."""
    expr = 'x{namespace=~"$namespace", deployment=~"$deployment", revision=~"$revision"}'
    query = monitoring_exprs.panel_query(expr, values={"namespace": "hs-cpu", "deployment": "a.b"})
    assert query == 'x{namespace=~"hs-cpu", deployment=~"a\\\\.b", revision=~".*"}'


def test_apiserver_is_scraped_with_the_pods_own_credentials(objs: list[dict[str, Any]]) -> None:
    (endpoint,) = _one(objs, "ServiceMonitor", "apiserver")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["serverName"] == "kubernetes"
    assert endpoint["bearerTokenFile"].startswith("/var/run/secrets/kubernetes.io/serviceaccount/")
    assert "insecureSkipVerify" not in endpoint["tlsConfig"]
    # Prometheus's upstream ClusterRole is what authorizes the scrape.
    rules = _one(objs, "ClusterRole", "prometheus")["rules"]
    assert any("/metrics" in r.get("nonResourceURLs", []) and "get" in r["verbs"] for r in rules)
    assert _one(objs, "Prometheus")["spec"]["serviceDiscoveryRole"] == "EndpointSlice"
    assert any("endpointslices" in r.get("resources", []) for r in rules)
