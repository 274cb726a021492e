"""The ValidatingWebhookConfiguration: defined once here, for the chart and for the operator.

Two ways the apiserver reaches the webhook:

- **service** (the chart: the operator runs in the cluster, replicas behind one Service): the chart owns
  the configuration, so ``helm uninstall`` removes it; every replica only keeps its ``caBundle`` equal
  to the CA bundle in the shared certificate Secret.
- **url** (``hisparse dev``: one operator process on the developer's machine, reached on loopback): the
  operator applies the whole configuration itself and deletes it when it stops, so a stopped dev
  operator does not block writes.

kopf's own ``settings.admission.managed`` is not used: it empties the configuration whenever one
replica stops, which would switch validation off for the replicas still running.
"""

from __future__ import annotations

import base64
import logging
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from ..api import labels as L
from .kube import Kube

log = logging.getLogger("hisparse.operator")

CONFIGURATION: Final = f"{L.PLURAL}.{L.GROUP}"
"""Default name of the ValidatingWebhookConfiguration (``HISPARSE_WEBHOOK_CONFIGURATION``; the chart prefixes
it with the release's name, since the object is cluster-scoped)."""
HANDLER_ID: Final = "validate"
"""kopf's id of the validating handler; kopf serves each handler at ``/<id>``."""
PATH: Final = f"/{HANDLER_ID}"
WEBHOOK: Final = f"{HANDLER_ID}.{CONFIGURATION}"
OPERATIONS: Final = ("CREATE", "UPDATE")
TIMEOUT_SECONDS: Final = 10
API_VERSION: Final = "admissionregistration.k8s.io/v1"
KIND: Final = "ValidatingWebhookConfiguration"
NAMESPACE_LABEL: Final = "kubernetes.io/metadata.name"
"""The label the apiserver sets on every Namespace to its name: what a namespaceSelector over names selects by."""


class ServiceRef(BaseModel):
    """Where the apiserver sends admission requests in the cluster."""

    model_config = ConfigDict(frozen=True)

    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)


class Endpoint(BaseModel):
    """How the apiserver reaches this operator's webhook server."""

    model_config = ConfigDict(frozen=True)

    mode: Literal["service", "url"]
    service: ServiceRef | None = None
    url: str | None = None

    @classmethod
    def for_service(cls, namespace: str, name: str, port: int) -> Endpoint:
        return cls(mode="service", service=ServiceRef(namespace=namespace, name=name, port=port))

    @classmethod
    def for_url(cls, host: str, port: int) -> Endpoint:
        netloc = f"[{host}]" if ":" in host else host
        return cls(mode="url", url=f"https://{netloc}:{port}{PATH}")

    def client_config(self, ca_bundle: bytes | None = None) -> dict[str, Any]:
        if self.service is not None:
            out: dict[str, Any] = {"service": {**self.service.model_dump(), "path": PATH}}
        else:
            out = {"url": self.url}
        if ca_bundle:
            out["caBundle"] = base64.b64encode(ca_bundle).decode()
        return out


FAILURE_POLICY: Final = "Fail"
"""Fail closed: while no replica answers, HiSparseDeployments cannot be created or changed (deletes are not
intercepted, and running fleets keep serving); nothing unvalidated is stored. The reconciler re-checks every
spec anyway, so ``Ignore`` (the chart's ``webhook.failurePolicy``) trades the early refusal for availability."""


def configuration(client_config: dict[str, Any], labels: dict[str, str] | None = None,
                  name: str = CONFIGURATION) -> dict[str, Any]:
    """The whole ValidatingWebhookConfiguration for ``client_config``."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, **({"labels": labels} if labels else {})},
        "webhooks": [{
            "name": WEBHOOK,
            "clientConfig": client_config,
            "rules": [{"apiGroups": [L.GROUP], "apiVersions": [L.VERSION], "resources": [L.PLURAL],
                       "operations": list(OPERATIONS), "scope": "Namespaced"}],
            "failurePolicy": FAILURE_POLICY,
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": TIMEOUT_SECONDS,
        }],
    }


CHART_CONFIGURATION: Final = '{{ include "hisparse.webhookConfiguration" . }}'
"""The chart's name for the configuration (a Helm expression: release-unique)."""


