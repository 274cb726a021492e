"""Certificates and keys for the dev control plane, made with ``cryptography``.

One CA signs the apiserver's serving cert (IP SAN 127.0.0.1), KWOK's kubelet
endpoint and one client cert per component; a separate RSA pair signs and
verifies service-account tokens. Everything is written as PEM files. The
in-memory builders (``make_ca``, ``issue_leaf``) also make the operator's
webhook certificate (``controller/certs.py``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough that a cluster left up for days keeps working.
_VALIDITY = dt.timedelta(days=365)
# Tolerates small clock differences between processes.
_BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class CertFiles:
    """A certificate and its private key on disk."""

    cert: Path
    key: Path


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def make_ca(common_name: str, *, validity: dt.timedelta = _VALIDITY,
            now: dt.datetime | None = None) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed ECDSA P-256 CA valid for ``validity`` (in memory)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = now or dt.datetime.now(dt.timezone.utc)
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue_leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
    server_dns: tuple[str, ...] = (),
    client: bool = False,
    validity: dt.timedelta = _VALIDITY,
    now: dt.datetime | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A leaf signed by the CA (in memory); a server cert when any SAN is given."""
    server = bool(server_ips or server_dns)
    if not (server or client):
        raise ValueError(f"{common_name}: a certificate needs a SAN (server) or client=True")
    key = ec.generate_private_key(ec.SECP256R1())
    now = now or dt.datetime.now(dt.timezone.utc)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organizations))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_encipherment=False, key_cert_sign=False,
                crl_sign=False, content_commitment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in server_dns]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class Pki:
    """A CA in a directory that issues leaf certificates on demand."""

    def __init__(self, directory: Path, ca_name: str = "hisparse-dev-ca") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._ca_key, self._ca_cert = make_ca(ca_name)
        self.ca = CertFiles(
            cert=_write(self.dir / "ca.crt", pem_cert(self._ca_cert)),
            key=_write(self.dir / "ca.key", pem_key(self._ca_key), private=True),
        )

    @property
    def ca_pem(self) -> bytes:
        return pem_cert(self._ca_cert)

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
        server_dns: tuple[str, ...] = (),
        client: bool = False,
    ) -> CertFiles:
        """Issue ``<stem>.crt``/``<stem>.key``; a server cert when any SAN is given."""
        if not (server_ips or server_dns or client):
            raise ValueError(f"{stem}: a certificate needs a SAN (server) or client=True")
        key, cert = issue_leaf(self._ca_key, self._ca_cert, common_name, organizations=organizations,
                               server_ips=server_ips, server_dns=server_dns, client=client)
        return CertFiles(
            cert=_write(self.dir / f"{stem}.crt", pem_cert(cert)),
            key=_write(self.dir / f"{stem}.key", pem_key(key), private=True),
        )

    def service_account_keys(self) -> CertFiles:
        """RSA pair for service-account tokens: ``cert`` holds the public key."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return CertFiles(
            cert=_write(self.dir / "sa.pub", public),
            key=_write(self.dir / "sa.key", pem_key(key), private=True),
        )
