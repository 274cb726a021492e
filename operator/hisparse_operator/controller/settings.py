"""The operator's settings, read once from ``HISPARSE_*`` environment variables (the chart sets them).

A bad value stops the operator at start with the variable's name, the value and the rule, instead of
failing later in a handler.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..render.parity import JudgeImage
from .certs import CertPolicy
from .webhook import CONFIGURATION as WEBHOOK_CONFIGURATION

PREFIX: Final = "HISPARSE_"
SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_WEBHOOK_SECRET: Final = "hisparse-webhook-cert"


class SettingsError(ValueError):
    """One line per bad ``HISPARSE_*`` variable."""


class OperatorEnv(BaseModel):
    """Every ``HISPARSE_<FIELD>`` variable the operator reads (field names upper-cased)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Webhook: served when WEBHOOK_PORT is set.
    webhook_port: int | None = Field(None, ge=1, le=65535, description="Port the admission webhook listens on.")
    webhook_addr: str | None = Field(None, description="Address it binds (default: WEBHOOK_HOST, or all in service mode).")
    webhook_service: str | None = Field(
        None, description="Service the apiserver calls the webhook through (in-cluster); unset: a URL on WEBHOOK_HOST.")
    webhook_host: str = Field("127.0.0.1", min_length=1,
                              description="Host of the webhook URL when there is no Service (the local dev cluster).")
    webhook_secret: str = Field(DEFAULT_WEBHOOK_SECRET, min_length=1,
                                description="Secret (in NAMESPACE) that holds the CA and serving certificate all replicas share.")
    webhook_secret_release: str | None = Field(
        None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="`<namespace>/<release>` of the Helm release whose chart made the Secret: one the operator makes "
                    "again (it was deleted) carries that release's ownership, so `helm upgrade` adopts it and "
                    "`helm uninstall` removes it.")
    webhook_cert_dir: Path | None = Field(None, description="Writable directory for the serving certificate file.")
    webhook_configuration: str = Field(
        WEBHOOK_CONFIGURATION, min_length=1, max_length=253,
        description="Name of the ValidatingWebhookConfiguration (cluster-scoped: the chart makes it unique per release).")
    webhook_cert_source: Literal["operator", "external"] = Field(
        "operator", description="`operator`: the replicas make, share and renew the CA and certificate in the Secret and "
                                "keep the configuration's caBundle; `external`: another controller (cert-manager) writes "
                                "the Secret and injects the caBundle, and the operator only reads the Secret.")
    webhook_cert_days: float = Field(365, gt=0, description="Lifetime of a serving certificate, days.")
    webhook_ca_days: float = Field(3650, gt=0, description="Lifetime of the webhook CA, days.")
    webhook_renew_days: float = Field(30, ge=0, description="Renew a certificate or the CA with less than this left, days.")
    webhook_cert_check_seconds: float = Field(
        60, ge=1, le=86400, description="How often each replica re-reads the Secret (renewal, another replica's renewal).")
    namespace: str | None = Field(None, description="The operator's own namespace (default: the pod's, else `default`).")
    # Metrics.
    metrics_port: int | None = Field(None, ge=1, le=65535, description="Prometheus metrics port (unset: no metrics server).")
    metrics_addr: str = Field("0.0.0.0", description="Address the metrics server binds.")
    prometheus_url: str | None = Field(None, pattern=r"^https?://",
                                       description="Prometheus that canary analysis steps query unless the step names one.")
    # The parity gate's judge.
    parity_image: str | None = Field(
        None, min_length=1, max_length=512,
        description="Image every canary's parity Job runs (it must hold a `hisparse-runtime` of this operator's "
                    "version); unset: the stable revision's runtime image. Never the candidate's.")
    parity_image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Pull policy of PARITY_IMAGE.")
    # Peering: more than one replica.
    peering: str | None = Field(None, description="ClusterKopfPeering name; set when replicas > 1.")
    peering_lifetime: int = Field(60, ge=2, le=3600,
                                  description="Seconds a replica that stops renewing keeps its place (takeover delay after a crash).")
    # Reconciling.
    resync_seconds: int = Field(300, ge=1, description="Seconds between kopf's full re-lists.")
    workers: int = Field(8, ge=1, le=256, description="Reconcile threads (the admission webhook has threads of its own).")
    upgrade_canaries: int = Field(
        1, ge=0, le=10000,
        description="How many deployments at once canary this operator's rendering of a stable revision an earlier "
                    "operator rendered otherwise (after an upgrade that changes rendered pods); the others keep their "
                    "stable fleet as it runs and wait (`UpgradeQueued`). 0: no limit.")
    retry_base_seconds: float = Field(1.0, gt=0, description="First delay before a failed reconcile is retried.")
    retry_max_seconds: float = Field(60.0, gt=0, description="Longest delay between retries (the delay doubles up to it).")

    @model_validator(mode="after")
    def _retry_bounds(self) -> OperatorEnv:
        if self.retry_max_seconds < self.retry_base_seconds:
            raise ValueError(f"RETRY_MAX_SECONDS {self.retry_max_seconds} is below RETRY_BASE_SECONDS "
                             f"{self.retry_base_seconds}: the delay only grows from the base")
        return self

    @classmethod
    def variables(cls) -> list[str]:
        return [PREFIX + name.upper() for name in cls.model_fields]

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> OperatorEnv:
        raw = {name: environ[PREFIX + name.upper()] for name in cls.model_fields
               if environ.get(PREFIX + name.upper(), "") != ""}
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            lines = []
            for err in e.errors():
                field = ".".join(str(p) for p in err["loc"])
                var = PREFIX + field.upper() if field else "HISPARSE_*"
                lines.append(f"{var}={environ.get(var, '')!r}: {err['msg']}")
            raise SettingsError("bad operator settings:\n  " + "\n  ".join(lines)) from None

    def own_namespace(self) -> str:
        if self.namespace:
            return self.namespace
        try:
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"

    def judge_image(self) -> JudgeImage | None:
        return JudgeImage(self.parity_image, self.parity_image_pull_policy) if self.parity_image else None

    def cert_policy(self) -> CertPolicy:
        return CertPolicy(validity=dt.timedelta(days=self.webhook_cert_days),
                          ca_validity=dt.timedelta(days=self.webhook_ca_days),
                          renew_before=dt.timedelta(days=self.webhook_renew_days))