def chart_template() -> str:
    """``charts/hisparse/templates/validatingwebhookconfiguration.yaml``: the configuration above with the
    chart's Service. The operator fills in ``caBundle``, or cert-manager's CA injector does (the annotation);
    a release that names its namespaces (``watchNamespaces``, ``singleNamespace``) has a namespaceSelector over
    exactly those."""
    marks = {"__NAMESPACE__": "{{ .Release.Namespace }}", "__NAME__": '{{ include "hisparse.fullname" . }}',
             "__PORT__": "{{ .Values.webhook.port }}", "__CONFIGURATION__": CHART_CONFIGURATION,
             "__POLICY__": "{{ .Values.webhook.failurePolicy }}"}
    obj = configuration({"service": {"namespace": "__NAMESPACE__", "name": "__NAME__", "port": "__PORT__", "path": PATH}},
                        name="__CONFIGURATION__")
    obj["webhooks"][0]["failurePolicy"] = "__POLICY__"
    body = yaml.safe_dump(obj, sort_keys=False, width=4096)
    body = body.replace("  name: __CONFIGURATION__\n", "  name: __CONFIGURATION__\n"
                        '  labels:\n    {{- include "hisparse.labels" . | nindent 4 }}\n'
                        "  {{- if .Values.webhook.certManager.enabled }}\n"
                        "  annotations:\n"
                        '    cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "hisparse.certificate" . }}\n'
                        "  {{- end }}\n", 1)
    # The namespaces the release manages, and no other: admission follows what the operator reconciles.
    # Other releases read this selector as this release's claim (the chart's templates/ownership.yaml).
    body = body.replace("  matchPolicy: Equivalent\n", "  matchPolicy: Equivalent\n"
                        '  {{- with include "hisparse.watched" . | fromJsonArray }}\n'
                        "  namespaceSelector:\n"
                        "    matchExpressions:\n"
                        f"    - key: {NAMESPACE_LABEL}\n"
                        "      operator: In\n"
                        "      values: {{ toJson . }}\n"
                        "  {{- end }}\n", 1)
    for mark, helm in marks.items():
        body = body.replace(mark, helm)
    return ("# Generated from hisparse_operator.controller.webhook by `python -m hisparse_operator.chart_values`. Do not edit.\n"
            "# The chart owns this object (uninstall removes it); the operator (or cert-manager) patches only caBundle.\n" + body)


class WebhookError(RuntimeError):
    """The webhook configuration cannot be brought in line; the message says what is missing."""


def _ca_bundle(live: dict[str, Any]) -> bytes | None:
    for hook in live.get("webhooks") or []:
        if hook.get("name") == WEBHOOK:
            raw = (hook.get("clientConfig") or {}).get("caBundle")
            return base64.b64decode(raw) if raw else None
    return None


class Registration:
    """Keeps the cluster's configuration pointing at ``endpoint`` with the Secret's CA bundle."""

    def __init__(self, kube: Kube, endpoint: Endpoint, name: str = CONFIGURATION, inject_ca: bool = True) -> None:
        self.kube, self.endpoint, self.name, self.inject_ca = kube, endpoint, name, inject_ca

    def sync(self, ca_bundle: bytes) -> bool:
        """Write only what differs; True when something was written. With ``inject_ca`` off (cert-manager's
        injector owns the caBundle) nothing is written in service mode."""
        if self.endpoint.mode == "service" and not self.inject_ca:
            return False
        live = self.kube.get(API_VERSION, KIND, None, self.name)
        if self.endpoint.mode == "url":
            desired = configuration(self.endpoint.client_config(ca_bundle),
                                    labels={L.APP_NAME: L.APP_NAME_VALUE, L.APP_MANAGED_BY: L.FIELD_MANAGER}, name=self.name)
            hooks = (live or {}).get("webhooks") or []
            if live is not None and len(hooks) == 1 and hooks[0].get("clientConfig") == desired["webhooks"][0]["clientConfig"]:
                return False
            self.kube.apply(desired)
            log.info("webhook configuration %s points at %s", self.name, self.endpoint.url)
            return True
        if live is None:
            raise WebhookError(f"ValidatingWebhookConfiguration {self.name} is missing: the chart installs it "
                               "(helm upgrade --install restores it)")
        if _ca_bundle(live) == ca_bundle:
            return False
        # Strategic merge on the list keyed by name: only this webhook's caBundle changes.
        patch = {"webhooks": [{"name": WEBHOOK, "clientConfig": {"caBundle": base64.b64encode(ca_bundle).decode()}}]}
        self.kube.patch(API_VERSION, KIND, None, self.name, patch, "application/strategic-merge-patch+json")
        log.info("webhook configuration %s: caBundle updated from the certificate Secret", self.name)
        return True

    def withdraw(self) -> None:
        """URL mode only: delete the configuration this process applied."""
        if self.endpoint.mode == "url":
            self.kube.delete(API_VERSION, KIND, None, self.name)
