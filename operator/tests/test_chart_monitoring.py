"""The chart's monitoring and its other modes without a cluster: the alerts pass promtool (a firing and a
silent case for every alert; that every metric they name is exported is test_metric_expositions.py's), the
thresholds and toggles of the chart's values, the PrometheusRule and dashboard ConfigMap carry the files unchanged, and the golden
renders of the default, single-namespace and cert-manager values are what Helm produces."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from opsupport import REPO, chart_rules

from hisparse_devcluster.monitoring_exprs import ALERTS, DASHBOARD, alert_rules, dashboard_targets, metric_names
from hisparse_operator import rbac
from hisparse_operator.chart_values import CHART_DIR

ALERT_TESTS = REPO / "operator" / "tests" / "promtool" / "alerts_test.yaml"
GOLDEN = REPO / "operator" / "tests" / "golden"
GOLDEN_VALUES = {
    "chart-default": [],
    "chart-single-namespace": ["singleNamespace=true", "monitoring.serviceMonitor.enabled=true",
                               "monitoring.prometheusRule.enabled=true", "monitoring.dashboards.enabled=true"],
    "chart-cert-manager": ["webhook.certManager.enabled=true", "replicas=1",
                           "image.digest=sha256:" + "a" * 64, "priorityClassName=system-cluster-critical"],
}
RUNBOOKS = REPO / "docs" / "runbooks"
RUNBOOK_BASE = "https://github.com/hisparse/hisparse/blob/main/docs/runbooks/"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: scripts/setup installs Debian's prometheus package", pytrace=False)
    return path


def dashboard_exprs() -> list[str]:
    return [expr for _, expr in dashboard_targets()]


# ---- alerts ------------------------------------------------------------------------------------------

def test_promtool_checks_the_rules() -> None:
    res = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in res.stdout


def test_promtool_unit_tests_pass() -> None:
    res = subprocess.run([promtool(), "test", "rules", ALERT_TESTS.name], cwd=ALERT_TESTS.parent,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases: dict[str, set[bool]] = {}
    for t in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for a in t.get("alert_rule_test", []):
            cases.setdefault(a["alertname"], set()).add(bool(a.get("exp_alerts")))
    names = [r["alert"] for r in alert_rules()]
    assert len(names) == len(set(names))
    missing = {n: sorted({True, False} - cases.get(n, set())) for n in names if cases.get(n) != {True, False}}
    assert not missing, f"alerts without a firing (True) or silent (False) promtool case: {missing}"


def test_promtool_would_catch_a_broken_alert(tmp_path: Path) -> None:
    """The unit tests are not vacuous: the same tests fail against rules whose thresholds moved."""
    broken = ALERTS.read_text().replace("> 0.9", "> 0.99").replace(") < 0.5", ") < 0.1")
    (tmp_path / "charts" / "hisparse" / "files").mkdir(parents=True)
    (tmp_path / "charts" / "hisparse" / "files" / "alerts.yaml").write_text(broken)
    tests = tmp_path / "operator" / "tests" / "promtool"
    tests.mkdir(parents=True)
    shutil.copy(ALERT_TESTS, tests / ALERT_TESTS.name)
    res = subprocess.run([promtool(), "test", "rules", ALERT_TESTS.name], cwd=tests, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0
    assert "HiSparseHostPoolNearlyFull" in res.stdout + res.stderr and "HiSparseHotBufferHitRateCollapse" in res.stdout + res.stderr


# ---- metric names (every one is in a real exposition: test_metric_expositions.py) ----------------------

def test_metric_name_extraction_is_not_vacuous() -> None:
    expr = ('sum by (a, b) (rate(foo_total{x="y", z=~"$v"}[5m])) / (sum(rate(vllm:bar{q="1"}[1m])) + baz) > 0.5'
            ' and min(qux) - time() < 7 * 86400')
    assert metric_names(expr) == {"foo_total", "vllm:bar", "baz", "qux"}


# ---- the chart carries the files unchanged ---------------------------------------------------------------

def helm_template(helm: Path, *sets: str) -> list[dict[str, Any]]:
    argv = [str(helm), "template", "rel", str(CHART_DIR), "--namespace", "ops", *[a for s in sets for a in ("--set", s)]]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def kinds(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def test_monitoring_objects(helm: Path) -> None:
    objs = helm_template(helm, "monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
                         "monitoring.dashboards.enabled=true", "monitoring.dashboards.namespace=grafana",
                         "monitoring.serviceMonitor.labels.release=kps")
    rule = kinds(objs, "PrometheusRule")[0]
    shipped = yaml.safe_load(ALERTS.read_text())
    for group in shipped["groups"]:  # the file's rules, each with its runbook link added
        for r in group["rules"]:
            r["annotations"]["runbook_url"] = f"{RUNBOOK_BASE}{r['alert']}.md"
    assert rule["spec"] == shipped
    sm = kinds(objs, "ServiceMonitor")[0]
    service = kinds(objs, "Service")[0]
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    cm = next(o for o in kinds(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard"))
    assert cm["metadata"]["namespace"] == "grafana" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["hisparse.json"]) == json.loads(DASHBOARD.read_text())
    assert not {"ServiceMonitor", "PrometheusRule"} & {o["kind"] for o in helm_template(helm)}, "off by default"


def _rules(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in kinds(objs, "PrometheusRule")[0]["spec"]["groups"] for r in g["rules"]}


def test_every_alert_links_a_runbook_page_that_exists() -> None:
    names = [r["alert"] for r in alert_rules()]
    pages = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert pages == set(names), f"runbook pages without an alert or alerts without a page: {pages ^ set(names)}"
    for name in names:
        text = (RUNBOOKS / f"{name}.md").read_text()
        assert text.startswith(f"# {name}\n"), name
        for part in ("**Meaning.**", "**Impact.**", "**Check", "**Fix"):
            assert part in text, f"{name}.md lacks {part}"


def test_alerts_in_the_mixin_shape(helm: Path) -> None:
    """Per-alert toggles and severity, additionalRuleLabels on every alert (an alert's own labels keep their
    values), and runbookBaseURL in every runbook_url."""
    on = "monitoring.prometheusRule.enabled=true"
    default = _rules(helm_template(helm, on))
    assert set(default) == {r["alert"] for r in alert_rules()}
    assert {r["annotations"]["runbook_url"] for r in default.values()} == {
        f"{RUNBOOK_BASE}{n}.md" for n in default}
    tuned = _rules(helm_template(
        helm, on, "monitoring.prometheusRule.alerts.HiSparseReconcileRetries.enabled=false",
        "monitoring.prometheusRule.alerts.HiSparseDecodeNotReady.severity=warning",
        "monitoring.prometheusRule.additionalRuleLabels.team=inference",
        "monitoring.prometheusRule.additionalRuleLabels.severity=none",
        "monitoring.prometheusRule.runbookBaseURL=https://wiki.example.com/hisparse/"))
    assert set(tuned) == set(default) - {"HiSparseReconcileRetries"}
    assert tuned["HiSparseDecodeNotReady"]["labels"]["severity"] == "warning"
    assert tuned["HiSparseWebhookUnavailable"]["labels"] == {"severity": "critical", "team": "inference"}
    assert all(r["labels"]["team"] == "inference" for r in tuned.values())
    assert tuned["HiSparseParityFailed"]["annotations"]["runbook_url"] == (
        "https://wiki.example.com/hisparse/HiSparseParityFailed.md")
    assert all(tuned[n]["expr"] == default[n]["expr"] for n in tuned)
    # A whole group left empty is left out, not rendered without rules (Prometheus refuses that).
    group = yaml.safe_load(ALERTS.read_text())["groups"][0]
    off = [f"monitoring.prometheusRule.alerts.{r['alert']}.enabled=false" for r in group["rules"]]
    groups = kinds(helm_template(helm, on, *off), "PrometheusRule")[0]["spec"]["groups"]
    assert group["name"] not in {g["name"] for g in groups} and all(g["rules"] for g in groups)


TUNED_POOL_TEST = """
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'hisparse_host_pool_usage_ratio{namespace="inference", deployment="glm52", role="decode", revision="r1", pod="p0"}'
        values: '0.85x10'
    alert_rule_test:
      - eval_time: 3m
        alertname: HiSparseHostPoolNearlyFull
        exp_alerts: %s
