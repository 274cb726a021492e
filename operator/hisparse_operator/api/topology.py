"""Production topology of a role's pods: RDMA devices, Multus networks, DRA claims, the runtime class, the
scheduler and gang scheduling, extra pod labels and annotations.

Every field is optional and renders nothing when unset. Each is rendered where its project documents it
(docs/guides/production-topology.md): Multus reads a pod annotation; a device plugin's resource is a
container request and limit; DRA claims are ``spec.resourceClaims`` plus the container's
``resources.claims``; Kueue reads a label on the workload (the LeaderWorkerSet or Deployment); Volcano
gang-schedules each LWS group through the PodGroup LWS creates when its manager runs with
``gangSchedulingManagement.schedulerProvider: volcano``, and reads the queue from the LWS's annotations.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Final

from hisparse_runtime.engine.kube import (
    Dns1123Label,
    Dns1123Subdomain,
    ExtendedResourceName,
    LabelValue,
    checked,
    qualified_name_problem,
)
from pydantic import Field

from . import labels as L
from ._base import ApiModel, CelRule
from .kube import GPU_RESOURCE, Namespace

DEFAULT_SCHEDULER: Final = "default-scheduler"
"""The name kube-scheduler serves (a pod without ``schedulerName`` gets it)."""

VOLCANO_SCHEDULER: Final = "volcano"
"""The scheduler name Volcano's scheduler registers by default; a role with ``gangScheduling.volcano`` and no
``schedulerName`` of its own is rendered with it."""

MAX_ANNOTATION_VALUE: Final = 4096
"""Longest value of one ``podAnnotations`` entry (32 of them stay well inside the apiserver's 256 KiB for
all of an object's annotations)."""


def _pod_label_key_problem(key: str) -> str | None:
    return L.owned_pod_key_problem(key, "podLabels")


def _pod_annotation_key_problem(key: str) -> str | None:
    return L.owned_pod_key_problem(key, "podAnnotations")


PodLabelKey = Annotated[str, checked(qualified_name_problem), checked(_pod_label_key_problem)]
"""A label key a user may put on a role's pods: a qualified name the operator does not own."""
PodAnnotationKey = Annotated[str, checked(qualified_name_problem), checked(_pod_annotation_key_problem)]
"""An annotation key a user may put on a role's pods: a qualified name the operator does not own."""


class RdmaSpec(ApiModel):
    """RDMA devices each pod of the role requests from a device plugin (UCX ``rc``/``dc`` for NIXL, Mooncake
    over RDMA, DeepEP's inter-node all-to-all). Rendered as a request and limit of the vLLM container."""

    __cel_rules__: ClassVar = (
        CelRule(
            f"self.resourceName != {GPU_RESOURCE!r}",
            f"rdma.resourceName {GPU_RESOURCE} is the GPU resource, which parallelism.gpusPerNode already requests: "
            "name the RDMA device plugin's resource (for example rdma/hca_shared_devices_a)",
            ".resourceName",
        ),
    )

    resource_name: ExtendedResourceName
    """The resource the device plugin advertises in a Node's allocatable resources: for example
    ``rdma/hca_shared_devices_a`` (k8s-rdma-shared-dev-plugin, as the NVIDIA Network Operator deploys it) or an
    SR-IOV virtual function pool such as ``nvidia.com/sriov_rdma_vf`` (SR-IOV network device plugin). With node
    facts, a name no node the role can land on offers is refused."""

    count: int = Field(default=1, ge=1, le=64)
    """Units per pod (requests = limits: extended resources cannot be overcommitted). A shared-device plugin
    grants every device of its pool for one unit; an SR-IOV pool grants one virtual function per unit.
    Preflight checks the pod sees at least this many RDMA verbs devices."""


class NetworkAttachment(ApiModel):
    """A Multus NetworkAttachmentDefinition to attach to each pod as a secondary interface."""

    name: Dns1123Subdomain
    """Name of the NetworkAttachmentDefinition."""
    namespace: Namespace | None = None
    """Its namespace; unset: the pod's own."""
    interface: str | None = Field(default=None, max_length=15, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")
    """Interface name inside the pod (at most 15 characters, Linux's limit); unset: Multus names it
    (``net1``, ``net2``, ...)."""


class ResourceClaimRef(ApiModel):
    """A Dynamic Resource Allocation claim of each pod (``resource.k8s.io/v1``, GA in Kubernetes 1.34)."""

    __cel_rules__: ClassVar = (
        CelRule(
            "has(self.resourceClaimName) != has(self.resourceClaimTemplateName)",
            "a resource claim names exactly one of resourceClaimName (one existing ResourceClaim, shared by every "
            "pod of the role) or resourceClaimTemplateName (a ResourceClaimTemplate: each pod gets a claim of its "
            "own); Kubernetes refuses a pod with both or neither: set one",
        ),
    )

    name: Dns1123Label
    """Name of the claim inside the pod (the pod's resourceClaims entry); the vLLM container uses it."""
    resource_claim_name: Dns1123Subdomain | None = None
    """An existing ResourceClaim in the deployment's namespace, shared by all the role's pods."""
    resource_claim_template_name: Dns1123Subdomain | None = None
    """A ResourceClaimTemplate: the pod gets a claim generated from it, deleted with the pod."""
    request: Dns1123Label | None = None
    """Only this request of the claim is given to the vLLM container; unset: all of them."""


class KueueGang(ApiModel):
    """Admission by Kueue (its ``leaderworkerset.x-k8s.io/leaderworkerset`` and ``deployment`` integrations must
    be enabled in Kueue's configuration)."""

    queue_name: Dns1123Label
    """The LocalQueue in the deployment's namespace. Rendered as the ``kueue.x-k8s.io/queue-name`` label of the
    LeaderWorkerSet (each group is one Kueue workload, admitted whole: its pods stay gated until quota for
    every pod of the group is reserved) or of the Deployment (each pod is a workload)."""


class VolcanoGang(ApiModel):
    """Gang scheduling by Volcano. For a multi-node role the LWS controller manager must run with
    ``gangSchedulingManagement.schedulerProvider: volcano``: it then creates one PodGroup per group, whose
    ``minMember`` is the group size (the rendered ``startupPolicy`` is ``LeaderCreated``)."""

    queue: Dns1123Subdomain | None = None
    """Volcano queue; unset: Volcano's ``default`` queue. Rendered as ``scheduling.volcano.sh/queue-name``: on
    the LeaderWorkerSet (LWS copies it into each PodGroup) or on a Deployment's pod template."""


class GangScheduling(ApiModel):
    """Schedule each replica's pods all or nothing, so a group that cannot fit whole does not hold GPUs on
    the nodes it did get. Exactly one of ``kueue`` or ``volcano``."""

    __cel_rules__: ClassVar = (
        CelRule(
            "has(self.kueue) != has(self.volcano)",
            "gangScheduling sets exactly one of kueue or volcano: the two would each hold the pods back for their "
            "own admission and no pod would start; keep the one your cluster runs",
        ),
    )

    kueue: KueueGang | None = None
    """Kueue admits each group whole from a LocalQueue (pods keep the default scheduler, or ``schedulerName``)."""
    volcano: VolcanoGang | None = None
    """Volcano's scheduler places each group through a PodGroup (``schedulerName`` defaults to ``volcano``)."""

AnnotationValue = Annotated[str, Field(max_length=MAX_ANNOTATION_VALUE)]
"""The value of one ``podAnnotations`` entry."""

__all__ = [
    "AnnotationValue", "DEFAULT_SCHEDULER", "Dns1123Subdomain", "GangScheduling", "KueueGang", "NetworkAttachment", "PodAnnotationKey",
    "PodLabelKey", "RdmaSpec", "ResourceClaimRef", "VOLCANO_SCHEDULER", "VolcanoGang",
]
