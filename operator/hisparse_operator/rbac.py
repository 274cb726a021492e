"""The operator's ClusterRole rules, from one place.

The kinds it applies, prunes and watches come from :data:`controller.kube.CHILD_KINDS`; everything else
is listed here with the call that needs it. The chart's ``templates/clusterrole.yaml`` is generated from
this module (``python -m hisparse_operator.chart_values``) and a test fails when it is stale.

What each verb is for:

- children: ``get``/``list`` (observe and prune), ``watch`` (kopf drift events), ``patch`` and ``create``
  (server-side apply; an apply that creates is also authorized as ``create``), ``delete`` (prune).
  No ``update``: every write is an apply.
- ``pods``, ``inferenceobjectives``, ``inferencemodelrewrites``: never touched by the operator, but the
  Roles it renders for the EPP and the decode sidecar grant them, and Kubernetes lets a subject create
  a Role (or bind one) only with permissions it holds itself. Holding these few read verbs is narrower
  than the alternative (``escalate``/``bind`` on roles).
- kopf: ``customresourcedefinitions`` list/watch (it re-scans resources when CRDs change), ``namespaces``
  list/watch (only when it watches named namespaces), core ``events`` create (it and the reconciler post
  Events; both use the core API), the managed validating and mutating webhook configurations (kopf
  runs a manager for each even when there are no mutating handlers: created if absent, then patched), and ``clusterkopfpeerings`` list/watch/patch when peering is on (replicas > 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from .api import labels as L
from .controller.kube import CHILD_KINDS

When = Literal["always", "namespaced", "peering"]
"""When a rule is needed: always, only when the operator watches named namespaces, only with peering."""

CHILD_VERBS: Final = ("get", "list", "watch", "create", "patch", "delete")
WEBHOOK_CONFIGURATION: Final = f"{L.PLURAL}.{L.GROUP}"
"""The webhook configurations kopf manages (``settings.admission.managed`` in the handlers)."""
WEBHOOK_RESOURCES: Final = ("validatingwebhookconfigurations", "mutatingwebhookconfigurations")
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


def grants() -> list[Grant]:
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
        Grant(("",), ("nodes",), ("list", "watch"), "node facts (GPU count, host memory) for render and admission"),
        Grant(("",), ("events",), ("create",), "Events from the reconciler and from kopf (core API)"),
        Grant(("apiextensions.k8s.io",), ("customresourcedefinitions",), ("list", "watch"),
              "kopf re-scans the served resources when CRDs change"),
        # kopf runs a manager for each admission kind, even without mutating handlers: both get made.
        Grant(("admissionregistration.k8s.io",), WEBHOOK_RESOURCES, ("create",),
              "kopf creates its webhook configurations when absent (create cannot be limited by name)"),
        Grant(("admissionregistration.k8s.io",), WEBHOOK_RESOURCES, ("patch",),
              "kopf points its webhook configurations at the running server",
              resource_names=(WEBHOOK_CONFIGURATION,)),
        Grant(("",), ("namespaces",), ("list", "watch"), "kopf resolves the watched namespaces", when="namespaced"),
        Grant((KOPF_GROUP,), ("clusterkopfpeerings",), ("list", "watch", "patch"),
              "kopf peering: only one replica handles events at a time", when="peering"),
    ]
    return out


def cluster_role_rules(*, namespaced: bool = False, peering: bool = False) -> list[dict[str, Any]]:
    """The ClusterRole's ``rules`` for an operator watching all (or named) namespaces, with or without peering."""
    on = {"always": True, "namespaced": namespaced, "peering": peering}
    return [g.rule() for g in grants() if on[g.when]]


# Helm conditions for the rules that are not always needed; the chart's values decide.
HELM_CONDITIONS: Final[dict[When, str]] = {
    "namespaced": ".Values.watchNamespaces",
    "peering": "gt (int .Values.replicas) 1",
}


def cluster_role_template() -> str:
    """``charts/hisparse/templates/clusterrole.yaml``: the rules above, conditional ones under Helm ``if``s."""
    import yaml

    lines = [
        "# Generated from hisparse_operator.rbac by `python -m hisparse_operator.chart_values`. Do not edit.",
        "apiVersion: rbac.authorization.k8s.io/v1",
        "kind: ClusterRole",
        "metadata:",
        '  name: {{ include "hisparse.fullname" . }}',
        "  labels:",
        '    {{- include "hisparse.labels" . | nindent 4 }}',
        "rules:",
    ]
    for g in grants():
        # One rule per item, lists in flow style: `- apiGroups: [""]`.
        block = yaml.safe_dump([g.rule()], default_flow_style=None, sort_keys=False, width=4096).splitlines()
        body = [f"  # {g.why}", *[f"  {line}" for line in block]]
        if g.when == "always":
            lines += body
        else:
            lines += [f"  {{{{- if {HELM_CONDITIONS[g.when]} }}}}", *body, "  {{- end }}"]
    return "\n".join(lines) + "\n"
