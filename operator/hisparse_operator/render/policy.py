"""PodDisruptionBudgets: voluntary disruptions (drains, upgrades) take one serving pod at a time."""

from __future__ import annotations

from typing import Any

from hisparse_runtime.engine import RoleSettings

from .. import names
from ..api import HiSparseDeployment
from .common import meta, obj, selector_labels


def pdb(d: HiSparseDeployment, s: RoleSettings) -> dict[str, Any]:
    # One pod at a time: on a multi-node replica one pod already takes the whole DP/EP group down,
    # so allowing more would let a drain take several replicas at once.
    return obj("policy/v1", "PodDisruptionBudget", meta(d, names.pdb(d.name, s.role), s.role), spec={
        "maxUnavailable": 1,
        "selector": {"matchLabels": selector_labels(d, s.role)},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    })
