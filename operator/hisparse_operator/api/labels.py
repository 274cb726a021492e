"""API identity, label keys and annotation keys: every name the toolkit puts on objects lives here."""

from __future__ import annotations

from typing import Final

GROUP: Final = "serving.hisparse.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "HiSparseDeployment"
PLURAL: Final = "hisparsedeployments"
SINGULAR: Final = "hisparsedeployment"
SHORT_NAMES: Final = ("hsd",)

FIELD_MANAGER: Final = "hisparse-operator"
"""The one server-side-apply field manager the operator writes with."""

# Kubernetes recommended labels.
APP_NAME: Final = "app.kubernetes.io/name"
APP_INSTANCE: Final = "app.kubernetes.io/instance"
APP_COMPONENT: Final = "app.kubernetes.io/component"
APP_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
APP_VERSION: Final = "app.kubernetes.io/version"
APP_NAME_VALUE: Final = "hisparse"

# Ours.
DEPLOYMENT: Final = f"{GROUP}/deployment"
"""Name of the HiSparseDeployment an object belongs to."""
ROLE: Final = f"{GROUP}/role"
"""prefill | decode on serving pods."""
REVISION: Final = f"{GROUP}/revision"
"""Revision (hash of the pod-shaping spec) of serving pods."""
TRACK: Final = f"{GROUP}/track"
CANARY_SUFFIX: Final = "canary"
"""Value of ``TRACK`` on a candidate's objects, and the suffix of their base name."""
"""``canary`` on the objects of a candidate revision that runs beside the stable one (absent on stable)."""
KV_COMPAT: Final = f"{GROUP}/kv-compat"
"""KV-compatibility hash on every serving pod; the InferencePool selects on it, so P and D of
incompatible builds are never paired."""

MODEL_FETCH: Final = f"{GROUP}/model-fetch"
"""Annotation on a serving workload: the Job that fills the model cache its pods load from. The reconciler
creates or changes the workload only once that Job has completed."""

# llm-d (see shared llm-d contract): the EPP filters on these.
LLMD_INFERENCE_SERVING: Final = "llm-d.ai/inference-serving"
LLMD_MODEL: Final = "llm-d.ai/model"
LLMD_ROLE: Final = "llm-d.ai/role"

ROLLOUT_ACTION: Final = f"{GROUP}/rollout-action"
"""Annotation a user (or ``hisparse rollout ...``) sets to steer a canary: ``<action>`` or
``<action>@<id>`` with action one of ``ROLLOUT_ACTIONS``; the operator acts once per distinct value
and records it in ``status.canary.handledAction``."""
ROLLOUT_ACTIONS: Final = ("promote", "abort", "retry", "pause", "resume")
