"""The chart without a cluster: generated files are fresh, the ClusterRole covers what the operator does
and nothing dangerous, and the real Helm lints the chart and renders the generated rules."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from opsupport import REPO, VALID_EXAMPLES, chart_rules

from hisparse_operator import chart_values, rbac
from hisparse_operator.chart_values import CHART_DIR, ChartValues
from hisparse_operator.controller import webhook
from hisparse_operator.controller.kube import CHILD_KINDS
from hisparse_operator.controller.settings import OperatorEnv
from hisparse_operator.crd import CRD_FILE
from hisparse_operator.render import render



def allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str | None = None) -> bool:
    """What the RBAC authorizer decides for one request against ``rules`` (no wildcards are used here)."""
    for r in rules:
        if group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]:
            names = r.get("resourceNames")
            if not names or (name is not None and name in names):
                return True
    return False


# ---- generated files -------------------------------------------------------------------------------

def test_generated_chart_files_are_up_to_date() -> None:
    stale = chart_values.stale_files()
    assert not stale, f"stale chart files {stale}: run `python -m hisparse_operator.chart_values`"


def test_chart_crd_is_byte_identical_to_the_repository_crd() -> None:
    assert (CHART_DIR / "files" / "crds" / CRD_FILE).read_bytes() == (REPO / "crds" / CRD_FILE).read_bytes()


def test_staleness_check_notices_a_hand_edit(tmp_path: Path) -> None:
    chart_values.write(tmp_path)
    assert chart_values.stale_files(tmp_path) == []
    role = tmp_path / "templates" / "clusterrole.yaml"
    role.write_text(role.read_text().replace("delete", "deletecollection", 1))
    (tmp_path / "values.schema.json").unlink()
    assert sorted(chart_values.stale_files(tmp_path)) == ["templates/clusterrole.yaml", "values.schema.json"]


def test_values_yaml_holds_exactly_the_model_defaults() -> None:
    on_disk = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    ChartValues.model_validate(on_disk)
    assert on_disk == ChartValues().model_dump(mode="json", by_alias=True, exclude_none=True)


# ---- RBAC ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("api_version", "kind"), CHILD_KINDS, ids=[k for _, k in CHILD_KINDS])
def test_every_child_kind_can_be_applied_observed_and_pruned(api_version: str, kind: str) -> None:
    rules = rbac.cluster_role_rules()
    group = api_version.rpartition("/")[0]
    for verb in ("get", "list", "watch", "create", "patch", "delete"):
        assert allows(rules, group, rbac.plural(kind), verb), f"{verb} {kind} ({api_version})"


def test_plural_follows_kubernetes_naming() -> None:
    cases = {"ConfigMap": "configmaps", "NetworkPolicy": "networkpolicies", "Ingress": "ingresses",
             "Endpoints": "endpoints", "Gateway": "gateways", "PodMonitor": "podmonitors"}
    assert {k: rbac.plural(k) for k in cases} == cases


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_rbac_the_operator_creates_is_within_its_own(path: Path) -> None:
    """Kubernetes refuses a Role (or a binding to it) that grants more than its creator holds."""
    own = rbac.cluster_role_rules()
    roles = [o for o in render(yaml.safe_load(path.read_text())) if o["kind"] == "Role"]
    assert roles, f"{path.name} renders no Role: this test would check nothing"
    for role in roles:
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert allows(own, group, resource, verb), (
                            f"Role {role['metadata']['name']} grants {verb} {resource}.{group or 'core'}, which the operator lacks")


def test_operator_needs_are_granted() -> None:
    rules = rbac.cluster_role_rules()
    needs = [
        ("serving.hisparse.dev", "hisparsedeployments", "watch"),
        ("serving.hisparse.dev", "hisparsedeployments/status", "patch"),
        ("", "nodes", "watch"),
        ("", "events", "create"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ]
    for group, resource, verb in needs:
        assert allows(rules, group, resource, verb), f"{verb} {resource}"
    group, kind = "admissionregistration.k8s.io", "validatingwebhookconfigurations"
    for verb in ("get", "patch"):  # the replicas keep caBundle current; the chart owns the object
        assert allows(rules, group, kind, verb, name=rbac.WEBHOOK_CONFIGURATION)
        assert not allows(rules, group, kind, verb, name="someone-elses-webhook")
    for verb in ("create", "delete", "update", "list"):
        assert not allows(rules, group, kind, verb, name=rbac.WEBHOOK_CONFIGURATION), verb
    assert not any("mutatingwebhookconfigurations" in r["resources"] for r in rules)


def test_certificate_secret_is_reachable_only_by_name_in_the_operator_namespace() -> None:
    for cluster in (rbac.cluster_role_rules(scoped=True, peering=True), rbac.cluster_role_rules(peering=True)):
        assert not any("secrets" in r["resources"] for r in cluster), "no cluster-wide Secret access"
    assert not any("secrets" in r["resources"] for r in rbac.watched_role_rules()), "none in watched namespaces"
    role = rbac.role_rules("ops-hisparse-webhook-cert")
    for verb in ("get", "update"):
        assert allows(role, "", "secrets", verb, name="ops-hisparse-webhook-cert")
        assert not allows(role, "", "secrets", verb, name="another-secret")
    # create cannot be limited to a name: granted so a deleted Secret is made again, and nothing else
    assert allows(role, "", "secrets", "create")
    for verb in ("list", "watch", "delete", "patch"):
        assert not allows(role, "", "secrets", verb), verb
    external = rbac.role_rules("ops-hisparse-webhook-cert", external_certs=True)
    assert not allows(external, "", "secrets", "create") and not allows(external, "", "secrets", "update")


def test_a_scoped_release_holds_the_same_grants_split_by_scope() -> None:
    """watchNamespaces moves every namespaced rule into the Roles and adds only kopf's namespace lookups:
    nothing the operator needs is lost, nothing namespaced stays cluster-wide."""
    everywhere = rbac.cluster_role_rules(peering=True)
    cluster, watched = rbac.cluster_role_rules(scoped=True, peering=True), rbac.watched_role_rules()
    namespaces_rule = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}
    assert sorted(map(str, cluster + watched)) == sorted(map(str, everywhere + [namespaces_rule]))
    cluster_scoped = {g.resources[0] for g in rbac.grants() if g.scope == "cluster"}
    assert {r for rule in cluster for r in rule["resources"]} <= cluster_scoped
    assert not {r for rule in watched for r in rule["resources"]} & cluster_scoped


def test_namespace_and_peering_rules_only_when_used() -> None:
    plain = rbac.cluster_role_rules()
    assert not allows(plain, "", "namespaces", "list")
    assert not allows(plain, "kopf.dev", "clusterkopfpeerings", "patch")
    assert allows(rbac.cluster_role_rules(scoped=True), "", "namespaces", "watch")
    assert allows(rbac.cluster_role_rules(peering=True), "kopf.dev", "clusterkopfpeerings", "patch")


def test_nothing_dangerous_is_granted() -> None:
    rules = rbac.cluster_role_rules(peering=True)
    for r in rules:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in r[key], f"wildcard in {r}"
        assert not {"escalate", "bind", "impersonate", "update", "deletecollection"} & set(r["verbs"]), r
    for group, resource, verb in [("", "secrets", "get"), ("", "secrets", "list"), ("", "pods/exec", "create"),
                                  ("", "pods", "create"), ("", "pods", "delete"), ("", "serviceaccounts/token", "create"),
                                  ("", "nodes", "patch"), ("rbac.authorization.k8s.io", "clusterroles", "create"),
                                  ("rbac.authorization.k8s.io", "clusterrolebindings", "create"),
                                  ("apiextensions.k8s.io", "customresourcedefinitions", "patch"),
                                  ("serving.hisparse.dev", "hisparsedeployments", "delete")]:
        assert not allows(rules, group, resource, verb), f"{verb} {resource} must not be granted"


# ---- Helm -----------------------------------------------------------------------------------------------

def helm_template(helm: Path, *sets: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [str(helm), "template", "rel", str(CHART_DIR), "--namespace", "ops", *[a for s in sets for a in ("--set", s)]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=check)


AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-view"


def docs(out: str) -> dict[str, dict[str, Any]]:
    """The rendered objects by kind; the ClusterRoles aggregated into the built-in roles apart (by name)."""
    out_ = {}
    for d in yaml.safe_load_all(out):
        if d:
            aggregated = any(k.startswith(AGGREGATE[:-4]) for k in d["metadata"].get("labels", {}))
            out_[f"{d['kind']}/{d['metadata']['name']}" if aggregated else d["kind"]] = d
    return out_


def test_helm_lint_strict(helm: Path) -> None:
    res = subprocess.run([str(helm), "lint", "--strict", str(CHART_DIR)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 chart(s) failed" in res.stdout


def test_template_renders_the_generated_cluster_role(helm: Path) -> None:
    objs = docs(helm_template(helm).stdout)
    assert set(objs) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Secret",
                         "Service", "Deployment", "ValidatingWebhookConfiguration", "CustomResourceDefinition",
                         "ClusterKopfPeering", "PodDisruptionBudget", "Pod", "ClusterRole/ops-rel-hisparse-view",
                         "ClusterRole/ops-rel-hisparse-edit"}
    assert objs["ClusterRole"]["rules"] == chart_rules(peering=True)  # two replicas by default
    assert objs["Pod"]["metadata"]["annotations"]["helm.sh/hook"] == "test"
    subjects = [{"kind": "ServiceAccount", "name": objs["ServiceAccount"]["metadata"]["name"], "namespace": "ops"}]
    for binding, role in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        assert objs[binding]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role,
                                            "name": objs[role]["metadata"]["name"]}
        assert objs[binding]["subjects"] == subjects
    secret = objs["Secret"]["metadata"]
    assert secret["namespace"] == objs["Role"]["metadata"]["namespace"] == "ops"
    assert objs["Role"]["rules"] == rbac.role_rules(secret["name"])


def test_webhook_configuration_is_the_chart_s_and_names_its_service(helm: Path) -> None:
    objs = docs(helm_template(helm, "webhook.port=9555").stdout)
    service = objs["Service"]["metadata"]
    want = webhook.configuration(webhook.Endpoint.for_service(service["namespace"], service["name"], 9555).client_config())
    got = objs["ValidatingWebhookConfiguration"]
    assert got["metadata"]["name"] == f"ops-rel-hisparse.{webhook.CONFIGURATION}"
    assert got["webhooks"] == want["webhooks"], "no caBundle in the chart: the operator fills it from the Secret"
    assert {p["name"]: p["port"] for p in objs["Service"]["spec"]["ports"]}["webhook"] == 9555


def test_template_with_peering_and_named_namespaces(helm: Path) -> None:
    objs = docs(helm_template(helm, "replicas=2", "watchNamespaces={team-a,team-b}", "peering.name=ops-peers").stdout)
    assert objs["ClusterRole"]["rules"] == chart_rules(scoped=True, peering=True)
    assert objs["ClusterKopfPeering"]["metadata"]["name"] == "ops-peers"
    container = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "HISPARSE_PEERING", "value": "ops-peers"} in container["env"]
    assert [a for a in container["args"] if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


def test_operator_pod_is_locked_down(helm: Path) -> None:
    pod = docs(helm_template(helm).stdout)["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["HISPARSE_WEBHOOK_CERT_DIR"] in mounts, "the certificate must go to a writable volume"
    assert "/tmp" in mounts


def test_deployment_command_and_env_match_the_operator(helm: Path) -> None:
    """The chart's argv parses with our CLI, and every HISPARSE_ variable is one the handlers read."""
    from hisparse_operator.cli import app

    objs = docs(helm_template(helm, "watchNamespaces={a}", "replicas=3").stdout)
    container = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["hisparse"]
    command = typer.main.get_command(app)
    ctx = command.make_context("hisparse", list(container["args"]), resilient_parsing=False)
    sub = ctx.command.get_command(ctx, "operator")
    run_ctx = sub.get_command(ctx, "run").make_context("run", container["args"][2:], parent=ctx)  # type: ignore[union-attr]
    assert run_ctx.params["namespace"] == ["a"]
    liveness = run_ctx.params["liveness"]
    port = int(re.search(r":(\d+)/", liveness).group(1))  # type: ignore[union-attr]
    assert container["livenessProbe"]["httpGet"]["port"] == "liveness"
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["liveness"] == port
    read = set(OperatorEnv.variables())
    used = {e["name"] for e in container["env"] if e["name"].startswith("HISPARSE_")}
    assert used <= read, f"the chart sets variables the operator never reads: {used - read}"
    ports = {p["name"]: p["port"] for p in objs["Service"]["spec"]["ports"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    settings = OperatorEnv.from_env({k: v for k, v in env.items() if v is not None and k.startswith("HISPARSE_")})
    assert ports["webhook"] == settings.webhook_port
    assert settings.webhook_service == objs["Service"]["metadata"]["name"], "service mode, through the chart's Service"
    assert settings.webhook_secret == objs["Secret"]["metadata"]["name"]
    namespace_env = next(e for e in container["env"] if e["name"] == "HISPARSE_NAMESPACE")
    assert namespace_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_chart_defaults_are_the_operator_s_defaults(helm: Path) -> None:
    """Settings both the chart and the operator default: the chart's values, rendered, give the
    operator's own defaults (so neither default can drift from the other)."""
    objs = docs(helm_template(helm, "replicas=2").stdout)
    container = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("HISPARSE_") and "value" in e}
    rendered = OperatorEnv.from_env(env)
    defaults = OperatorEnv()
    for field in ("resync_seconds", "workers", "peering_lifetime", "retry_base_seconds", "retry_max_seconds"):
        assert f"HISPARSE_{field.upper()}" in env, f"the chart does not set {field}"
        assert getattr(rendered, field) == getattr(defaults, field), field


def test_chart_retry_and_peering_values_reach_the_operator(helm: Path) -> None:
    objs = docs(helm_template(helm, "replicas=2", "retry.baseSeconds=2", "retry.maxSeconds=30",
                              "peering.lifetimeSeconds=15").stdout)
    container = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("HISPARSE_") and "value" in e}
    settings = OperatorEnv.from_env(env)
    assert (settings.retry_base_seconds, settings.retry_max_seconds, settings.peering_lifetime) == (2, 30, 15)
    # a single replica runs no peering: no lifetime either
    single = docs(helm_template(helm, "replicas=1").stdout)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert not {"HISPARSE_PEERING", "HISPARSE_PEERING_LIFETIME"} & {e["name"] for e in single["env"]}


