"""The ``HiSparseDeployment`` resource."""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from hisparse_runtime.engine import kube
from pydantic import AfterValidator, Field, PrivateAttr

from ._base import ApiModel, CelRule
from .kube import LabelKey, LabelMap, Namespace
from .labels import API_VERSION, KIND
from .spec import HiSparseDeploymentSpec
from .status import HiSparseDeploymentStatus


def _name_problem(value: str) -> str:
    problem = kube.dns1035_label_problem(value, "metadata.name must be because the rendered Services are named from it, and a Service name")
    if problem:
        raise ValueError(problem)
    return value


class ObjectMeta(ApiModel):
    """The metadata fields the toolkit reads, and the rest of ObjectMeta as the apiserver sends it; any other
    field is refused, as the apiserver refuses it with kubectl's strict field validation (a look-alike
    ``namеspace`` would otherwise be dropped and the object land in ``default``)."""

    name: Annotated[str, Field(min_length=1), AfterValidator(_name_problem)]
    """Object name (a DNS-1035 label, since Services are named from it; at most 40 characters, see the CEL
    rule on the resource)."""
    namespace: Namespace | None = None
    uid: str | None = None
    generation: int | None = None
    labels: LabelMap = Field(default_factory=dict)
    annotations: dict[LabelKey, str] = Field(default_factory=dict)
    # The rest of ObjectMeta, passed through as the apiserver sent it.
    generate_name: str | None = None
    """A name prefix the apiserver completes (``kubectl create`` only)."""
    self_link: str | None = None
    """Deprecated; the apiserver no longer sets it."""
    resource_version: str | None = None
    """The apiserver's version of the object (optimistic concurrency)."""
    creation_timestamp: str | None = None
    """When the apiserver created the object."""
    deletion_timestamp: str | None = None
    """When deletion was requested (finalizers may still hold the object)."""
    deletion_grace_period_seconds: int | None = None
    """The grace period of a requested deletion."""
    owner_references: list[dict[str, Any]] | None = None
    """Objects this one belongs to (garbage collection)."""
    finalizers: list[str] | None = None
    """Keys that must be removed before the object is deleted."""
    managed_fields: list[dict[str, Any]] | None = None
    """Server-side apply's record of which manager set which field."""


class HiSparseDeployment(ApiModel):
    """A prefill/decode vLLM deployment of a DSA model with HiSparse decode, behind llm-d."""

    __cel_rules__: ClassVar = (
        CelRule(
            "size(self.metadata.name) <= 40",
            "metadata.name must be at most 40 characters: child objects add suffixes such as -decode-nixl and must stay DNS labels",
            python_path=".metadata.name",
        ),
    )

    api_version: Literal["serving.hisparse.dev/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["HiSparseDeployment"] = KIND
    metadata: ObjectMeta
    spec: HiSparseDeploymentSpec
    """What to run: model, engine, prefill and decode fleets, KV transfer, routing, rollout."""
    status: HiSparseDeploymentStatus | None = None
    _owner: str | None = PrivateAttr(default=None)
    _candidate: bool = PrivateAttr(default=False)

    @property
    def name(self) -> str:
        """Base of every rendered object's name: the fleet's (see :meth:`as_fleet`)."""
        return self.metadata.name

    @property
    def owner_name(self) -> str:
        """Name of the resource itself: what owner references and the ownership label carry."""
        return self._owner or self.metadata.name

    @property
    def is_canary(self) -> bool:
        """Rendered as the candidate fleet of a canary (its objects carry ``TRACK: canary``)."""
        return self._candidate

    def as_fleet(self, base: str, *, candidate: bool = False) -> HiSparseDeployment:
        """This resource rendered as the fleet named ``base`` (:func:`..names.fleet`): every object is
        named from ``base`` and its pods, selectors and InferencePool use it, so no other fleet's
        selectors match them (and the reverse); the objects still belong to the resource. A fleet keeps
        its name for life, so promoting a candidate changes no pod of it."""
        owner = self.owner_name
        if base == owner and not candidate:
            if self._owner is None and not self._candidate:
                return self
            copy = self.model_copy(update={"metadata": self.metadata.model_copy(update={"name": owner})})
            copy._owner, copy._candidate = None, False
            return copy
        copy = self.model_copy(update={"metadata": self.metadata.model_copy(update={"name": base})})
        copy._owner = owner if base != owner else None
        copy._candidate = candidate
        return copy

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"


def parse(obj: dict[str, Any]) -> HiSparseDeployment:
    """Validate a manifest as strictly as the CRD types it (raises ``pydantic.ValidationError``; see
    :mod:`.validation` for field errors)."""
    return HiSparseDeployment.model_validate_json(json.dumps(obj, allow_nan=False), strict=True)
