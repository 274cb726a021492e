"""``hisparse chart-test``: what the chart's ``helm test`` pod runs against a live release.

Two checks, each of which a Running-but-broken operator fails:

- **webhook**: a TLS handshake with the webhook port, whose certificate must name the Service, then an
  AdmissionReview of a HiSparseDeployment with an empty spec, which the webhook must *refuse* with a
  message (a webhook that allows it, or answers anything else, is not validating);
- **metrics**: the metrics port serves the operator's own series (``hisparse_operator_reconciles_total``).

The certificate is not verified against a CA here (the pod holds none); its names are checked instead,
and the apiserver verifies the chain on every real admission call.
"""

from __future__ import annotations

import http.client
import json
import ssl
import uuid
from dataclasses import dataclass
from typing import Any, Final

from cryptography import x509

from .api import labels as L
from .controller.webhook import PATH as WEBHOOK_PATH

METRIC: Final = "hisparse_operator_reconciles_total"


class ChartTestError(RuntimeError):
    """One check failed; the message says which and what was seen."""


@dataclass(frozen=True)
class Target:
    service: str
    """DNS name of the chart's Service (``<fullname>.<namespace>.svc``): what the certificate must name."""
    webhook_port: int
    metrics_port: int
    address: str | None = None
    """Where to connect (default: ``service``); tests connect to a loopback address."""
    timeout: float = 10.0

    @property
    def host(self) -> str:
        return self.address or self.service


def _review() -> dict[str, Any]:
    uid = str(uuid.uuid4())
    obj = {"apiVersion": L.API_VERSION, "kind": L.KIND, "metadata": {"name": "helm-test", "namespace": "default"},
           "spec": {}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": L.GROUP, "version": L.VERSION, "kind": L.KIND},
        "resource": {"group": L.GROUP, "version": L.VERSION, "resource": L.PLURAL},
        "name": "helm-test", "namespace": "default", "operation": "CREATE",
        "userInfo": {"username": "helm-test"}, "object": obj, "oldObject": None, "dryRun": True}}


def check_webhook(t: Target) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # names checked below; the pod has no CA to verify the chain with
    conn = http.client.HTTPSConnection(t.host, t.webhook_port, timeout=t.timeout, context=ctx)
    try:
        conn.connect()
        der = conn.sock.getpeercert(binary_form=True)  # type: ignore[union-attr]
        if not der:
            raise ChartTestError(f"webhook {t.host}:{t.webhook_port}: no certificate presented")
        cert = x509.load_der_x509_certificate(der)
        try:
            names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        except x509.ExtensionNotFound:
            names = []
        if t.service not in names:
            raise ChartTestError(f"webhook certificate names {names}, not the Service {t.service}: the apiserver "
                                 "would refuse it; check the certificate Secret (or cert-manager's Certificate)")
        review = _review()
        conn.request("POST", WEBHOOK_PATH, body=json.dumps(review), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = resp.read()
    except OSError as e:
        raise ChartTestError(f"webhook {t.host}:{t.webhook_port}: {e}") from e
    finally:
        conn.close()
    if resp.status != 200:
        raise ChartTestError(f"webhook answered HTTP {resp.status}: {body[:300]!r}")
    answer = (json.loads(body) or {}).get("response") or {}
    if answer.get("uid") != review["request"]["uid"]:
        raise ChartTestError(f"webhook answered for uid {answer.get('uid')!r}, not the request's")
    message = (answer.get("status") or {}).get("message") or ""
    if answer.get("allowed") is not False or not message:
        raise ChartTestError(f"webhook allowed a HiSparseDeployment with an empty spec (answer {answer}): it is not "
                             "validating")
    return message


def check_metrics(t: Target) -> None:
    conn = http.client.HTTPConnection(t.host, t.metrics_port, timeout=t.timeout)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        text = resp.read().decode(errors="replace")
    except OSError as e:
        raise ChartTestError(f"metrics {t.host}:{t.metrics_port}: {e}") from e
    finally:
        conn.close()
    if resp.status != 200 or f"# TYPE {METRIC} counter" not in text:
        raise ChartTestError(f"metrics {t.host}:{t.metrics_port} answered HTTP {resp.status} without {METRIC}")


def run(t: Target) -> list[str]:
    """Both checks; the lines to print. Raises :class:`ChartTestError` on the first failure."""
    message = check_webhook(t)
    check_metrics(t)
    first = message.splitlines()[0][:160]
    return [f"webhook {t.service}:{t.webhook_port}: TLS for {t.service}, refused an empty spec: {first}",
            f"metrics {t.service}:{t.metrics_port}: {METRIC} served"]
