"""The operator's ClusterRole and Role rules, from one place.

The kinds it applies, prunes and watches come from :data:`controller.kube.CHILD_KINDS`; everything else
is listed here with the call that needs it. The chart's ``templates/clusterrole.yaml`` and
``templates/role.yaml`` are generated from this module (``python -m hisparse_operator.chart_values``) and a
test fails when they are stale.

What each verb is for:

- children: ``get``/``list`` (observe and prune), ``watch`` (kopf drift events), ``patch`` and ``create``
  (server-side apply; an apply that creates is also authorized as ``create``), ``delete`` (prune).
  No ``update``: every write is an apply.
- ``pods``, ``inferenceobjectives``, ``inferencemodelrewrites``: the Roles the operator renders for the
  EPP and the decode sidecar grant them, and Kubernetes lets a subject create a Role (or bind one) only
  with permissions it holds itself. Holding these few read verbs is narrower than the alternative
  (``escalate``/``bind`` on roles). The operator itself only lists the pods of a finished parity Job,
  to read the summary each leaves as its termination message.
- ``pods/log`` ``get``: the full parity report a finished parity Job's pod printed, read once per Job
  into the ``<name>-parity-report`` ConfigMap (the termination message holds 4 KiB, the summary). Read
  only: the alternative, letting the Job's pod write the ConfigMap itself, would give a pod that talks to
  serving endpoints a ServiceAccount token with write access to ConfigMaps.
- kopf: ``customresourcedefinitions`` list/watch (it re-scans resources when CRDs change), ``namespaces``
  list/watch (only when it watches named namespaces), core ``events`` create (it and the reconciler post
  Events; both use the core API), and ``clusterkopfpeerings`` list/watch/patch when peering is on
  (replicas > 1).
- the webhook: get and patch of the one ValidatingWebhookConfiguration the chart installs (each replica
  keeps its ``caBundle`` current); no create, since the chart owns it.
- the webhook certificate: a namespaced Role in the operator's namespace, get and update of the one Secret
  the chart creates empty (the replicas fill and renew it at the version they read), and ``create`` so a
  deleted Secret is made again (RBAC cannot limit ``create`` to a name, so this one verb covers any
  Secret name in the operator's own namespace; nothing there can be read but this Secret). No
  cluster-wide Secret access. With cert-manager issuing the certificate (``webhook.certManager.enabled``),
  only ``get`` of that Secret, and no webhook configuration access at all: cert-manager's CA injector keeps
  the ``caBundle``.

Scoped releases (the chart's ``watchNamespaces``, or ``singleNamespace`` for the release's own): every
rule on a namespaced resource moves from the ClusterRole into a Role in each watched namespace, the only
namespaces the operator then watches. The ClusterRole keeps only what Kubernetes serves cluster-scoped
(node facts, CRDs, namespaces, the one webhook configuration, the peering object), all of it read-only or
limited by name but for kopf's peering.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from .api import labels as L
from .controller.kube import CHILD_KINDS
from .controller.webhook import CONFIGURATION as WEBHOOK_CONFIGURATION

When = Literal["always", "scoped", "peering", "operator-certs"]
"""When a rule is needed: always, only when the operator watches named namespaces, only with peering, only
when the operator (not cert-manager) makes the webhook certificate."""
Scope = Literal["cluster", "namespace"]
"""Where the resource lives: cluster-scoped rules need a ClusterRole; namespaced ones can be a Role."""

CHILD_VERBS: Final = ("get", "list", "watch", "create", "patch", "delete")
WEBHOOK_RESOURCE: Final = "validatingwebhookconfigurations"
KOPF_GROUP: Final = "kopf.dev"

# Read access the operator hands on through the Roles it renders (render/routing.py); see the module doc.
DELEGATED: Final = (
    ("", ("pods",)),
    ("inference.networking.k8s.io", ("inferencepools",)),
    ("inference.networking.x-k8s.io", ("inferenceobjectives", "inferencemodelrewrites")),
)
READ: Final = ("get", "list", "watch")

_IRREGULAR_PLURALS: Final = {"Endpoints": "endpoints"}


@dataclass(frozen=True)
class Grant:
    """One PolicyRule and why the operator needs it."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str
    resource_names: tuple[str, ...] = ()
    when: When = "always"
    scope: Scope = "namespace"

    def rule(self) -> dict[str, Any]:
        out: dict[str, Any] = {"apiGroups": list(self.api_groups), "resources": list(self.resources)}
        if self.resource_names:
            out["resourceNames"] = list(self.resource_names)
        out["verbs"] = list(self.verbs)
        return out


def plural(kind: str) -> str:
    """The resource name Kubernetes serves a kind under (its lower-case plural)."""
    if kind in _IRREGULAR_PLURALS:
        return _IRREGULAR_PLURALS[kind]
    low = kind.lower()
    if low.endswith(("s", "x", "ch", "sh")):
        return low + "es"
    if low.endswith("y") and low[-2:-1] not in "aeiou":
        return low[:-1] + "ies"
    return low + "s"


