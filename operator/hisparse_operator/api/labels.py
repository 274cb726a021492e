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
"""``canary`` on the objects of a candidate revision's fleet while it runs beside the stable one (absent
on the stable fleet's; never on pods, so a promoted fleet loses it without a restart)."""
TRACK_CANARY: Final = "canary"
"""Value of ``TRACK`` on a candidate fleet's objects."""
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

GATEWAY_NAME: Final = "gateway.networking.k8s.io/gateway-name"
"""Gateway API's label (GEP-1762) on the proxies an implementation deploys for a Gateway (Istio and kgateway
put it on their proxy pods): the NetworkPolicies' default selector of the gateway's pods."""

# Keys other projects read, rendered from the topology fields of a role (``api/topology.py``). Each is
# written by the operator from its typed field, so it is refused in ``podLabels`` / ``podAnnotations``.
MULTUS_NETWORKS: Final = "k8s.v1.cni.cncf.io/networks"
"""Pod annotation Multus reads: the NetworkAttachmentDefinitions to attach as secondary interfaces (a JSON
list of ``{name, namespace, interface}``), rendered from a role's ``networks``."""
KUEUE_QUEUE_NAME: Final = "kueue.x-k8s.io/queue-name"
"""Label on a workload (LeaderWorkerSet, Deployment) naming the Kueue LocalQueue that admits it."""
VOLCANO_QUEUE_NAME: Final = "scheduling.volcano.sh/queue-name"
"""Volcano queue: on a LeaderWorkerSet (LWS copies it into each group's PodGroup) or on a pod template."""
VOLCANO_GROUP_NAME: Final = "scheduling.k8s.io/group-name"
"""Pod annotation naming the Volcano PodGroup; LWS writes it on each group's pods."""
LWS_PREFIX: Final = "leaderworkerset.sigs.k8s.io/"
"""Prefix of the labels and annotations LWS writes on its pods (group index, worker index, ...)."""

OWNED_POD_LABELS: Final = (APP_NAME, APP_INSTANCE, APP_COMPONENT, APP_MANAGED_BY, DEPLOYMENT, ROLE, REVISION,
                           TRACK, KV_COMPAT, LLMD_INFERENCE_SERVING, LLMD_MODEL, LLMD_ROLE)
"""Every label the operator puts on serving pods: selectors, the revision, the KV-compatibility hash and
llm-d's routing labels depend on them (a test holds the rendered pods to this list)."""
OWNED_POD_PREFIXES: Final = (f"{GROUP}/", "llm-d.ai/", LWS_PREFIX)
"""Key prefixes of the operator, of llm-d's routing contract and of LWS, on pod labels and annotations."""

_FOR_FIELD: Final = {
    KUEUE_QUEUE_NAME: "gangScheduling.kueue.queueName (the label belongs on the workload, where Kueue reads it)",
    MULTUS_NETWORKS: "networks",
    VOLCANO_QUEUE_NAME: "gangScheduling.volcano.queue",
    VOLCANO_GROUP_NAME: "gangScheduling.volcano (LWS names each group's PodGroup itself)",
}


def owned_pod_key_problem(key: str, where: str) -> str | None:
    """Why ``key`` may not be set in a role's ``where`` (``podLabels`` or ``podAnnotations``), or None."""
    if key in _FOR_FIELD:
        return (f"{key!r} is rendered from a typed field of the role; set it there: use {_FOR_FIELD[key]} and remove "
                f"the key from {where}")
    if (where == "podLabels" and key in OWNED_POD_LABELS) or key.startswith(OWNED_POD_PREFIXES):
        return (f"{key!r} is a key the operator, llm-d's routing or LeaderWorkerSet sets on serving pods (selectors, "
                f"the revision, the KV-compatibility hash and routing read it), so a value written here would be "
                f"overwritten or would break them: remove it from {where}, or use a key of your own domain")
    return None
