"""The chart as one piece among others, without a cluster: the Helm conventions (names, labels, pod
metadata, environment, ServiceAccount, aggregated roles, NetworkPolicy, security context), a release that
names its namespaces scoped in RBAC, admission and the operator's argv from one list, the schema refusing
every bad new value by its key, and the chart's version moving with a changelog. The install-time
ownership checks (`lookup`) need a cluster: e2e/tests/test_e2e_chart_releases.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from hisparse_operator import rbac
from hisparse_operator.chart_values import CHART_DIR, ChartValues
from hisparse_operator.controller.settings import OperatorEnv


def render(helm: Path, *sets: str, values: Path | None = None, release: str = "rel", namespace: str = "ops",
           check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [str(helm), "template", release, str(CHART_DIR), "--namespace", namespace,
            *(["-f", str(values)] if values else []), *[a for s in sets for a in ("--set", s)]]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert not check or res.returncode == 0, res.stderr
    return res


def objects(helm: Path, *sets: str, **kw: Any) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(render(helm, *sets, **kw).stdout) if d]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name or ''}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def pod_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objs, "Deployment")["spec"]["template"]


class _NoDuplicates(yaml.SafeLoader):
    """A YAML loader that refuses a mapping with one key twice (PyYAML keeps the last, silently; the
    apiserver's strict decoding warns or refuses)."""


def _mapping(loader: _NoDuplicates, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    dupes = {k for k in keys if keys.count(k) > 1}
    if dupes:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {sorted(dupes)}", node.start_mark)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_NoDuplicates.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


# ---- conventions ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("sets", [[], ["singleNamespace=true", "networkPolicy.enabled=true",
                                       "webhook.certManager.enabled=true", "commonLabels.team=x"]])
def test_no_object_renders_a_key_twice(helm: Path, sets: list[str]) -> None:
    """The helm test pod used to render app.kubernetes.io/component twice."""
    out = render(helm, *sets).stdout
    docs = list(yaml.load_all(out, Loader=_NoDuplicates))  # noqa: S506 (a SafeLoader subclass)
    test_pod = next(d for d in docs if d and d["kind"] == "Pod")
    assert test_pod["metadata"]["labels"]["app.kubernetes.io/component"] == "test"
    with pytest.raises(yaml.constructor.ConstructorError):
        yaml.load("a: 1\na: 2\n", Loader=_NoDuplicates)  # noqa: S506


