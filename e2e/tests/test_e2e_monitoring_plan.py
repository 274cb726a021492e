"""The monitoring stack's plan without a cluster: upstream's manifests changed only where this cluster
differs, images the operator will really run, and the expressions ready for Prometheus."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
from hisparse_devcluster import monitoring, monitoring_exprs, versions
from hisparse_devcluster.images import _spec
from hisparse_devcluster.realnode import real_node_placement

IMAGES = {"prometheus-operator": "localhost/prometheus-operator:v0.85.0",
          "prometheus-config-reloader": "localhost/prometheus-config-reloader:v0.85.0",
          "prometheus": "localhost/prometheus:2.42.0-abc"}


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
    # Everything else is upstream's: security context, resources, service account, ports.
    for key in ("securityContext", "resources", "ports", "env"):
        assert c[key] == up_c[key], key
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


def test_prometheus_version_is_the_packaged_one() -> None:
    """The version the Prometheus resource declares is what Debian's package ships (the image build checks
    the image's binary the same way)."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("Debian's prometheus package is missing: scripts/setup installs it", pytrace=False)
    out = subprocess.run([prometheus, "--version"], capture_output=True, text=True, check=True).stdout
    assert re.search(rf"\bversion {re.escape(versions.PROMETHEUS_VERSION.removeprefix('v'))}\b", out), out
    assert _spec.PROMETHEUS.version == versions.PROMETHEUS_VERSION.removeprefix("v")


def test_images_sit_where_the_operator_runs_them() -> None:
    """The operator runs the reloader by an absolute path of upstream's image, and Prometheus by the image's
    entrypoint; Debian 12 merges /bin into /usr/bin."""
    source = (monitoring.module_root() / "pkg" / "operator" / "config_reloader.go").read_text()
    (path,) = re.findall(r'Command:\s*\[\]string\{"([^"]+)"\}', source)
    assert path == "/bin/prometheus-config-reloader"
    assert _spec.PROMETHEUS_CONFIG_RELOADER.path == "/usr" + path
    assert _spec.PROMETHEUS_OPERATOR.family == _spec.PROMETHEUS_CONFIG_RELOADER.family == "prometheus_operator"
    assert _spec.PROMETHEUS.entrypoint == ("/usr/bin/prometheus",)
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
