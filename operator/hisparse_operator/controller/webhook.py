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
"""Name of the ValidatingWebhookConfiguration (cluster-scoped: one operator per cluster)."""
HANDLER_ID: Final = "validate"
"""kopf's id of the validating handler; kopf serves each handler at ``/<id>``."""
PATH: Final = f"/{HANDLER_ID}"
WEBHOOK: Final = f"{HANDLER_ID}.{CONFIGURATION}"
OPERATIONS: Final = ("CREATE", "UPDATE")
TIMEOUT_SECONDS: Final = 10
API_VERSION: Final = "admissionregistration.k8s.io/v1"
KIND: Final = "ValidatingWebhookConfiguration"


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


def configuration(client_config: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The whole ValidatingWebhookConfiguration for ``client_config``."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": CONFIGURATION, **({"labels": labels} if labels else {})},
        "webhooks": [{
            "name": WEBHOOK,
            "clientConfig": client_config,
            "rules": [{"apiGroups": [L.GROUP], "apiVersions": [L.VERSION], "resources": [L.PLURAL],
                       "operations": list(OPERATIONS), "scope": "Namespaced"}],
            # Fail closed: without the webhook nothing unvalidated is stored (the reconciler re-checks anyway).
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": TIMEOUT_SECONDS,
        }],
    }


def chart_template() -> str:
    """``charts/hisparse/templates/validatingwebhookconfiguration.yaml``: the configuration above with the
    chart's Service; the operator fills in ``caBundle``."""
    marks = {"__NAMESPACE__": "{{ .Release.Namespace }}", "__NAME__": '{{ include "hisparse.fullname" . }}',
             "__PORT__": "{{ .Values.webhook.port }}"}
    obj = configuration({"service": {"namespace": "__NAMESPACE__", "name": "__NAME__", "port": "__PORT__", "path": PATH}})
    body = yaml.safe_dump(obj, sort_keys=False, width=4096)
    body = body.replace(f"  name: {CONFIGURATION}\n",
                        f'  name: {CONFIGURATION}\n  labels:\n    {{{{- include "hisparse.labels" . | nindent 4 }}}}\n', 1)
    for mark, helm in marks.items():
        body = body.replace(mark, helm)
    return ("# Generated from hisparse_operator.controller.webhook by `python -m hisparse_operator.chart_values`. Do not edit.\n"
            "# The chart owns this object (uninstall removes it); each operator replica patches only caBundle.\n" + body)


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

    def __init__(self, kube: Kube, endpoint: Endpoint) -> None:
        self.kube, self.endpoint = kube, endpoint

    def sync(self, ca_bundle: bytes) -> bool:
        """Write only what differs; True when something was written."""
        live = self.kube.get(API_VERSION, KIND, None, CONFIGURATION)
        if self.endpoint.mode == "url":
            desired = configuration(self.endpoint.client_config(ca_bundle),
                                    labels={L.APP_NAME: L.APP_NAME_VALUE, L.APP_MANAGED_BY: L.FIELD_MANAGER})
            hooks = (live or {}).get("webhooks") or []
            if live is not None and len(hooks) == 1 and hooks[0].get("clientConfig") == desired["webhooks"][0]["clientConfig"]:
                return False
            self.kube.apply(desired)
            log.info("webhook configuration %s points at %s", CONFIGURATION, self.endpoint.url)
            return True
        if live is None:
            raise WebhookError(f"ValidatingWebhookConfiguration {CONFIGURATION} is missing: the chart installs it "
                               "(helm upgrade --install restores it)")
        if _ca_bundle(live) == ca_bundle:
            return False
        # Strategic merge on the list keyed by name: only this webhook's caBundle changes.
        patch = {"webhooks": [{"name": WEBHOOK, "clientConfig": {"caBundle": base64.b64encode(ca_bundle).decode()}}]}
        self.kube.patch(API_VERSION, KIND, None, CONFIGURATION, patch, "application/strategic-merge-patch+json")
        log.info("webhook configuration %s: caBundle updated from the certificate Secret", CONFIGURATION)
        return True

    def withdraw(self) -> None:
        """URL mode only: delete the configuration this process applied."""
        if self.endpoint.mode == "url":
            self.kube.delete(API_VERSION, KIND, None, CONFIGURATION)