def test_chart_parity_image_reaches_the_operator_as_the_judge(helm: Path) -> None:
    from hisparse_operator.render.parity import JudgeImage

    def settings(*values: str) -> OperatorEnv:
        container = docs(helm_template(helm, *values).stdout)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
        return OperatorEnv.from_env({e["name"]: e["value"] for e in container["env"]
                                     if e["name"].startswith("HISPARSE_") and "value" in e})

    assert settings().judge_image() is None  # the stable revision's image
    pinned = settings("parity.image=registry.example/judge:1", "parity.pullPolicy=Always")
    assert pinned.judge_image() == JudgeImage("registry.example/judge:1", "Always")


def test_chart_refuses_a_retry_ceiling_below_its_base(helm: Path) -> None:
    res = helm_template(helm, "retry.baseSeconds=10", "retry.maxSeconds=5", check=False)
    assert res.returncode != 0 and "retry.maxSeconds 5 is below retry.baseSeconds 10" in res.stderr, res.stderr


@pytest.mark.parametrize("bad", ["bogus=1", "podSecurityContext.runAsNonRoot=false", "replicas=0",
                                 "webhook.port=443", "image.pullPolicy=Sometimes", "retry.baseSeconds=0",
                                 "peering.lifetimeSeconds=1"])
def test_values_schema_refuses_bad_values(helm: Path, bad: str) -> None:
    res = helm_template(helm, bad, check=False)
    assert res.returncode != 0, f"--set {bad} was accepted"
    assert "values don't meet the specifications of the schema" in res.stderr or "at '" in res.stderr, res.stderr


