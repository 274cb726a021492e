"""The Helm chart's values as a pydantic model, and every chart file generated from Python.

``charts/hisparse/values.schema.json`` comes from :class:`ChartValues` (Helm checks user values against
it on install, upgrade, lint and template), ``templates/clusterrole.yaml``, ``templates/role.yaml`` and
``templates/watched-roles.yaml`` from :mod:`.rbac`, ``templates/validatingwebhookconfiguration.yaml`` from :mod:`.controller.webhook`, and
``crds/serving.hisparse.dev_hisparsedeployments.yaml`` from :mod:`.crd`. Rewrite them all with::

    python -m hisparse_operator.chart_values

A test fails when any of them differs from what this module produces.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

CHART_NAME: Final = "hisparse"
REPO_ROOT: Final = Path(__file__).resolve().parents[2]
CHART_DIR: Final = REPO_ROOT / "charts" / CHART_NAME

Quantity = str | int | float
"""A Kubernetes resource quantity as YAML gives it (``500m``, ``1Gi``, ``2``)."""
DNS_LABEL: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A namespace name (RFC 1123 label; at most 63 characters)."""
LABEL_KEY: Final = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
"""A Kubernetes label or annotation key: an optional DNS-subdomain prefix and a name."""
LABEL_VALUE: Final = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
_LABEL_VALUE_SCHEMA: Final = {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE}
# Keys checked with patternProperties and no additionalProperties: a bad key is then reported with the path
# of its map ("at '/commonLabels': additional properties 'bad key' not allowed"); propertyNames reports none.
Labels = Annotated[dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]],
                   Field(json_schema_extra={"patternProperties": {LABEL_KEY: _LABEL_VALUE_SCHEMA},
                                            "additionalProperties": False})]
"""Kubernetes labels: keys and values the apiserver accepts (checked before anything is sent)."""
Annotations = Annotated[dict[str, str], Field(json_schema_extra={"patternProperties": {LABEL_KEY: {"type": "string"}},
                                                                 "additionalProperties": False})]
Namespace = Annotated[str, Field(max_length=63, pattern=DNS_LABEL)]


