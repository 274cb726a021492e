"""The admission webhook's serving certificate: a fresh CA and one leaf for the webhook's hosts.

Issued by the same small CA code the local control plane uses (``devcluster._pki.Pki``, ECDSA P-256
with ``cryptography``); kopf's own self-signing extra depends on oscrypto, which fails with OpenSSL 3.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from ..devcluster._pki import Pki


@dataclass(frozen=True)
class ServingCert:
    certfile: Path
    keyfile: Path
    ca_pem: bytes


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def make_serving_cert(directory: Path, hosts: list[str]) -> ServingCert:
    """CA + serving certificate for ``hosts`` (IPs and DNS names) under ``directory``."""
    pki = Pki(directory, ca_name="hisparse-webhook-ca")
    leaf = pki.issue("tls", hosts[0], server_ips=tuple(h for h in hosts if _is_ip(h)),
                     server_dns=tuple(h for h in hosts if not _is_ip(h)))
    return ServingCert(leaf.cert, leaf.key, pki.ca_pem)