def test_no_secret_material_in_the_chart(helm: Path) -> None:
    """The one Secret is the empty one the operator fills; the chart carries no key or certificate."""
    out = helm_template(helm, "replicas=2").stdout
    secrets = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Secret"]
    assert len(secrets) == 1 and not secrets[0].get("data") and not secrets[0].get("stringData"), secrets
    assert "BEGIN" not in out
    hooks = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "ValidatingWebhookConfiguration")["webhooks"]
    assert all("caBundle" not in h["clientConfig"] for h in hooks)


def test_chart_refuses_clusters_older_than_1_30(helm: Path) -> None:
    old = subprocess.run([str(helm), "template", "rel", str(CHART_DIR), "--kube-version", "1.29.9"],
                         capture_output=True, text=True, timeout=60)
    assert old.returncode != 0 and "kubeVersion" in old.stderr, old.stderr
    ok = subprocess.run([str(helm), "template", "rel", str(CHART_DIR), "--kube-version", "1.30.0"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr


def test_every_value_is_documented() -> None:
    def walk(model: type, path: str) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():  # type: ignore[attr-defined]
            if not field.description:
                missing.append(f"{path}{name}")
            sub = field.annotation
            if isinstance(sub, type) and issubclass(sub, chart_values.BaseModel):
                missing += walk(sub, f"{path}{name}.")
        return missing

    assert walk(ChartValues, "") == []