def test_name_overrides(helm: Path) -> None:
    named = objects(helm, "nameOverride=hs")
    assert one(named, "Deployment")["metadata"]["name"] == "rel-hs"
    assert one(named, "Deployment")["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "hs"
    full = objects(helm, "fullnameOverride=serving-operator")
    deployment = one(full, "Deployment")
    assert deployment["metadata"]["name"] == "serving-operator"
    assert one(full, "ServiceAccount")["metadata"]["name"] == "serving-operator"
    assert one(full, "ClusterKopfPeering")["metadata"]["name"] == "ops-serving-operator"
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HISPARSE_WEBHOOK_SERVICE"] == one(full, "Service")["metadata"]["name"] == "serving-operator"
    assert env["HISPARSE_WEBHOOK_SECRET"] == one(full, "Secret")["metadata"]["name"]
    assert env["HISPARSE_WEBHOOK_CONFIGURATION"] == one(full, "ValidatingWebhookConfiguration")["metadata"]["name"]


def test_common_labels_on_every_object_and_the_chart_s_own_win(helm: Path) -> None:
    objs = objects(helm, "commonLabels.team=inference", "commonLabels.app\\.kubernetes\\.io/name=other",
                   "networkPolicy.enabled=true", "singleNamespace=true")
    for o in objs:
        labels = o["metadata"]["labels"]
        assert labels["team"] == "inference", f"{o['kind']}/{o['metadata']['name']}"
        assert labels["app.kubernetes.io/name"] == "hisparse", f"{o['kind']}/{o['metadata']['name']}"
    template = pod_spec(objs)
    assert template["metadata"]["labels"]["team"] == "inference"
    assert one(objs, "Deployment")["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()


def test_pod_annotations_and_labels(helm: Path) -> None:
    template = pod_spec(objects(helm, "podAnnotations.example\\.com/scrape=yes", "podLabels.tier=control",
                                "podLabels.app\\.kubernetes\\.io/instance=stolen"))
    assert template["metadata"]["annotations"] == {"example.com/scrape": "yes"}
    assert template["metadata"]["labels"]["tier"] == "control"
    assert template["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel", "the selector's labels win"
    assert "annotations" not in pod_spec(objects(helm))["metadata"]


def test_extra_env_is_added_and_the_chart_s_variables_are_refused(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "env.yaml"
    values.write_text(yaml.safe_dump({"extraEnv": [
        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
        {"name": "HISPARSE_WEBHOOK_CERT_DAYS", "value": "90"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}))
    env = pod_spec(objects(helm, values=values))["spec"]["containers"][0]["env"]
    assert env[-3:] == yaml.safe_load(values.read_text())["extraEnv"]
    settings = OperatorEnv.from_env({e["name"]: e["value"] for e in env if e["name"].startswith("HISPARSE_")
                                     and "value" in e})
    assert settings.webhook_cert_days == 90, "a setting the chart has no value for reaches the operator"
    clash = subprocess.run([str(helm), "template", "rel", str(CHART_DIR), "--set", "extraEnv[0].name=HISPARSE_WORKERS",
                            "--set-string", "extraEnv[0].value=3"], capture_output=True, text=True, timeout=60)
    assert clash.returncode != 0 and "extraEnv[0].name HISPARSE_WORKERS is set by the chart" in clash.stderr, clash.stderr


def test_service_account_settings(helm: Path) -> None:
    objs = objects(helm, "serviceAccount.annotations.iam\\.example\\.com/role=operator", "singleNamespace=true")
    account = one(objs, "ServiceAccount")
    assert account["metadata"]["annotations"] == {"iam.example.com/role": "operator"}
    existing = objects(helm, "serviceAccount.create=false", "serviceAccount.name=platform-operator",
                       "singleNamespace=true")
    assert not [o for o in existing if o["kind"] == "ServiceAccount"]
    assert pod_spec(existing)["spec"]["serviceAccountName"] == "platform-operator"
    assert one(existing, "Pod")["spec"]["serviceAccountName"] == "platform-operator"
    bindings = [o for o in existing if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert len(bindings) == 3  # the Secret's Role, the watched namespace's Role, the ClusterRole
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "platform-operator", "namespace": "ops"}], b
    res = render(helm, "serviceAccount.create=false", check=False)
    assert res.returncode != 0 and "serviceAccount.name: name the existing ServiceAccount" in res.stderr, res.stderr


def test_aggregated_roles_add_hisparsedeployments_to_view_edit_and_admin(helm: Path) -> None:
    objs = objects(helm)
    view, edit = one(objs, "ClusterRole", "ops-rel-hisparse-view"), one(objs, "ClusterRole", "ops-rel-hisparse-edit")
    to = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in view["metadata"]["labels"].items() if k.startswith(to) and v == "true"} == {
        to + "view", to + "edit", to + "admin"}
    assert {k for k, v in edit["metadata"]["labels"].items() if k.startswith(to) and v == "true"} == {
        to + "edit", to + "admin"}
    assert view["rules"][0]["verbs"] == ["get", "list", "watch"]
    assert "create" in edit["rules"][0]["verbs"] and "hisparsedeployments/status" not in edit["rules"][0]["resources"]
    off = objects(helm, "rbac.aggregateClusterRoles=false")
    assert [o["metadata"]["name"] for o in off if o["kind"] == "ClusterRole"] == ["ops-rel-hisparse"]


def test_network_policy_admits_only_the_webhook_and_metrics_ports(helm: Path) -> None:
    assert not [o for o in objects(helm) if o["kind"] == "NetworkPolicy"], "off by default"
    objs = objects(helm, "networkPolicy.enabled=true",
                   "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring")
    policy, deployment = one(objs, "NetworkPolicy"), one(objs, "Deployment")
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    rules = {r["ports"][0]["port"]: r for r in policy["spec"]["ingress"]}
    assert set(rules) == {"webhook", "metrics"} and set(rules) <= ports
    assert "from" not in rules["webhook"], "the apiserver's address is the cluster's: any source"
    assert rules["metrics"]["from"] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_pod_security_context_is_open_but_never_root(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "psc.yaml"
    extra = {"fsGroupChangePolicy": "OnRootMismatch", "supplementalGroups": [2000],
             "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]}
    values.write_text(yaml.safe_dump({"podSecurityContext": extra}))
    context = pod_spec(objects(helm, values=values))["spec"]["securityContext"]
    assert extra.items() <= context.items() and context["runAsNonRoot"] is True
    for bad, key in (("podSecurityContext.runAsNonRoot=false", "runAsNonRoot"),
                     ("podSecurityContext.runAsUser=0", "runAsUser"),
                     ("podSecurityContext.fsGroupChangePolicy=Sometimes", "fsGroupChangePolicy"),
                     ("podSecurityContext.noSuchField=1", "noSuchField")):
        res = render(helm, bad, check=False)
        assert res.returncode != 0 and key in res.stderr, (bad, res.stderr)


@pytest.mark.parametrize("startup", [None, 30, 601])
def test_liveness_counts_only_after_the_operator_answered_once(helm: Path, startup: int | None) -> None:
    """kopf serves /healthz only after its startup handlers ran; a liveness probe that also counted the
    imports and the first node list restarted a CPU-starved operator into CrashLoopBackOff. The startupProbe
    on the same endpoint gives it at least ``liveness.startupSeconds`` (300 by default) first."""
    sets = [f"liveness.startupSeconds={startup}"] if startup else []
    container = pod_spec(objects(helm, *sets))["spec"]["containers"][0]
    startup_probe, liveness = container["startupProbe"], container["livenessProbe"]
    assert startup_probe["httpGet"] == liveness["httpGet"] == {"path": "/healthz", "port": "liveness"}
    budget = startup_probe["periodSeconds"] * startup_probe["failureThreshold"]
    wanted = startup or ChartValues().liveness.startup_seconds
    assert wanted <= budget < wanted + startup_probe["periodSeconds"], (wanted, startup_probe)
    assert "initialDelaySeconds" not in liveness, "the startupProbe already holds liveness back"


# ---- a release that names its namespaces -------------------------------------------------------------------

def test_watch_namespaces_scope_rbac_admission_and_the_operator_alike(helm: Path) -> None:
    from hisparse_operator.cli import app

    watched = ["team-a", "team-b"]
    objs = objects(helm, "watchNamespaces={team-a,team-b}")
    cluster = one(objs, "ClusterRole", "ops-rel-hisparse")["rules"]
    assert not [r for r in cluster if set(r["resources"]) & {"deployments", "hisparsedeployments", "events"}]
    roles = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "ops-rel-hisparse"]
    bindings = [o for o in objs if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "ops-rel-hisparse"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(b["metadata"]["namespace"] for b in bindings) == watched
    for role in roles:
        assert role["rules"] == rbac.watched_role_rules()
    for binding in bindings:
        assert binding["roleRef"]["name"] == "ops-rel-hisparse"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-hisparse", "namespace": "ops"}]
    selector = one(objs, "ValidatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]
    assert selector == {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": watched}]}
    args = pod_spec(objs)["spec"]["containers"][0]["args"]
    ctx = typer.main.get_command(app).make_context("hisparse", list(args), resilient_parsing=False)
    run = ctx.command.get_command(ctx, "operator").get_command(ctx, "run")  # type: ignore[union-attr]
    assert run.make_context("run", args[2:], parent=ctx).params["namespace"] == watched
    # every namespace: one ClusterRole, no selector, no --namespace
    everywhere = objects(helm)
    assert "namespaceSelector" not in one(everywhere, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert not [a for a in pod_spec(everywhere)["spec"]["containers"][0]["args"] if a.startswith("--namespace")]
    assert [o["metadata"]["name"] for o in everywhere if o["kind"] == "Role"] == ["rel-hisparse"]


# ---- bad values are refused by their key ---------------------------------------------------------------------

@pytest.mark.parametrize(("value", "key"), [
    ("nameOverride=Bad_Name", "nameOverride"),
    ("fullnameOverride=-x", "fullnameOverride"),
    ("commonLabels.bad key=x", "commonLabels"),
    ("commonLabels.team=not a value", "commonLabels"),
    ("podLabels.tier=!", "podLabels"),
    ("podAnnotations.bad key=x", "podAnnotations"),
    ("extraEnv[0].name=1 BAD", "extraEnv"),
    ("extraEnv[0].nme=X", "nme"),
    ("serviceAccount.create=maybe", "serviceAccount"),
    ("serviceAccount.bogus=1", "bogus"),
    ("serviceAccount.name=Bad_Name", "serviceAccount"),
    ("rbac.aggregateClusterRoles=yes", "aggregateClusterRoles"),
    ("rbac.bogus=true", "bogus"),
    ("networkPolicy.enabled=on", "networkPolicy"),
    ("networkPolicy.metricsFrom=nobody", "metricsFrom"),
    ("watchNamespaces={team-a,team-a}", "watchNamespaces"),
    ("watchNamespaces={Team_A}", "watchNamespaces"),
    ("watchNamespaces={team-*}", "watchNamespaces"),
    ("liveness.startupSeconds=5", "startupSeconds"),
])
def test_bad_new_values_are_refused_naming_the_key(helm: Path, value: str, key: str) -> None:
    res = render(helm, value, check=False)
    assert res.returncode != 0, f"--set {value} was accepted"
    assert key in res.stderr, res.stderr


def test_a_values_file_with_an_unknown_key_or_a_mistyped_threshold_is_refused(helm: Path, tmp_path: Path) -> None:
    for doc, key in (({"webhook": {"prot": 9443}}, "prot"),
                     ({"retry": {"baseSeconds": "fast"}}, "baseSeconds"),
                     ({"podDisruptionBudget": {"minAvailable": "1"}}, "minAvailable"),
                     ({"peering": {"lifetimeSeconds": 1.5}}, "lifetimeSeconds")):
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump(doc))
        res = render(helm, values=values, check=False)
        assert res.returncode != 0 and key in res.stderr, (doc, res.stderr)


def test_every_new_value_has_a_default_in_values_yaml() -> None:
    on_disk = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for key in ("nameOverride", "fullnameOverride", "commonLabels", "podAnnotations", "podLabels", "extraEnv",
                "serviceAccount", "rbac", "networkPolicy"):
        assert key in on_disk and key in ChartValues.model_json_schema(by_alias=True)["properties"], key


# ---- version and changelog --------------------------------------------------------------------------------

SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?$")


def changelog() -> list[tuple[str, list[tuple[str, str]]]]:
    """CHANGELOG.md as (version, [(kind, description)]) newest first."""
    out: list[tuple[str, list[tuple[str, str]]]] = []
    for line in (CHART_DIR / "CHANGELOG.md").read_text().splitlines():
        if line.startswith("## "):
            out.append((line[3:].strip(), []))
        elif line.startswith("- ") and out:
            kind, _, text = line[2:].partition(": ")
            out[-1][1].append((kind, text))
    return out


def test_chart_version_has_a_changelog_section_and_artifact_hub_lists_it() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    sections = changelog()
    versions = [v for v, _ in sections]
    assert all(SEMVER.match(v) for v in versions), versions
    assert versions[0] == chart["version"], "the newest CHANGELOG.md section is the chart's version"
    as_tuples = [tuple(int(x) for x in v.split("-")[0].split(".")) for v in versions]
    assert as_tuples == sorted(as_tuples, reverse=True) and len(set(as_tuples)) == len(as_tuples), versions
    changes = yaml.safe_load(chart["annotations"]["artifacthub.io/changes"])
    assert [(c["kind"], c["description"]) for c in changes] == sections[0][1]
    kinds = {"added", "changed", "deprecated", "removed", "fixed", "security"}
    assert {k for _, entries in sections for k, _ in entries} <= kinds
    crds = yaml.safe_load(chart["annotations"]["artifacthub.io/crds"])
    from hisparse_operator.api import labels as L

    assert [(c["kind"], c["name"], c["version"]) for c in crds] == [(L.KIND, f"{L.PLURAL}.{L.GROUP}", L.VERSION)]


@pytest.mark.parametrize(("release", "namespace"), [("hisparse", "hisparse-system"), ("ops", "n" * 56 + "-aaaa")])
def test_the_dev_cluster_names_the_webhook_configuration_as_the_chart_does(helm: Path, tmp_path: Path, release: str,
                                                                           namespace: str) -> None:
    """`hisparse dev` and the real-node suites find a release's webhook configuration by the name the chart
    gives it (hisparse.clusterName, mirrored in Python)."""
    from hisparse_devcluster.operator_pod import OperatorRelease

    class Workdir:  # the one attribute OperatorRelease reads from its cluster when made
        workdir = tmp_path

    rendered = one(objects(helm, release=release, namespace=namespace), "ValidatingWebhookConfiguration")
    mirrored = OperatorRelease(Workdir(), release=release, namespace=namespace)  # type: ignore[arg-type]
    assert mirrored.webhook_configuration == rendered["metadata"]["name"]