class _Values(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Image(_Values):
    repository: str = Field("ghcr.io/hisparse/hisparse-operator", min_length=1, pattern=r"^[^@:\s]+(:[0-9]+)?(/[^@:\s]+)*$",
                            description="Operator image repository (no tag or digest): has the `hisparse` CLI with the "
                                        "`operator` extra installed.")
    tag: str = Field("", pattern=r"^([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$",
                     description="Image tag; empty means the chart's appVersion. Ignored when `digest` is set.")
    digest: str = Field("", pattern=r"^(sha256:[a-f0-9]{64})?$",
                        description="Image digest (`sha256:<64 hex>`); when set the image is `repository@digest`, "
                                    "pinned to those exact bytes.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="Image pull policy.")


class Resources(_Values):
    requests: dict[str, Quantity] = Field(default_factory=lambda: {"cpu": "100m", "memory": "256Mi"},
                                          description="Container resource requests.")
    limits: dict[str, Quantity] = Field(default_factory=lambda: {"memory": "512Mi"},
                                        description="Container resource limits (no CPU limit: throttling slows reconciles).")


class SeccompProfile(_Values):
    type: Literal["RuntimeDefault", "Localhost"] = Field("RuntimeDefault", description="Seccomp profile type.")
    localhost_profile: str | None = Field(None, description="Profile path on the node, for type Localhost.")


class PodSecurityContext(_Values):
    """Every field of Kubernetes' PodSecurityContext (apart from Windows options) may be set; only root is
    refused. A field Kubernetes lacks is refused here, naming it."""

    run_as_non_root: Literal[True] = Field(True, description="Always true: the operator never runs as root.")
    run_as_user: int = Field(65532, ge=1, description="UID of the operator process (not 0).")
    run_as_group: int = Field(65532, ge=1, description="GID of the operator process (not 0).")
    fs_group: int = Field(65532, ge=1, description="Group owning the mounted volumes.")
    seccomp_profile: SeccompProfile = Field(default_factory=SeccompProfile, description="Pod seccomp profile.")
    fs_group_change_policy: Literal["Always", "OnRootMismatch"] | None = Field(
        None, description="When volume ownership is changed to fsGroup (unset: Kubernetes' default, Always).")
    supplemental_groups: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="Extra GIDs of the operator process (e.g. a group that may read a mounted CA).")
    supplemental_groups_policy: Literal["Merge", "Strict"] | None = Field(
        None, description="Whether the image's /etc/group memberships are added (Merge) or not (Strict).")
    sysctls: list[dict[str, str]] | None = Field(None, description="Namespaced sysctls (`{name, value}` each).")
    se_linux_options: dict[str, str] | None = Field(None, description="SELinux context (user, role, type, level).")
    se_linux_change_policy: Literal["MountOption", "Recursive"] | None = Field(
        None, description="How volumes get their SELinux label.")
    app_armor_profile: dict[str, str] | None = Field(None, description="AppArmor profile (type, localhostProfile).")


class ContainerSecurity(_Values):
    read_only_root_filesystem: bool = Field(
        True, description="Mount the root filesystem read-only; the webhook certificate and temp files go to emptyDirs.")


class IssuerRef(_Values):
    name: str = Field("", pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$",
                      description="An existing cert-manager Issuer or ClusterIssuer; empty: the chart makes a "
                                  "self-signed CA and an Issuer of its own in the release's namespace.")
    kind: Literal["Issuer", "ClusterIssuer"] = Field("Issuer", description="Kind of the issuer named in `name`.")
    group: str = Field("cert-manager.io", min_length=1, description="API group of the issuer.")


class CertManager(_Values):
    enabled: bool = Field(False, description="cert-manager issues the webhook's serving certificate (a Certificate "
                                              "writing the chart's Secret) and its CA injector keeps the "
                                              "configuration's caBundle; the operator only reads the Secret. Needs "
                                              "cert-manager in the cluster.")
    issuer_ref: IssuerRef = Field(default_factory=IssuerRef, description="The issuer that signs the certificate.")
    duration: str = Field("8760h", pattern=r"^[0-9]+h$", description="Lifetime of the serving certificate (hours).")
    renew_before: str = Field("720h", pattern=r"^[0-9]+h$", description="Renew this long before it expires (hours).")


class Webhook(_Values):
    port: int = Field(9443, ge=1024, le=65535,
                      description="Admission webhook port, in the pod and on the Service. The CA and serving "
                                  "certificate are made by the operator into the chart's (empty) Secret, shared "
                                  "by all replicas and renewed before they expire (or by cert-manager, below).")
    failure_policy: Literal["Fail", "Ignore"] = Field(
        "Fail", description="What the apiserver does when no replica answers. `Fail`: HiSparseDeployments cannot be "
                            "created or changed until one does (deletes are not intercepted; running fleets keep "
                            "serving). `Ignore`: they are stored unvalidated and the reconciler refuses a bad spec "
                            "with ConfigValid=False, rendering nothing.")
    cert_manager: CertManager = Field(default_factory=CertManager, description="Certificates from cert-manager.")


class Metrics(_Values):
    port: int = Field(8080, ge=1024, le=65535, description="Prometheus metrics port, in the pod and on the Service.")


class Liveness(_Values):
    port: int = Field(8081, ge=1024, le=65535, description="kopf's liveness endpoint (/healthz) port.")
    startup_seconds: int = Field(
        300, ge=30, le=3600,
        description="How long a starting operator has to answer /healthz before the liveness probe applies "
                    "(a startupProbe). kopf serves /healthz only after its startup handlers ran; on a busy node "
                    "the operator's 100m CPU request makes imports and the first node list take tens of "
                    "seconds, and a liveness probe that counted them restarted it into CrashLoopBackOff.")


class Peering(_Values):
    name: str = Field("", max_length=253, pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$",
                      description="ClusterKopfPeering the replicas coordinate through, so one handles events at a "
                                  "time; created and used only when replicas > 1. Empty: the release's fullname "
                                  "(the object is cluster-scoped, so two releases must not share one).")
    lifetime_seconds: int = Field(60, ge=2, le=3600,
                                  description="Seconds a replica that stops renewing keeps its place: how long the "
                                              "others wait before taking over after a crash.")


class ServiceAccount(_Values):
    create: bool = Field(True, description="Create the ServiceAccount the operator runs as. Off: `name` must name "
                                           "an existing one in the release's namespace; the chart's roles are bound "
                                           "to it either way.")
    name: str = Field("", max_length=253, pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$",
                      description="Its name; empty: the release's fullname (only while `create` is on).")
    annotations: Annotations = Field(default_factory=dict,
                                     description="Annotations of the created ServiceAccount (e.g. a cloud IAM role).")


class EnvVar(_Values):
    name: str = Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Variable name.")
    value: str | None = Field(None, description="Its value (a string: quote numbers).")
    value_from: dict[str, Any] | None = Field(None, description="A Kubernetes EnvVarSource (secretKeyRef, fieldRef, ...).")


class NetworkPolicy(_Values):
    enabled: bool = Field(False, description="A NetworkPolicy on the operator pods: ingress only to the webhook and "
                                             "metrics ports, from the peers below. Egress is left open: the "
                                             "apiserver's address differs per cluster.")
    webhook_from: list[dict[str, Any]] = Field(
        default_factory=list, description="NetworkPolicyPeers allowed to the webhook port; empty: any source (the "
                                          "kube-apiserver calls it, often from the host network).")
    metrics_from: list[dict[str, Any]] = Field(
        default_factory=list, description="NetworkPolicyPeers allowed to the metrics port, e.g. Prometheus's "
                                          "namespace; empty: any source.")


class Rbac(_Values):
    aggregate_cluster_roles: bool = Field(
        True, description="ClusterRoles that add HiSparseDeployments to Kubernetes' built-in roles: read to `view`, "
                          "read and write to `edit` and `admin` (so a namespace's editors can deploy).")


class Retry(_Values):
    base_seconds: float = Field(1.0, gt=0, le=60, description="First delay before a failed reconcile is retried.")
    max_seconds: float = Field(60.0, gt=0, le=3600,
                               description="Longest delay between retries (the delay doubles up to it; not below "
                                           "baseSeconds).")


class PodDisruptionBudget(_Values):
    enabled: bool = Field(True, description="A PodDisruptionBudget keeping `minAvailable` replicas through voluntary "
                                            "disruptions (node drains); rendered only with more than one replica.")
    min_available: int = Field(1, ge=1, description="Replicas kept up: one serves the webhook and reconciles.")


class ServiceMonitor(_Values):
    enabled: bool = Field(False, description="A Prometheus Operator ServiceMonitor scraping the operator's metrics.")
    interval: str = Field("30s", pattern=r"^[0-9]+(ms|s|m)$", description="Scrape interval.")
    labels: dict[str, str] = Field(default_factory=dict,
                                   description="Extra labels, e.g. the `release` a Prometheus selects monitors by.")


def _alert_exprs() -> dict[str, str]:
    """The alerts of ``charts/hisparse/files/alerts.yaml`` (the one place they are defined): name -> expr."""
    import yaml

    doc = yaml.safe_load((CHART_DIR / "files" / "alerts.yaml").read_text())
    return {r["alert"]: str(r["expr"]) for g in doc["groups"] for r in g["rules"] if "alert" in r}


ALERT_EXPRS: Final = _alert_exprs()
ALERT_NAMES: Final = tuple(ALERT_EXPRS)
LABEL_NAME: Final = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
THRESHOLD: Final = r"(>=|<=|>|<)\s*[-+]?[0-9.]+(e[-+]?[0-9]+)?\s*$"
"""An expression's final ordering comparison with a constant: its threshold, which ``threshold`` replaces
(the chart's template applies this same pattern with ``regexReplaceAll``). An alert that ends in ``==``
(none ready, a count at 0) has no threshold to tune."""


def tunable(expr: str) -> bool:
    import re

    return re.search(THRESHOLD, expr.strip()) is not None


class AlertSettings(_Values):
    enabled: bool = Field(True, description="Off: the alert is left out of the PrometheusRule.")
    severity: Literal["critical", "warning", "info"] | None = Field(
        None, description="The alert's severity label instead of the shipped one (unset: the shipped one).")
    for_: str | None = Field(None, alias="for", pattern=r"^([0-9]+(ms|s|m|h|d|w|y))+$",
                             description="How long the condition must hold before the alert fires, instead of "
                                         "the shipped `for` (e.g. `30m`; `0s`: at once).")


class TunableAlertSettings(AlertSettings):
    # A string too: `helm --set` passes 0.8 as the string "0.8" (only integers become numbers).
    threshold: float | Annotated[str, StringConstraints(pattern=r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)(e[-+]?[0-9]+)?$")] | None = Field(
        None, description="The constant the alert's expression compares with, instead of the shipped one (see "
                          "charts/hisparse/files/alerts.yaml and the alert's runbook for its unit).")


def _alerts_model() -> type[_Values]:
    """One optional field per alert, so an unknown name, or a threshold for an alert without one, is refused
    by the schema with the key named."""
    from pydantic import create_model

    fields: dict[str, Any] = {
        name: ((TunableAlertSettings if tunable(expr) else AlertSettings) | None, Field(
            None, alias=name, description=f"{name} (docs/runbooks/{name}.md)" + (
                "; its threshold can be changed" if tunable(expr) else "")))
        for name, expr in ALERT_EXPRS.items()}
    return create_model("Alerts", __base__=_Values, **fields)


Alerts = _alerts_model()


class PrometheusRule(_Values):
    enabled: bool = Field(False, description="A PrometheusRule with the operator's and the fleets' alerts "
                                             "(charts/hisparse/files/alerts.yaml).")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels the Prometheus selects rules by.")
    alerts: Alerts = Field(  # type: ignore[valid-type]
        default_factory=Alerts, description="Per alert, by name: turn it off, change its severity or `for`, or its "
                                            "threshold where its expression ends in one. Unknown names are refused.")
    additional_rule_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels added to every alert (e.g. a team for Alertmanager's routes); a "
                                          "label the alert sets itself keeps its value (severity: see alerts).",
        json_schema_extra={"propertyNames": {"pattern": LABEL_NAME}})
    runbook_base_url: str = Field(
        "https://github.com/hisparse/hisparse/blob/main/docs/runbooks/", pattern=r"^https?://\S+/$", max_length=512,
        alias="runbookBaseURL",
        description="Each alert's runbook_url is this followed by `<alert>.md` (the pages are docs/runbooks/ of this "
                    "repository; point it at your own copy).")


class Dashboards(_Values):
    enabled: bool = Field(False, description="A ConfigMap holding the Grafana dashboard, for Grafana's sidecar.")
    labels: dict[str, str] = Field(default_factory=lambda: {"grafana_dashboard": "1"},
                                   description="Labels Grafana's dashboard sidecar selects ConfigMaps by.")
    namespace: str = Field("", description="Namespace of the ConfigMap (the sidecar's); empty: the release's.")


class Monitoring(_Values):
    service_monitor: ServiceMonitor = Field(default_factory=ServiceMonitor, description="Operator scrape.")
    prometheus_rule: PrometheusRule = Field(default_factory=PrometheusRule, description="Alerts.")
    dashboards: Dashboards = Field(default_factory=Dashboards, description="Grafana dashboard.")


class Crds(_Values):
    install: bool = Field(True, description="Install and upgrade the HiSparseDeployment CRD with the release (it is "
                                            "a template, so `helm upgrade` upgrades it too; Helm leaves `crds/` alone).")
    keep: bool = Field(True, description="Keep the CRD on `helm uninstall` (`helm.sh/resource-policy: keep`): deleting "
                                         "it would delete every HiSparseDeployment and with it every fleet.")


class ParityJudge(_Values):
    image: str = Field("", max_length=512, pattern=r"^([^\s]+)?$",
                       description="Image every canary's parity Job runs (it must hold a `hisparse-runtime` of this "
                                   "operator's version). Empty: the stable revision's runtime image, never the "
                                   "candidate's.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="Pull policy of `image`.")


class ChartValues(_Values):
    """Values of the ``hisparse`` chart (``charts/hisparse/values.yaml`` holds the defaults)."""

    global_: dict[str, Any] = Field(
        default_factory=dict, alias="global",
        description="Values an umbrella chart shares with every subchart (Helm passes `global` to each); this chart "
                    "reads none of them, and accepts them so it can be a dependency.")
    name_override: str = Field("", max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$",
                               description="Replaces the chart's name in object names and in the "
                                           "`app.kubernetes.io/name` label.")
    fullname_override: str = Field("", max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$",
                                   description="Name of the objects in the release's namespace (default: "
                                               "`<release>-<name>`). Objects outside it are named "
                                               "`<namespace>-<fullname>`.")
    common_labels: Labels = Field(default_factory=dict,
                                  description="Labels added to every object the chart makes (the chart's own "
                                              "`app.kubernetes.io/*` and `helm.sh/chart` keep their values).")
    image: Image = Field(default_factory=Image, description="Operator image.")
    image_pull_secrets: list[str] = Field(default_factory=list,
                                          description="Names of existing image pull Secrets (the chart creates none).")
    replicas: int = Field(2, ge=1, le=5,
                          description="Operator replicas. Every replica serves the webhook; with more than one, kopf "
                                      "peering lets one reconcile at a time and the others take over. Two (the default) "
                                      "keep HiSparseDeployments writable while one pod restarts or drains.")
    priority_class_name: str = Field("", description="PriorityClass of the operator pods (e.g. system-cluster-critical "
                                                     "where policy allows); empty: the cluster's default.")
    pod_disruption_budget: PodDisruptionBudget = Field(default_factory=PodDisruptionBudget,
                                                       description="PodDisruptionBudget of the operator pods.")
    resources: Resources = Field(default_factory=Resources, description="Operator container resources.")
    pod_annotations: Annotations = Field(default_factory=dict, description="Annotations of the operator pods.")
    pod_labels: Labels = Field(default_factory=dict, description="Labels of the operator pods (the chart's own keep "
                                                                 "their values: the Deployment selects by them).")
    extra_env: list[EnvVar] = Field(
        default_factory=list, description="Environment variables added to the operator container, e.g. a proxy or "
                                          "one of the operator's settings the chart has no value for "
                                          "(HISPARSE_WEBHOOK_CERT_DAYS). A variable the chart sets itself is "
                                          "refused: set its value instead.")
    service_account: ServiceAccount = Field(default_factory=ServiceAccount,
                                            description="The ServiceAccount the operator runs as.")
    rbac: Rbac = Field(default_factory=Rbac, description="RBAC objects beyond the operator's own.")
    network_policy: NetworkPolicy = Field(default_factory=NetworkPolicy, description="NetworkPolicy of the operator pods.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Pod tolerations.")
    affinity: dict[str, Any] = Field(default_factory=dict, description="Pod affinity.")
    pod_security_context: PodSecurityContext = Field(default_factory=PodSecurityContext,
                                                     description="Pod securityContext (always non-root).")
    security_context: ContainerSecurity = Field(
        default_factory=ContainerSecurity,
        description="Container securityContext choices; privilege escalation is always off and every capability dropped.")
    webhook: Webhook = Field(default_factory=Webhook, description="Admission webhook.")
    metrics: Metrics = Field(default_factory=Metrics, description="Prometheus metrics.")
    liveness: Liveness = Field(default_factory=Liveness, description="Liveness probe.")
    peering: Peering = Field(default_factory=Peering, description="kopf peering, used when replicas > 1.")
    watch_namespaces: list[Namespace] = Field(
        default_factory=list, json_schema_extra={"uniqueItems": True},
        description="Namespaces this release manages (exact names; they need not exist yet): the operator watches "
                    "only them, every namespaced permission is a Role in each of them instead of a ClusterRole, and "
                    "the webhook admits only them. Empty: every namespace, with a ClusterRole. A namespace is managed "
                    "by one release: an install that claims one another release claims (or any, beside a release of "
                    "every namespace) is refused.")
    single_namespace: bool = Field(
        False, description="Manage only the release's namespace: watchNamespaces with that one namespace. Cluster-scoped "
                           "reads stay in a small ClusterRole (nodes, CRDs, namespaces; the named webhook configuration "
                           "unless cert-manager injects its CA; the peering object with replicas > 1). Excludes "
                           "watchNamespaces.")
    monitoring: Monitoring = Field(default_factory=Monitoring, description="Prometheus Operator and Grafana objects.")
    crds: Crds = Field(default_factory=Crds, description="The HiSparseDeployment CRD's lifecycle.")
    resync_seconds: int = Field(300, ge=10, le=3600,
                                description="Seconds between kopf's full re-lists (the resync that catches missed events).")
    workers: int = Field(8, ge=1, le=64, description="Reconcile threads (the admission webhook has threads of its own).")
    upgrade_canaries: int = Field(
        1, ge=0, le=10000,
        description="How many deployments at once canary the operator's rendering of a stable revision an earlier "
                    "operator rendered otherwise (after an upgrade that changes rendered pods); the others keep their "
                    "stable fleet as it runs and wait (condition reason `UpgradeQueued`). 0: no limit.")
    retry: Retry = Field(default_factory=Retry, description="Backoff of a reconcile that failed (per deployment).")
    prometheus_url: str = Field("", pattern=r"^(https?://.*)?$", max_length=512,
                                description="Prometheus that canary analysis steps query unless a step names one (empty: none).")
    parity: ParityJudge = Field(default_factory=ParityJudge, description="The canary parity gate's judge.")


def values_schema() -> dict[str, Any]:
    schema = ChartValues.model_json_schema(by_alias=True, mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def values_schema_json() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


def generated_files() -> dict[str, Callable[[], str]]:
    """Chart-relative path -> the function that produces its exact text."""
    from .controller.webhook import chart_template
    from .crd import CRD_FILE, crd_yaml
    from .rbac import cluster_role_template, role_template, watched_roles_template

    return {
        "values.schema.json": values_schema_json,
        "templates/clusterrole.yaml": cluster_role_template,
        "templates/role.yaml": role_template,
        "templates/watched-roles.yaml": watched_roles_template,
        "templates/validatingwebhookconfiguration.yaml": chart_template,
        f"files/crds/{CRD_FILE}": crd_yaml,
    }


def stale_files(chart_dir: Path = CHART_DIR) -> list[str]:
    """Generated files that are missing or differ from what the code produces."""
    out = []
    for rel, make in generated_files().items():
        path = chart_dir / rel
        if not path.is_file() or path.read_text() != make():
            out.append(rel)
    return out


def write(chart_dir: Path = CHART_DIR) -> list[str]:
    """Rewrite every generated file in ``chart_dir``; returns the ones that changed."""
    changed = stale_files(chart_dir)
    for rel, make in generated_files().items():
        path = chart_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(make())
    return changed


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else CHART_DIR
    for rel in write(target):
        print(f"updated {target / rel}")
