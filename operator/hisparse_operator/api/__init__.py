"""The HiSparseDeployment API (``serving.hisparse.dev/v1alpha1``): pydantic v2 models that are the
single source of the CRD schema, plus validation into field-path errors."""

from __future__ import annotations

from . import labels, llmd
from ._base import ApiModel, CelRule
from .deployment import HiSparseDeployment, ObjectMeta, parse
from .facts import ClusterFacts, NodeFacts
from .kube import parse_quantity, quantity_gib
from .roles import role_settings, role_spec, spec_path
from .spec import (
    DecodeSpec,
    EngineSpec,
    HiSparseDeploymentSpec,
    ModelSpec,
    PrefillSpec,
    RoleSpec,
    RolloutSpec,
    RoutingSpec,
)
from .status import CONDITION_TYPES, Condition, ConditionType, HiSparseDeploymentStatus
from .validation import FieldError, validate

__all__ = [
    "CONDITION_TYPES", "ApiModel", "CelRule", "ClusterFacts", "Condition", "ConditionType", "DecodeSpec",
    "EngineSpec", "FieldError", "HiSparseDeployment", "HiSparseDeploymentSpec", "HiSparseDeploymentStatus",
    "ModelSpec", "NodeFacts", "ObjectMeta", "PrefillSpec", "RoleSpec", "RolloutSpec", "RoutingSpec", "labels", "llmd", "parse",
    "parse_quantity", "quantity_gib", "role_settings", "role_spec", "spec_path", "validate",
]
