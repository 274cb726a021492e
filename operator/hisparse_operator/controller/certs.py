"""The admission webhook's CA and serving certificate, shared by every replica through one Secret.

Every replica serves the webhook behind one Service, so the apiserver must trust all of them with one
``caBundle``: the CA and serving certificate live in a Secret in the operator's namespace, and each
replica loads its certificate from there. :meth:`CertSecret.ensure` is safe to run from any number of
replicas at once: a Secret that is absent is *created* (two creators: one gets AlreadyExists) and one
that is empty, unreadable or due for renewal is *updated* at the resourceVersion that was read (two
writers: one gets Conflict); the loser re-reads and uses the winner's certificate.

Renewal reuses the CA, so the ``caBundle`` does not change and replicas that still serve the previous
leaf stay trusted. When the CA itself is due, a new CA signs the new leaf and the bundle keeps the
previous CA until it expires, for the same reason.

The certificates come from the control plane's CA code (``hisparse_operator.pki``, ECDSA P-256 with
``cryptography``); kopf's own self-signing extra depends on oscrypto, which fails with OpenSSL 3.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
import os
from pathlib import Path
from collections.abc import Callable
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field

from ..api import labels as L
from ..pki import issue_leaf, make_ca, pem_cert, pem_key

log = logging.getLogger("hisparse.operator")

# Keys of the Secret's data.
CA_BUNDLE: Final = "ca.crt"
"""The CAs the apiserver trusts (the webhook configuration's ``caBundle``): the signing CA first."""
CA_KEY: Final = "ca.key"
TLS_CERT: Final = "tls.crt"
TLS_KEY: Final = "tls.key"
SERVING_FILE: Final = "serving.pem"
"""Certificate and key in one file, replaced atomically, so a reload never pairs a new cert with an old key."""
CA_NAME: Final = "hisparse-webhook-ca"
LEAF_NAME: Final = "hisparse-webhook"
_WRITE_ATTEMPTS: Final = 5


class CertPolicy(BaseModel):
    """How long certificates live and when they are renewed."""

    model_config = ConfigDict(frozen=True)

    validity: dt.timedelta = Field(dt.timedelta(days=365), gt=dt.timedelta(0),
                                   description="Lifetime of a serving certificate (capped at its CA's).")
    ca_validity: dt.timedelta = Field(dt.timedelta(days=3650), gt=dt.timedelta(0), description="Lifetime of a CA.")
    renew_before: dt.timedelta = Field(dt.timedelta(days=30), ge=dt.timedelta(0),
                                       description="Renew a certificate (or CA) when less than this is left.")


class WebhookCert(BaseModel):
    """What the Secret holds, as PEM."""

    model_config = ConfigDict(frozen=True)

    ca_bundle: bytes
    ca_key: bytes
    """Empty when another controller (cert-manager) issues the certificate: the operator never signs."""
    cert: bytes
    key: bytes

    @classmethod
    def from_secret_data(cls, data: dict[str, str] | None) -> WebhookCert | None:
        """None when a key is missing (e.g. the empty Secret the chart creates)."""
        data = data or {}
        keys = (CA_BUNDLE, CA_KEY, TLS_CERT, TLS_KEY)
        if not all(data.get(k) for k in keys):
            return None
        ca_bundle, ca_key, cert, key = (base64.b64decode(data[k]) for k in keys)
        return cls(ca_bundle=ca_bundle, ca_key=ca_key, cert=cert, key=key)

    @classmethod
    def from_tls_secret(cls, data: dict[str, str] | None) -> WebhookCert | None:
        """A ``kubernetes.io/tls`` Secret as cert-manager writes it (``tls.crt``, ``tls.key``, ``ca.crt``);
        None until the certificate is issued."""
        data = data or {}
        if not (data.get(TLS_CERT) and data.get(TLS_KEY)):
            return None
        return cls(ca_bundle=base64.b64decode(data.get(CA_BUNDLE) or ""), ca_key=b"",
                   cert=base64.b64decode(data[TLS_CERT]), key=base64.b64decode(data[TLS_KEY]))

    def secret_data(self) -> dict[str, str]:
        raw = {CA_BUNDLE: self.ca_bundle, CA_KEY: self.ca_key, TLS_CERT: self.cert, TLS_KEY: self.key}
        return {k: base64.b64encode(v).decode() for k, v in raw.items()}

    def not_after(self) -> dt.datetime:
        """When the serving certificate expires (the operator exports it for the expiry alert)."""
        return x509.load_pem_x509_certificate(self.cert).not_valid_after_utc

    def write_serving_file(self, directory: Path) -> Path:
        """``<directory>/serving.pem`` (cert + key), replaced atomically; unchanged content is not rewritten."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / SERVING_FILE
        content = self.cert + self.key
        if path.is_file() and path.read_bytes() == content:
            return path
        tmp = directory / f".{SERVING_FILE}.tmp"
        tmp.write_bytes(content)
        tmp.chmod(0o600)
        os.replace(tmp, path)
        return path


def serving_hosts(*, service: str | None = None, namespace: str | None = None, host: str | None = None) -> list[str]:
    """The names a serving certificate must carry: a Service's DNS names (the apiserver verifies
    ``<service>.<namespace>.svc``), or the one host of a URL."""
    if service:
        if not namespace:
            raise ValueError("a webhook Service needs its namespace")
        return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", f"{service}.{namespace}", service]
    if not host:
        raise ValueError("the webhook needs a Service or a host name")
    return [host]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _names(cert: x509.Certificate) -> set[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(sans.get_values_for_type(x509.DNSName)) | {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}


def renewal_reason(current: WebhookCert | None, hosts: list[str], now: dt.datetime, policy: CertPolicy) -> str | None:
    """Why ``current`` must be replaced, or None when it serves ``hosts`` for a while yet."""
    if current is None:
        return "no certificate yet"
    try:
        cas = x509.load_pem_x509_certificates(current.ca_bundle)
        leaf = x509.load_pem_x509_certificate(current.cert)
        key = serialization.load_pem_private_key(current.key, password=None)
        serialization.load_pem_private_key(current.ca_key, password=None)
    except ValueError as e:
        return f"unreadable: {e}"
    if key.public_key() != leaf.public_key():
        return "the serving key does not match the serving certificate"
    try:
        leaf.verify_directly_issued_by(cas[0])
    except (InvalidSignature, ValueError, TypeError) as e:
        return f"the serving certificate is not signed by the bundle's first CA ({type(e).__name__})"
    if cas[0].not_valid_after_utc - now < policy.renew_before:
        return f"the CA expires at {cas[0].not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"
    if leaf.not_valid_after_utc - now < policy.renew_before:
        return f"the serving certificate expires at {leaf.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"
    missing = [h for h in hosts if h not in _names(leaf)]
    if missing:
        return f"the serving certificate does not name {', '.join(missing)}"
    return None


def renew(current: WebhookCert | None, hosts: list[str], now: dt.datetime, policy: CertPolicy) -> WebhookCert:
    """A new serving certificate for ``hosts``, signed by the current CA while it has time left, else by a
    new CA; the bundle keeps every earlier CA that has not expired."""
    ca_key: ec.EllipticCurvePrivateKey | None = None
    ca_cert: x509.Certificate | None = None
    previous: list[x509.Certificate] = []
    if current is not None:
        try:
            previous = x509.load_pem_x509_certificates(current.ca_bundle)
            loaded = serialization.load_pem_private_key(current.ca_key, password=None)
        except ValueError:
            previous = []
        else:
            if (isinstance(loaded, ec.EllipticCurvePrivateKey) and previous
                    and loaded.public_key() == previous[0].public_key()
                    and previous[0].not_valid_after_utc - now >= policy.renew_before):
                ca_key, ca_cert, previous = loaded, previous[0], previous[1:]
    if ca_key is None or ca_cert is None:
        ca_key, ca_cert = make_ca(CA_NAME, validity=policy.ca_validity, now=now)
    validity = min(policy.validity, ca_cert.not_valid_after_utc - now)
    # The names are in the SANs (what TLS checks); a CN is limited to 64 characters, a Service name is not.
    key, cert = issue_leaf(ca_key, ca_cert, LEAF_NAME, server_ips=tuple(h for h in hosts if _is_ip(h)),
                           server_dns=tuple(h for h in hosts if not _is_ip(h)), validity=validity, now=now)
    bundle = [ca_cert] + [c for c in previous if c.not_valid_after_utc > now and c != ca_cert]
    return WebhookCert(ca_bundle=b"".join(pem_cert(c) for c in bundle), ca_key=pem_key(ca_key),
                       cert=pem_cert(cert), key=pem_key(key))


class CertSecretError(RuntimeError):
    """The certificate Secret cannot be read or written; the message says which and what to check."""


class CertSecret:
    """The Secret ``namespace/name`` that holds the webhook's CA and serving certificate."""

    def __init__(self, core: k8s.CoreV1Api, namespace: str, name: str, hosts: list[str],
                 policy: CertPolicy | None = None, helm_release: str | None = None) -> None:
        self.core, self.namespace, self.name, self.hosts = core, namespace, name, hosts
        self.policy = policy or CertPolicy()
        self.helm_release = helm_release  # <namespace>/<release> whose chart owns the Secret, if any

    def ensure(self, now: dt.datetime | None = None) -> WebhookCert:
        """The certificate to serve: the Secret's when it is good, else one this call wrote (or the
        replica that won the race wrote)."""
        for _ in range(_WRITE_ATTEMPTS):
            now_ = now or dt.datetime.now(dt.timezone.utc)
            secret = self._read()
            current = WebhookCert.from_secret_data(secret.data if secret is not None else None)
            reason = renewal_reason(current, self.hosts, now_, self.policy)
            if reason is None:
                assert current is not None
                return current
            fresh = renew(current, self.hosts, now_, self.policy)
            try:
                self._write(secret, fresh)
            except ApiException as e:
                if e.status == 409:  # another replica wrote first: use its certificate
                    continue
                raise self._error("write", e) from e
            log.info("webhook certificate in Secret %s/%s %s: %s", self.namespace, self.name,
                     "created" if secret is None else "renewed", reason)
            return fresh
        raise CertSecretError(f"Secret {self.namespace}/{self.name}: gave up after {_WRITE_ATTEMPTS} conflicting writes")

    def _read(self) -> k8s.V1Secret | None:
        return _read_secret(self.core, self.namespace, self.name, self._error)

    def _write(self, secret: k8s.V1Secret | None, cert: WebhookCert) -> None:
        if secret is None:
            body = k8s.V1Secret(metadata=self._new_metadata(), type="Opaque", data=cert.secret_data())
            self.core.create_namespaced_secret(self.namespace, body, field_manager=L.FIELD_MANAGER)
            return
        # Update at the resourceVersion read: a concurrent writer makes this fail with 409, not overwrite.
        secret.data = cert.secret_data()
        self.core.replace_namespaced_secret(self.name, self.namespace, secret, field_manager=L.FIELD_MANAGER)

    def _new_metadata(self) -> k8s.V1ObjectMeta:
        """Metadata of a Secret this operator creates. A chart's Secret that was deleted is made again with
        Helm's ownership marks for its release: without them the next `helm upgrade` refuses to take over
        an object of that name."""
        labels = {L.APP_NAME: L.APP_NAME_VALUE, L.APP_COMPONENT: "webhook", L.APP_MANAGED_BY: L.FIELD_MANAGER}
        if self.helm_release is None:
            return k8s.V1ObjectMeta(name=self.name, namespace=self.namespace, labels=labels)
        release_namespace, _, release = self.helm_release.partition("/")
        return k8s.V1ObjectMeta(name=self.name, namespace=self.namespace,
                                labels={**labels, L.APP_MANAGED_BY: "Helm"},
                                annotations={"meta.helm.sh/release-name": release,
                                             "meta.helm.sh/release-namespace": release_namespace})

    def _error(self, what: str, e: ApiException) -> CertSecretError:
        hint = {403: "the operator's Role must grant get, update and create on it",
                404: "its namespace must exist"}.get(e.status or 0, "")
        return CertSecretError(f"cannot {what} the webhook certificate Secret {self.namespace}/{self.name}: "
                               f"{e.status} {e.reason}{'; ' + hint if hint else ''}")


