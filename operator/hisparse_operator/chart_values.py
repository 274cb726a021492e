"""The Helm chart's values as a pydantic model, and every chart file generated from Python.

``charts/hisparse/values.schema.json`` comes from :class:`ChartValues` (Helm checks user values against
it on install, upgrade, lint and template), ``templates/clusterrole.yaml`` and ``templates/role.yaml``
from :mod:`.rbac`, ``templates/validatingwebhookconfiguration.yaml`` from :mod:`.controller.webhook`, and
``crds/serving.hisparse.dev_hisparsedeployments.yaml`` from :mod:`.crd`. Rewrite them all with::

    python -m hisparse_operator.chart_values

A test fails when any of them differs from what this module produces.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

CHART_NAME: Final = "hisparse"
REPO_ROOT: Final = Path(__file__).resolve().parents[2]
CHART_DIR: Final = REPO_ROOT / "charts" / CHART_NAME

Quantity = str | int | float
"""A Kubernetes resource quantity as YAML gives it (``500m``, ``1Gi``, ``2``)."""


class _Values(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Image(_Values):
    repository: str = Field("ghcr.io/hisparse/hisparse-operator", min_length=1,
                            description="Operator image: has the `hisparse` CLI with the `operator` extra installed.")
    tag: str = Field("", description="Image tag; empty means the chart's appVersion.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="Image pull policy.")


class Resources(_Values):
    requests: dict[str, Quantity] = Field(default_factory=lambda: {"cpu": "100m", "memory": "256Mi"},
                                          description="Container resource requests.")
    limits: dict[str, Quantity] = Field(default_factory=lambda: {"memory": "512Mi"},
                                        description="Container resource limits (no CPU limit: throttling slows reconciles).")


class SeccompProfile(_Values):
    type: Literal["RuntimeDefault", "Localhost"] = Field("RuntimeDefault", description="Seccomp profile type.")
    localhost_profile: str | None = Field(None, description="Profile path on the node, for type Localhost.")


class PodSecurityContext(_Values):
    run_as_non_root: Literal[True] = Field(True, description="Always true: the operator never runs as root.")
    run_as_user: int = Field(65532, ge=1, description="UID of the operator process (not 0).")
    run_as_group: int = Field(65532, ge=1, description="GID of the operator process (not 0).")
    fs_group: int = Field(65532, ge=1, description="Group owning the mounted volumes.")
    seccomp_profile: SeccompProfile = Field(default_factory=SeccompProfile, description="Pod seccomp profile.")


class ContainerSecurity(_Values):
    read_only_root_filesystem: bool = Field(
        True, description="Mount the root filesystem read-only; the webhook certificate and temp files go to emptyDirs.")


class Webhook(_Values):
    port: int = Field(9443, ge=1024, le=65535,
                      description="Admission webhook port, in the pod and on the Service. The CA and serving "
                                  "certificate are made by the operator into the chart's (empty) Secret, shared "
                                  "by all replicas and renewed before they expire.")


class Metrics(_Values):
    port: int = Field(8080, ge=1024, le=65535, description="Prometheus metrics port, in the pod and on the Service.")


class Liveness(_Values):
    port: int = Field(8081, ge=1024, le=65535, description="kopf's liveness endpoint (/healthz) port.")


class Peering(_Values):
    name: str = Field("hisparse", min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                      description="ClusterKopfPeering the replicas coordinate through, so one handles events at a "
                                  "time; created and used only when replicas > 1.")
    lifetime_seconds: int = Field(60, ge=2, le=3600,
                                  description="Seconds a replica that stops renewing keeps its place: how long the "
                                              "others wait before taking over after a crash.")


class Retry(_Values):
    base_seconds: float = Field(1.0, gt=0, le=60, description="First delay before a failed reconcile is retried.")
    max_seconds: float = Field(60.0, gt=0, le=3600,
                               description="Longest delay between retries (the delay doubles up to it; not below "
                                           "baseSeconds).")


class ChartValues(_Values):
    """Values of the ``hisparse`` chart (``charts/hisparse/values.yaml`` holds the defaults)."""

    image: Image = Field(default_factory=Image, description="Operator image.")
    image_pull_secrets: list[str] = Field(default_factory=list,
                                          description="Names of existing image pull Secrets (the chart creates none).")
    replicas: int = Field(1, ge=1, le=5, description="Operator replicas; more than one turns on kopf peering.")
    resources: Resources = Field(default_factory=Resources, description="Operator container resources.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Pod tolerations.")
    affinity: dict[str, Any] = Field(default_factory=dict, description="Pod affinity.")
    pod_security_context: PodSecurityContext = Field(default_factory=PodSecurityContext,
                                                     description="Pod securityContext (always non-root).")
    security_context: ContainerSecurity = Field(
        default_factory=ContainerSecurity,
        description="Container securityContext choices; privilege escalation is always off and every capability dropped.")
    webhook: Webhook = Field(default_factory=Webhook, description="Admission webhook.")
    metrics: Metrics = Field(default_factory=Metrics, description="Prometheus metrics.")
    liveness: Liveness = Field(default_factory=Liveness, description="Liveness probe.")
    peering: Peering = Field(default_factory=Peering, description="kopf peering, used when replicas > 1.")
    watch_namespaces: list[str] = Field(default_factory=list,
                                        description="Namespaces to watch; empty watches every namespace.")
    resync_seconds: int = Field(300, ge=10, le=3600,
                                description="Seconds between kopf's full re-lists (the resync that catches missed events).")
    workers: int = Field(8, ge=1, le=64, description="Handler threads.")
    retry: Retry = Field(default_factory=Retry, description="Backoff of a reconcile that failed (per deployment).")
    prometheus_url: str = Field("", pattern=r"^(https?://.*)?$", max_length=512,
                                description="Prometheus that canary analysis steps query unless a step names one (empty: none).")


def values_schema() -> dict[str, Any]:
    schema = ChartValues.model_json_schema(by_alias=True, mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def values_schema_json() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


def generated_files() -> dict[str, Callable[[], str]]:
    """Chart-relative path -> the function that produces its exact text."""
    from .controller.webhook import chart_template
    from .crd import CRD_FILE, crd_yaml
    from .rbac import cluster_role_template, role_template

    return {
        "values.schema.json": values_schema_json,
        "templates/clusterrole.yaml": cluster_role_template,
        "templates/role.yaml": role_template,
        "templates/validatingwebhookconfiguration.yaml": chart_template,
        f"crds/{CRD_FILE}": crd_yaml,
    }


def stale_files(chart_dir: Path = CHART_DIR) -> list[str]:
    """Generated files that are missing or differ from what the code produces."""
    out = []
    for rel, make in generated_files().items():
        path = chart_dir / rel
        if not path.is_file() or path.read_text() != make():
            out.append(rel)
    return out


def write(chart_dir: Path = CHART_DIR) -> list[str]:
    """Rewrite every generated file in ``chart_dir``; returns the ones that changed."""
    changed = stale_files(chart_dir)
    for rel, make in generated_files().items():
        path = chart_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(make())
    return changed


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else CHART_DIR
    for rel in write(target):
        print(f"updated {target / rel}")