"""


def _promtool_on_rendered(helm: Path, tmp_path: Path, expect: str, *sets: str) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` over the rules the chart renders with ``sets`` (the PrometheusRule's groups)."""
    rule = kinds(helm_template(helm, "monitoring.prometheusRule.enabled=true", *sets), "PrometheusRule")[0]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    (tmp_path / "test.yaml").write_text(TUNED_POOL_TEST % expect)
    return subprocess.run([promtool(), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def test_thresholds_and_for_from_values_change_when_an_alert_fires(helm: Path, tmp_path: Path) -> None:
    """A host pool 85% full for 3 minutes: silent as shipped (above 90% for 10 minutes), firing with the
    threshold at 0.8 and `for` at 2m, as Prometheus evaluates the rendered rules (promtool)."""
    fires = ("[{exp_labels: {severity: warning, namespace: inference, deployment: glm52, role: decode, revision: r1, "
             "pod: p0}, exp_annotations: %s}]")
    tuned = ("monitoring.prometheusRule.alerts.HiSparseHostPoolNearlyFull.threshold=0.8",
             "monitoring.prometheusRule.alerts.HiSparseHostPoolNearlyFull.for=2m")
    annotations = _rules(helm_template(helm, "monitoring.prometheusRule.enabled=true"))["HiSparseHostPoolNearlyFull"]["annotations"]
    expanded = {k: v.replace("{{ $labels.namespace }}", "inference").replace("{{ $labels.deployment }}", "glm52")
                .replace("{{ $labels.role }}", "decode").replace("{{ $labels.revision }}", "r1")
                .replace("{{ $labels.pod }}", "p0").replace("{{ $value | humanizePercentage }}", "85%")
                for k, v in annotations.items()}
    expect_fire = fires % json.dumps(expanded)
    res = _promtool_on_rendered(helm, tmp_path, expect_fire, *tuned)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr
    res = _promtool_on_rendered(helm, tmp_path, "[]")
    assert res.returncode == 0, f"as shipped the alert must stay silent at 85%: {res.stdout}{res.stderr}"
    res = _promtool_on_rendered(helm, tmp_path, "[]", *tuned)
    assert res.returncode != 0, "the tuned alert did not fire: the values did not reach the rule"


def test_every_ordering_threshold_is_tunable_and_rendered_in_place(helm: Path) -> None:
    """The schema offers ``threshold`` exactly on alerts whose expression ends in an ordering comparison, and
    the template replaces that constant and nothing else (the rest of the expression is the file's)."""
    from hisparse_operator.chart_values import ALERT_EXPRS, THRESHOLD, tunable

    names = [n for n, e in ALERT_EXPRS.items() if tunable(e)]
    assert {"HiSparseHostPoolNearlyFull", "HiSparseTimeToFirstTokenHigh", "HiSparseWebhookCertificateExpiresSoon"} <= set(names)
    assert "HiSparseDecodeNotReady" not in names  # ends in == 0: nothing to tune
    rendered = _rules(helm_template(helm, "monitoring.prometheusRule.enabled=true",
                                    *[f"monitoring.prometheusRule.alerts.{n}.threshold=12345" for n in names]))
    for n in names:
        before, after = ALERT_EXPRS[n].strip(), rendered[n]["expr"].strip()
        assert re.sub(THRESHOLD, "", before) == re.sub(THRESHOLD, "", after) and after.endswith(" 12345"), (n, after)


@pytest.mark.parametrize(("value", "key"), [
    ("monitoring.prometheusRule.alerts.HiSparseNoSuchAlert.enabled=false", "HiSparseNoSuchAlert"),
    ("monitoring.prometheusRule.alerts.HiSparseDecodeNotReady.severity=page", "severity"),
    ("monitoring.prometheusRule.alerts.HiSparseDecodeNotReady.threshold=1", "threshold"),
    ("monitoring.prometheusRule.alerts.HiSparseHostPoolNearlyFull.threshold=most", "threshold"),
    ("monitoring.prometheusRule.alerts.HiSparseHostPoolNearlyFull.for=ten", "for"),
    ("monitoring.prometheusRule.additionalRuleLabels.bad-name=x", "bad-name"),
    ("monitoring.prometheusRule.runbookBaseURL=wiki/runbooks", "runbookBaseURL"),
])
def test_bad_alert_values_are_refused_naming_the_key(helm: Path, value: str, key: str) -> None:
    argv = [str(helm), "template", "rel", str(CHART_DIR), "--set", "monitoring.prometheusRule.enabled=true",
            "--set", value]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and key in res.stderr, res.stderr


def test_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels) and dash["uid"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "deployment", "revision"} <= variables
    wanted = ["Readiness per role", "Hot-buffer hit rate", "Hot-buffer swap-in rate", "Host pool usage", "Canary phase",
              "Canary traffic weight", "Parity results", "Reconcile rate", "Reconcile latency"]
    assert set(wanted) <= {p["title"] for p in panels}
    for p in panels:
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
        for t in p["targets"]:
            used = set(re.findall(r"\$(\w+)", t["expr"]))
            assert used <= variables, f"{p['title']}: undefined variables {used - variables}"
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
    per_revision = [p["title"] for p in panels if any('revision=~"$revision"' in t["expr"] for t in p["targets"])]
    assert {"Hot-buffer hit rate", "Hot-buffer swap-in rate", "Host pool usage"} <= set(per_revision)


# ---- modes ----------------------------------------------------------------------------------------------

def test_single_namespace_mode_grants_namespaced_access_only_in_the_release_namespace(helm: Path) -> None:
    objs = helm_template(helm, "singleNamespace=true")
    cluster = next(r for r in kinds(objs, "ClusterRole") if r["metadata"]["name"] == "ops-rel-hisparse")["rules"]
    roles = {r["metadata"]["name"]: r for r in kinds(objs, "Role")}
    own, watched = roles["rel-hisparse"], roles["ops-rel-hisparse"]  # the Secret's; the watched namespace's
    assert own["metadata"]["namespace"] == watched["metadata"]["namespace"] == "ops"
    assert cluster == chart_rules(scoped=True, peering=True) != []
    namespaced = {"deployments", "configmaps", "secrets", "hisparsedeployments", "events", "pods", "jobs"}
    assert not namespaced & {r for rule in cluster for r in rule["resources"]}, "no cluster-wide access to namespaced kinds"
    assert watched["rules"] == rbac.watched_role_rules()
    assert own["rules"] == rbac.role_rules(kinds(objs, "Secret")[0]["metadata"]["name"])
    hook = kinds(objs, "ValidatingWebhookConfiguration")[0]["webhooks"][0]
    assert hook["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ops"]}]}
    args = kinds(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=ops"]


def test_single_namespace_refuses_watch_namespaces(helm: Path) -> None:
    res = subprocess.run([str(helm), "template", "rel", str(CHART_DIR), "--set", "singleNamespace=true",
                          "--set", "watchNamespaces={a}"], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "singleNamespace manages the release's namespace alone" in res.stderr, res.stderr


def test_cert_manager_mode(helm: Path) -> None:
    objs = helm_template(helm, "webhook.certManager.enabled=true")
    names = {o["kind"] + "/" + o["metadata"]["name"] for o in objs}
    certs = kinds(objs, "Certificate")
    serving = next(c for c in certs if not c["spec"].get("isCA"))
    env = {e["name"]: e.get("value") for e in kinds(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HISPARSE_WEBHOOK_CERT_SOURCE"] == "external"
    assert serving["spec"]["secretName"] == env["HISPARSE_WEBHOOK_SECRET"]
    assert f"{env['HISPARSE_WEBHOOK_SERVICE']}.ops.svc" in serving["spec"]["dnsNames"]
    assert not kinds(objs, "Secret"), "cert-manager writes the Secret; the chart must not own it too"
    hook = kinds(objs, "ValidatingWebhookConfiguration")[0]
    assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"ops/{serving['metadata']['name']}"
    cluster = next(r for r in kinds(objs, "ClusterRole") if r["metadata"]["name"] == "ops-rel-hisparse")["rules"]
    assert not any("validatingwebhookconfigurations" in r["resources"] for r in cluster), "the CA injector owns caBundle"
    secret_rules = [r for r in kinds(objs, "Role")[0]["rules"] if "secrets" in r["resources"]]
    assert [r["verbs"] for r in secret_rules] == [["get"]]
    assert {"Issuer/rel-hisparse-webhook-ca-root", "Issuer/rel-hisparse-webhook-ca"} <= names
    own = helm_template(helm, "webhook.certManager.enabled=true", "webhook.certManager.issuerRef.name=corp-ca",
                        "webhook.certManager.issuerRef.kind=ClusterIssuer")
    assert not kinds(own, "Issuer") and kinds(own, "Certificate")[0]["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


CLUSTER_SCOPED = ("ValidatingWebhookConfiguration", "ClusterKopfPeering", "ClusterRole", "ClusterRoleBinding")


def _outside(objs: list[dict[str, Any]], release_namespace: str) -> set[str]:
    """kind/name of every object a release makes outside its own namespace (what another release could meet)."""
    return {f"{o['kind']}/{o['metadata']['name']}" for o in objs
            if o["kind"] in CLUSTER_SCOPED or o["metadata"].get("namespace", release_namespace) != release_namespace}


def test_cluster_scoped_names_are_release_and_namespace_unique(helm: Path) -> None:
    """The two releases of docs/guides/multi-tenant.md: one name, two namespaces. Nothing outside the release's namespace may
    carry the same name, or the second install fails on the first's objects."""
    def render(release: str, namespace: str, *sets: str) -> list[dict[str, Any]]:
        argv = [str(helm), "template", release, str(CHART_DIR), "--namespace", namespace,
                *[a for s in sets for a in ("--set", s)]]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return [d for d in yaml.safe_load_all(res.stdout) if d]

    one = render("hisparse", "hisparse-system", "watchNamespaces={team-b}")
    two = render("hisparse", "team-a", "singleNamespace=true", "crds.install=false")
    assert _outside(one, "hisparse-system") and _outside(two, "team-a")
    assert not _outside(one, "hisparse-system") & _outside(two, "team-a")
    assert len(_outside(one, "hisparse-system")) == 8  # 4 cluster-scoped + 2 aggregated roles + Role/RoleBinding in team-b
    by_kind = {o["kind"]: o for o in one if o["kind"] in CLUSTER_SCOPED[:2] or o["kind"] == "Deployment"}
    env = {e["name"]: e.get("value") for e in by_kind["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HISPARSE_WEBHOOK_CONFIGURATION"] == by_kind["ValidatingWebhookConfiguration"]["metadata"]["name"]
    assert env["HISPARSE_PEERING"] == by_kind["ClusterKopfPeering"]["metadata"]["name"]
    role = next(o for o in one if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "hisparse-system-hisparse")
    webhook_rule = next(r for r in role["rules"] if "validatingwebhookconfigurations" in r["resources"])
    assert webhook_rule["resourceNames"] == [by_kind["ValidatingWebhookConfiguration"]["metadata"]["name"]]
    # Long namespaces that share their first 54 characters: cut names end in a hash of the whole name.
    long_a, long_b = "n" * 56 + "-aaaa", "n" * 56 + "-bbbb"
    names_a, names_b = _outside(render("rel", long_a), long_a), _outside(render("rel", long_b), long_b)
    assert not names_a & names_b
    for name in names_a:  # the release's cluster-unique name is at most 63 characters, plus a role's suffix
        assert len(name.split("/", 1)[1].split(".")[0].removesuffix("-view").removesuffix("-edit")) <= 63, name


def test_digest_priority_class_and_pdb(helm: Path) -> None:
    digest = "sha256:" + "b" * 64
    objs = {o["kind"]: o for o in helm_template(helm, f"image.digest={digest}", "image.tag=ignored",
                                               "priorityClassName=critical")}
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"ghcr.io/hisparse/hisparse-operator@{digest}"
    assert pod["priorityClassName"] == "critical"
    assert objs["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
    assert objs["PodDisruptionBudget"]["spec"]["selector"] == objs["Deployment"]["spec"]["selector"]
    single = {o["kind"] for o in helm_template(helm, "replicas=1")}
    assert "PodDisruptionBudget" not in single, "a PDB of minAvailable 1 on one replica would block every drain"
    res = subprocess.run([str(helm), "template", "rel", str(CHART_DIR), "--set", "image.digest=sha256:nothex"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0


def test_crd_is_a_template_kept_on_uninstall(helm: Path) -> None:
    from hisparse_operator.crd import crd_yaml

    objs = helm_template(helm)
    crd = kinds(objs, "CustomResourceDefinition")[0]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    want = yaml.safe_load(crd_yaml())
    for key in ("spec", "apiVersion", "kind"):
        assert crd[key] == want[key], key
    assert "helm.sh/resource-policy" not in (kinds(helm_template(helm, "crds.keep=false"), "CustomResourceDefinition")[0]
                                             ["metadata"].get("annotations") or {})
    assert not kinds(helm_template(helm, "crds.install=false"), "CustomResourceDefinition")


@pytest.mark.parametrize("name", list(GOLDEN_VALUES))
def test_golden_chart_renders(helm: Path, name: str) -> None:
    sets = GOLDEN_VALUES[name]
    argv = [str(helm), "template", "ops", str(CHART_DIR), "--namespace", "hisparse-system",
            *[a for s in sets for a in ("--set", s)]]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    # The CRD is left out: test_crd_is_a_template_kept_on_uninstall ties it to the generated CRD, and its
    # golden is crds/ itself.
    docs_ = [d for d in res.stdout.split("\n---\n") if "# Source: hisparse/templates/crds.yaml" not in d]
    rendered = "\n---\n".join(docs_)
    assert len(docs_) < len(res.stdout.split("\n---\n")), "the CRD template rendered nothing"
    golden = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert golden.exists(), f"no golden file {golden.name}: run with UPDATE_GOLDEN=1 and review it"
    assert rendered == golden.read_text(), f"helm template with {sets} changed; review and UPDATE_GOLDEN=1"
    lint = subprocess.run([str(helm), "lint", "--strict", str(CHART_DIR), *[a for s in sets for a in ("--set", s)]],
                          capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_service_monitor_keeps_the_operator_s_namespace_label(helm: Path) -> None:
    """The operator's series carry the deployment's namespace; a ServiceMonitor without honorLabels has
    Prometheus Operator rename it exported_namespace (the real scrape is checked in the monitoring e2e)."""
    sm = kinds(helm_template(helm, "monitoring.serviceMonitor.enabled=true"), "ServiceMonitor")[0]
    assert all(e.get("honorLabels") is True for e in sm["spec"]["endpoints"]), sm["spec"]["endpoints"]


def test_chart_renders_as_a_dependency_of_an_umbrella_chart(helm: Path, tmp_path: Path) -> None:
    """Helm passes ``global`` to every subchart: the schema must accept it, with and without values set."""
    import shutil

    umbrella = tmp_path / "umbrella"
    shutil.copytree(CHART_DIR, umbrella / "charts" / "hisparse")
    version = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["version"]
    (umbrella / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "platform", "version": "1.0.0",
        "dependencies": [{"name": "hisparse", "version": version}]}))
    for extra in ([], ["--set", "global.imageRegistry=registry.example", "--set", "hisparse.replicas=3"]):
        res = subprocess.run([str(helm), "template", "rel", str(umbrella), "--namespace", "ops", *extra],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        deployment = next(d for d in yaml.safe_load_all(res.stdout) if d and d["kind"] == "Deployment")
        assert deployment["spec"]["replicas"] == (3 if extra else 2)
    res = subprocess.run([str(helm), "template", "rel", str(umbrella), "--set", "hisparse.noSuchKey=1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "noSuchKey" in res.stderr, "the subchart's schema still refuses unknown keys"