def _read_secret(core: k8s.CoreV1Api, namespace: str, name: str,
                 error: Callable[[str, ApiException], CertSecretError]) -> k8s.V1Secret | None:
    try:
        return core.read_namespaced_secret(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise error("read", e) from e


class ExternalCertSecret:
    """The Secret ``namespace/name`` that another controller (cert-manager's Certificate) writes: the
    operator only reads it and never signs, writes or renews; the caBundle comes from cert-manager's CA
    injector. Until the certificate is issued, :meth:`ensure` raises, and the caller retries."""

    def __init__(self, core: k8s.CoreV1Api, namespace: str, name: str) -> None:
        self.core, self.namespace, self.name = core, namespace, name

    def ensure(self, now: dt.datetime | None = None) -> WebhookCert:
        secret = _read_secret(self.core, self.namespace, self.name, self._error)
        cert = WebhookCert.from_tls_secret(secret.data if secret is not None else None)
        if cert is None:
            raise CertSecretError(f"Secret {self.namespace}/{self.name} holds no tls.crt and tls.key yet: cert-manager "
                                  "writes it once its Certificate is Ready (kubectl describe certificate -n "
                                  f"{self.namespace})")
        return cert

    def _error(self, what: str, e: ApiException) -> CertSecretError:
        hint = {403: "the operator's Role must grant get on it", 404: "its namespace must exist"}.get(e.status or 0, "")
        return CertSecretError(f"cannot {what} the webhook certificate Secret {self.namespace}/{self.name}: "
                               f"{e.status} {e.reason}{'; ' + hint if hint else ''}")
