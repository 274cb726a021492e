"""The webhook certificate's renewal rules, retry backoff and the operator's settings (no cluster: the
Secret race and the replicas are e2e/tests/test_e2e_replicas.py)."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from hisparse_operator.controller.certs import CertPolicy, CertSecret, WebhookCert, renew, renewal_reason, serving_hosts
from hisparse_operator.controller.retry import Backoff, Retries
from hisparse_operator.controller.settings import OperatorEnv, SettingsError

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
POLICY = CertPolicy(validity=dt.timedelta(days=10), ca_validity=dt.timedelta(days=100), renew_before=dt.timedelta(days=2))
HOSTS = serving_hosts(service="ops-hisparse", namespace="ops")


def cas(cert: WebhookCert) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(cert.ca_bundle)


def leaf(cert: WebhookCert) -> x509.Certificate:
    return x509.load_pem_x509_certificate(cert.cert)


def test_a_fresh_certificate_serves_the_service_names_and_needs_nothing() -> None:
    cert = renew(None, HOSTS, NOW, POLICY)
    assert renewal_reason(cert, HOSTS, NOW, POLICY) is None
    names = leaf(cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "ops-hisparse.ops.svc" in names.get_values_for_type(x509.DNSName)  # what the apiserver verifies
    leaf(cert).verify_directly_issued_by(cas(cert)[0])
    assert WebhookCert.from_secret_data(cert.secret_data()) == cert


@pytest.mark.parametrize("data", [None, {}, {"ca.crt": "", "ca.key": "", "tls.crt": "", "tls.key": ""}])
def test_the_chart_s_empty_secret_holds_no_certificate(data: dict[str, str] | None) -> None:
    assert WebhookCert.from_secret_data(data) is None
    assert renewal_reason(None, HOSTS, NOW, POLICY) == "no certificate yet"


def test_leaf_renewal_keeps_the_ca_so_the_ca_bundle_does_not_change() -> None:
    first = renew(None, HOSTS, NOW, POLICY)
    later = NOW + dt.timedelta(days=9)
    reason = renewal_reason(first, HOSTS, later, POLICY)
    assert reason is not None and reason.startswith("the serving certificate expires")
    second = renew(first, HOSTS, later, POLICY)
    assert second.ca_bundle == first.ca_bundle and second.ca_key == first.ca_key
    assert second.cert != first.cert and renewal_reason(second, HOSTS, later, POLICY) is None


def test_ca_renewal_keeps_the_previous_ca_trusted_until_it_expires() -> None:
    first = renew(None, HOSTS, NOW, POLICY)
    later = NOW + dt.timedelta(days=99)
    assert (renewal_reason(first, HOSTS, later, POLICY) or "").startswith("the CA expires")
    second = renew(first, HOSTS, later, POLICY)
    new_ca, old_ca = cas(second)
    assert old_ca == cas(first)[0], "replicas still serving the old leaf stay trusted"
    leaf(second).verify_directly_issued_by(new_ca)
    assert leaf(second).not_valid_after_utc <= new_ca.not_valid_after_utc
    # Once the old CA has expired, the next renewal drops it from the bundle.
    third = renew(second, HOSTS, later + dt.timedelta(days=9), POLICY)
    assert cas(third) == [new_ca]


def test_long_service_names_fit() -> None:
    """A certificate's CN holds at most 64 characters; Service DNS names can be far longer."""
    hosts = serving_hosts(service="s" * 63, namespace="n" * 63)
    assert renewal_reason(renew(None, hosts, NOW, POLICY), hosts, NOW, POLICY) is None


def test_a_leaf_never_outlives_its_ca() -> None:
    policy = CertPolicy(validity=dt.timedelta(days=50), ca_validity=dt.timedelta(days=20), renew_before=dt.timedelta(0))
    cert = renew(None, HOSTS, NOW, policy)
    assert leaf(cert).not_valid_after_utc == cas(cert)[0].not_valid_after_utc


def test_other_hosts_mismatched_keys_and_garbage_are_renewed() -> None:
    cert = renew(None, HOSTS, NOW, POLICY)
    assert "does not name 10.0.0.1" in (renewal_reason(cert, [*HOSTS, "10.0.0.1"], NOW, POLICY) or "")
    other = renew(None, HOSTS, NOW, POLICY)
    assert "does not match" in (renewal_reason(cert.model_copy(update={"key": other.key}), HOSTS, NOW, POLICY) or "")
    assert "not signed by" in (renewal_reason(cert.model_copy(update={"ca_bundle": other.ca_bundle}), HOSTS, NOW, POLICY) or "")
    assert (renewal_reason(cert.model_copy(update={"cert": b"junk"}), HOSTS, NOW, POLICY) or "").startswith("unreadable")


def test_serving_file_loads_into_a_tls_server_and_is_replaced_whole(tmp_path: Path) -> None:
    cert = renew(None, ["127.0.0.1"], dt.datetime.now(dt.timezone.utc), POLICY)
    path = cert.write_serving_file(tmp_path)
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(path, path)
    assert path.stat().st_mode & 0o777 == 0o600
    mtime = path.stat().st_mtime_ns
    assert cert.write_serving_file(tmp_path) == path and path.stat().st_mtime_ns == mtime, "unchanged: not rewritten"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["serving.pem"]