def _merge(pairs: tuple[tuple[str, tuple[str, ...]], ...] | list[tuple[str, tuple[str, ...]]]) -> dict[str, list[str]]:
    """group -> resources, in first-seen order."""
    out: dict[str, list[str]] = {}
    for group, resources in pairs:
        bucket = out.setdefault(group, [])
        bucket += [r for r in resources if r not in bucket]
    return out


def child_resources() -> dict[str, list[str]]:
    """API group -> resources of every kind the operator renders (``CHILD_KINDS``)."""
    return _merge([(api_version.rpartition("/")[0], (plural(kind),)) for api_version, kind in CHILD_KINDS])


def grants(webhook_configuration: str = WEBHOOK_CONFIGURATION) -> list[Grant]:
    """Every rule the operator needs, each with its reason, in a stable order."""
    out = [Grant((group,), tuple(res), CHILD_VERBS, "rendered children: server-side apply, observe, prune, drift watch")
           for group, res in child_resources().items()]
    children = child_resources()
    for group, res in _merge(DELEGATED).items():
        # Verbs already held on a child kind cover the read verbs; ask only for what is missing.
        missing = tuple(r for r in res if r not in children.get(group, []))
        if missing:
            out.append(Grant((group,), missing, READ, "granted onward by the Roles the operator renders"))
    out += [
        Grant((L.GROUP,), (L.PLURAL,), ("get", "list", "watch", "patch"),
              "watch and read HiSparseDeployments; kopf removes its finalizer from objects that carry one"),
        Grant((L.GROUP,), (f"{L.PLURAL}/status",), ("patch",), "the reconciler merge-patches status"),
        Grant(("",), ("pods/log",), ("get",), "the full report a finished parity Job's pod printed, kept in a ConfigMap"),
        Grant(("",), ("nodes",), ("list", "watch"), "node facts (GPU count, host memory) for render and admission",
              scope="cluster"),
        Grant(("",), ("events",), ("create",), "Events from the reconciler and from kopf (core API)"),
        Grant(("apiextensions.k8s.io",), ("customresourcedefinitions",), ("list", "watch"),
              "kopf re-scans the served resources when CRDs change", scope="cluster"),
        Grant(("admissionregistration.k8s.io",), (WEBHOOK_RESOURCE,), ("get", "patch"),
              "keep the caBundle of the chart's webhook configuration equal to the certificate Secret's",
              resource_names=(webhook_configuration,), when="operator-certs", scope="cluster"),
        Grant(("",), ("namespaces",), ("list", "watch"), "kopf resolves the watched namespaces", when="scoped",
              scope="cluster"),
        Grant((KOPF_GROUP,), ("clusterkopfpeerings",), ("list", "watch", "patch"),
              "kopf peering: only one replica handles events at a time", when="peering", scope="cluster"),
    ]
    return out


def namespaced_grants(secret: str, *, external_certs: bool = False) -> list[Grant]:
    """The Role in the operator's own namespace: the webhook certificate Secret named ``secret``."""
    if external_certs:
        return [Grant(("",), ("secrets",), ("get",), "the webhook certificate cert-manager issues: read only",
                      resource_names=(secret,))]
    return [Grant(("",), ("secrets",), ("get", "update"),
                  "the webhook CA and serving certificate all replicas share: read, then filled or renewed "
                  "at the version read", resource_names=(secret,)),
            Grant(("",), ("secrets",), ("create",),
                  "make that Secret again when it was deleted (RBAC cannot limit create to a name)")]


def _on(*, scoped: bool, peering: bool, external_certs: bool) -> dict[When, bool]:
    return {"always": True, "scoped": scoped, "peering": peering, "operator-certs": not external_certs}


def role_rules(secret: str, *, external_certs: bool = False) -> list[dict[str, Any]]:
    """The Role's ``rules`` in the operator's own namespace: the webhook certificate Secret."""
    return [g.rule() for g in namespaced_grants(secret, external_certs=external_certs)]


def watched_role_rules() -> list[dict[str, Any]]:
    """The ``rules`` of the Role in each watched namespace of a scoped release: every namespaced rule."""
    return [g.rule() for g in _watched_grants()]


def _watched_grants() -> list[Grant]:
    out = [g for g in grants() if g.scope == "namespace"]
    assert all(g.when == "always" for g in out), "a conditional namespaced rule needs its condition in the Roles"
    return out


def cluster_role_rules(*, scoped: bool = False, peering: bool = False, external_certs: bool = False) -> list[dict[str, Any]]:
    """The ClusterRole's ``rules``: for an operator of every namespace, all of them; for a scoped one (named
    namespaces) only the cluster-scoped ones, the rest being in :func:`watched_role_rules`."""
    on = _on(scoped=scoped, peering=peering, external_certs=external_certs)
    return [g.rule() for g in grants() if on[g.when] and (g.scope == "cluster" or not scoped)]


HELM_SCOPED: Final = '(include "hisparse.watched" . | fromJsonArray)'
"""True (a non-empty list) when the release names the namespaces it manages (the chart's ``hisparse.watched``)."""
# Helm conditions for the rules that are not always needed; the chart's values decide.
HELM_CONDITIONS: Final[dict[When, str]] = {
    "scoped": HELM_SCOPED,
    "peering": "gt (int .Values.replicas) 1",
    "operator-certs": "not .Values.webhook.certManager.enabled",
}


_HEADER: Final = "# Generated from hisparse_operator.rbac by `python -m hisparse_operator.chart_values`. Do not edit."
HELM_SECRET: Final = '{{ include "hisparse.webhookSecret" . }}'
"""The chart's name for the certificate Secret (a Helm expression)."""
HELM_WEBHOOK_CONFIGURATION: Final = '{{ include "hisparse.webhookConfiguration" . }}'
"""The chart's (release-unique) name for the webhook configuration."""


def _rules_block(items: list[Grant], scope_condition: dict[Scope, str] | None = None) -> list[str]:
    """Rules as template lines; ``scope_condition`` adds a Helm condition per resource scope (``""``: none)."""
    import yaml

    lines = []
    for g in items:
        # One rule per item, lists in flow style: `- apiGroups: [""]`.
        block = yaml.safe_dump([g.rule()], default_flow_style=None, sort_keys=False, width=4096).splitlines()
        body = [f"  # {g.why}", *[f"  {line}" for line in block]]
        conditions = [c for c in (HELM_CONDITIONS.get(g.when, ""), (scope_condition or {}).get(g.scope, "")) if c]
        if not conditions:
            lines += body
        else:
            cond = conditions[0] if len(conditions) == 1 else "and " + " ".join(f"({c})" for c in conditions)
            lines += [f"  {{{{- if {cond} }}}}", *body, "  {{- end }}"]
    return lines


def cluster_role_template() -> str:
    """``charts/hisparse/templates/clusterrole.yaml``: the rules above, conditional ones under Helm ``if``s."""
    lines = [
        _HEADER,
        "apiVersion: rbac.authorization.k8s.io/v1",
        "kind: ClusterRole",
        "metadata:",
        '  name: {{ include "hisparse.clusterName" . }}',
        "  labels:",
        '    {{- include "hisparse.labels" . | nindent 4 }}',
        "rules:",
        *_rules_block(grants(HELM_WEBHOOK_CONFIGURATION), {"namespace": f"not {HELM_SCOPED}"}),
    ]
    return "\n".join(lines) + "\n"


def role_template() -> str:
    """``charts/hisparse/templates/role.yaml``: the chart's Secret in the release's namespace."""
    lines = [
        _HEADER,
        "apiVersion: rbac.authorization.k8s.io/v1",
        "kind: Role",
        "metadata:",
        '  name: {{ include "hisparse.fullname" . }}',
        "  namespace: {{ .Release.Namespace }}",
        "  labels:",
        '    {{- include "hisparse.labels" . | nindent 4 }}',
        "rules:",
        "  {{- if .Values.webhook.certManager.enabled }}",
        *_rules_block(namespaced_grants(HELM_SECRET, external_certs=True)),
        "  {{- else }}",
        *_rules_block(namespaced_grants(HELM_SECRET)),
        "  {{- end }}",
    ]
    return "\n".join(lines) + "\n"


def watched_roles_template() -> str:
    """``charts/hisparse/templates/watched-roles.yaml``: for a scoped release, a Role with every namespaced
    rule and its RoleBinding in each watched namespace. Named with the release's cluster-unique name: the
    namespaces are not the release's own, and may hold another release's objects."""
    lines = [
        _HEADER,
        '{{- range $namespace := include "hisparse.watched" . | fromJsonArray }}',
        "---",
        "apiVersion: rbac.authorization.k8s.io/v1",
        "kind: Role",
        "metadata:",
        '  name: {{ include "hisparse.clusterName" $ }}',
        "  namespace: {{ $namespace }}",
        "  labels:",
        '    {{- include "hisparse.labels" $ | nindent 4 }}',
        "rules:",
        *_rules_block(_watched_grants()),
        "---",
        "apiVersion: rbac.authorization.k8s.io/v1",
        "kind: RoleBinding",
        "metadata:",
        '  name: {{ include "hisparse.clusterName" $ }}',
        "  namespace: {{ $namespace }}",
        "  labels:",
        '    {{- include "hisparse.labels" $ | nindent 4 }}',
        "roleRef:",
        "  apiGroup: rbac.authorization.k8s.io",
        "  kind: Role",
        '  name: {{ include "hisparse.clusterName" $ }}',
        "subjects:",
        "  - kind: ServiceAccount",
        '    name: {{ include "hisparse.serviceAccountName" $ }}',
        "    namespace: {{ $.Release.Namespace }}",
        "{{- end }}",
    ]
    return "\n".join(lines) + "\n"