def test_serving_hosts_need_a_service_namespace_or_a_host() -> None:
    assert serving_hosts(host="127.0.0.1") == ["127.0.0.1"]
    with pytest.raises(ValueError, match="namespace"):
        serving_hosts(service="svc")
    with pytest.raises(ValueError, match="Service or a host"):
        serving_hosts()


# ---- retries -----------------------------------------------------------------------------------------

def test_backoff_doubles_up_to_its_cap() -> None:
    assert [Backoff(1, 10).delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert Backoff(0.5, 60).delay(1000) == 60
    with pytest.raises(ValueError, match="base <= cap"):
        Backoff(5, 1)


def test_a_success_or_a_newer_failure_supersedes_a_pending_retry() -> None:
    retries = Retries(Backoff(1, 8))
    key = ("ns", "a")
    d1, t1 = retries.failed(key)
    d2, t2 = retries.failed(key)
    assert (d1, d2) == (1, 2) and not retries.due(key, t1) and retries.due(key, t2)
    retries.succeeded(key)
    assert not retries.due(key, t2) and retries.failures(key) == 0
    d3, t3 = retries.failed(key)
    assert d3 == 1 and t3 not in (t1, t2), "a retry scheduled before the success must not revive"
    assert retries.failed(("ns", "b"))[0] == 1, "objects back off independently"


# ---- settings -----------------------------------------------------------------------------------------

def test_settings_name_every_bad_variable() -> None:
    with pytest.raises(SettingsError) as e:
        OperatorEnv.from_env({"HISPARSE_WEBHOOK_PORT": "99999", "HISPARSE_WORKERS": "many", "HISPARSE_RESYNC_SECONDS": "60"})
    text = str(e.value)
    assert "HISPARSE_WEBHOOK_PORT='99999'" in text and "HISPARSE_WORKERS='many'" in text
    assert "RESYNC" not in text
    with pytest.raises(SettingsError, match="below RETRY_BASE_SECONDS"):
        OperatorEnv.from_env({"HISPARSE_RETRY_BASE_SECONDS": "10", "HISPARSE_RETRY_MAX_SECONDS": "5"})


def test_unset_and_empty_variables_take_the_defaults() -> None:
    env = OperatorEnv.from_env({"HISPARSE_PEERING": "", "UNRELATED": "x"})
    assert env == OperatorEnv() and env.peering is None and env.retry_max_seconds == 60


def test_a_cert_manager_secret_serves_without_a_ca_key() -> None:
    """cert-manager's kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt; no ca.key): read as is."""
    issued = renew(None, HOSTS, NOW, POLICY)
    data = {k: v for k, v in issued.secret_data().items() if k != "ca.key"}
    cert = WebhookCert.from_tls_secret(data)
    assert cert is not None and cert.cert == issued.cert and cert.key == issued.key and cert.ca_bundle == issued.ca_bundle
    assert cert.ca_key == b"" and WebhookCert.from_secret_data(data) is None, "the operator's own form needs ca.key"
    assert cert.not_after() == leaf(issued).not_valid_after_utc
    assert WebhookCert.from_tls_secret({"ca.crt": data["ca.crt"]}) is None, "not issued yet"


def test_cert_source_and_configuration_name_settings() -> None:
    env = OperatorEnv.from_env({"HISPARSE_WEBHOOK_CERT_SOURCE": "external",
                                "HISPARSE_WEBHOOK_CONFIGURATION": "ops-hisparse.hisparsedeployments.serving.hisparse.dev"})
    assert env.webhook_cert_source == "external"
    assert env.webhook_configuration.startswith("ops-hisparse.")
    assert OperatorEnv().webhook_cert_source == "operator"
    with pytest.raises(SettingsError, match="HISPARSE_WEBHOOK_CERT_SOURCE='cert-manager'"):
        OperatorEnv.from_env({"HISPARSE_WEBHOOK_CERT_SOURCE": "cert-manager"})


def test_a_re_made_secret_carries_its_helm_release() -> None:
    """The chart's Secret, deleted and made again by the operator, must be one Helm adopts on upgrade."""
    env = OperatorEnv.from_env({"HISPARSE_WEBHOOK_SECRET_RELEASE": "team-a/hisparse"})
    meta = CertSecret(None, "team-a", "s", HOSTS, helm_release=env.webhook_secret_release)._new_metadata()  # type: ignore[arg-type]
    assert meta.annotations == {"meta.helm.sh/release-name": "hisparse", "meta.helm.sh/release-namespace": "team-a"}
    assert meta.labels["app.kubernetes.io/managed-by"] == "Helm"
    plain = CertSecret(None, "team-a", "s", HOSTS)._new_metadata()  # type: ignore[arg-type]
    assert plain.annotations is None and plain.labels["app.kubernetes.io/managed-by"] == "hisparse-operator"
    with pytest.raises(SettingsError, match="HISPARSE_WEBHOOK_SECRET_RELEASE='hisparse'"):
        OperatorEnv.from_env({"HISPARSE_WEBHOOK_SECRET_RELEASE": "hisparse"})
