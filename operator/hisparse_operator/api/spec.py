"""``HiSparseDeployment.spec``: what users write in hisparse-deployment.yaml."""

from __future__ import annotations

from typing import ClassVar, Literal

from hisparse_runtime.engine import (
    EngineOptions,
    KVTransferSettings,
    ModelSettings,
    RoleOptions,
)
from pydantic import Field

from . import llmd
from ._base import ApiModel, CelRule
from .kube import FreeForm, GatewayRef, Resources, Toleration

DEFAULT_RUNTIME_IMAGE = "ghcr.io/hisparse/runtime:0.1.0-vllm0.33.0"
DEFAULT_MOONCAKE_IMAGE = "ghcr.io/hisparse/runtime:0.1.0-vllm0.33.0"


class EngineSpec(EngineOptions, ApiModel):
    """The serving engine: image and vLLM options common to both roles."""

    image: str = Field(default=DEFAULT_RUNTIME_IMAGE, min_length=1, max_length=512)
    """hisparse runtime image (vLLM 0.33 + HiSparse kernels + entrypoint). Pin a digest in production:
    the image is part of the KV-compatibility hash and of the revision a canary rolls out."""

    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Pull policy of the serving containers."""

    vllm_version: Literal["0.33.0"] = "0.33.0"
    """vLLM version inside the image; the only one this toolkit renders flags for."""


class RoleSpec(RoleOptions, ApiModel):
    """One role (prefill or decode): its engine options plus where and how its pods run."""

    replicas: int = Field(default=1, ge=0, le=512)
    """Engine replicas. Each replica is ``parallelism.nodes`` pods."""

    resources: Resources = Field(default_factory=Resources)
    """CPU, memory and hugepages per pod (GPUs come from ``parallelism.gpusPerNode``)."""

    node_selector: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Node labels the role's pods require."""

    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations (GPU nodes are usually tainted)."""

    affinity: FreeForm | None = None
    """Pod affinity / anti-affinity / node affinity (core/v1 Affinity), as written."""

    topology_spread_constraints: list[FreeForm] = Field(default_factory=list, max_length=8)
    """core/v1 TopologySpreadConstraint list. Multi-node replicas are also kept in one topology
    domain by ``placementTopologyKey``."""

    placement_topology_key: str | None = Field(default=None, max_length=316)
    """For multi-node replicas: keep all pods of a replica in one domain of this node label (e.g. a
    rack or NVLink-domain label), so their all-to-all stays on the fast fabric."""

    priority_class_name: str | None = Field(default=None, max_length=253)
    """PriorityClass of the role's pods."""

    extra_volumes: list[FreeForm] = Field(default_factory=list, max_length=16)
    """Additional pod volumes (core/v1 Volume)."""

    extra_volume_mounts: list[FreeForm] = Field(default_factory=list, max_length=16)
    """Additional mounts for the vLLM container (core/v1 VolumeMount)."""

    shm_size: str = Field(default="64Gi", max_length=16)
    """Size of the memory-backed /dev/shm (NCCL and vLLM workers exchange tensors through it)."""


class PrefillSpec(RoleSpec):
    """The prefill fleet: computes prompts and hands KV to decode over NIXL."""


class DecodeSpec(RoleSpec):
    """The decode fleet: pulls KV over NIXL and decodes with HiSparse, behind the llm-d sidecar."""


class RoutedExpertsSpec(ApiModel):
    enabled: bool = False
    """Return routed experts with responses (``--enable-return-routed-experts``). vLLM refuses it with
    NIXL or Mooncake P/D, so only a decode-only deployment (no prefill role) can turn it on."""


class RoutingSpec(ApiModel):
    """llm-d routing: InferencePool, the endpoint picker (EPP) with the P/D profile, and the sidecar.

    What is rendered for each llm-d release (EPP config group, plugin names, sidecar flags) comes from
    one table, :data:`hisparse_operator.api.llmd.RELEASES`."""

    __cel_rules__: ClassVar = (
        CelRule(
            "!has(self.ssrfProtection) || !self.ssrfProtection || !has(self.sidecarVersion) || "
            f"!({' || '.join(f'self.sidecarVersion == {v!r}' for v in llmd.SIDECARS_WITHOUT_V1_SSRF)})",
            f"the routing sidecar's SSRF guard of llm-d {', '.join(llmd.SIDECARS_WITHOUT_V1_SSRF)} cannot read "
            "the selector of the InferencePool v1 rendered here (v0.4.0 watches only the alpha pool; v0.5.1 "
            "reads the selector as a flat label map), so it would refuse every prefiller and no request "
            "would be disaggregated: set ssrfProtection: false",
            ".ssrfProtection",
        ),
    ) if llmd.SIDECARS_WITHOUT_V1_SSRF else ()

    enabled: bool = True
    """Render the InferencePool, the EPP and the decode routing sidecar."""

    gateway_ref: GatewayRef | None = None
    """Gateway to attach an HTTPRoute to. Unset: no HTTPRoute (attach one yourself)."""

    llmd_version: llmd.LlmdVersion = llmd.DEFAULT_EPP_VERSION
    """llm-d inference-scheduler release the EPP runs: its EndpointPickerConfig (group, plugin names,
    parameters), flags and RBAC are rendered for this release. Must match ``eppImage``."""

    sidecar_version: llmd.LlmdVersion = llmd.DEFAULT_SIDECAR_VERSION
    """llm-d release of the decode routing sidecar (``cmd/pd-sidecar``): its flags are rendered for
    this release. Must match ``sidecarImage``. It may differ from ``llmdVersion``: the two speak only
    the ``x-prefiller-host-port`` header to each other."""

    epp_image: str | None = Field(default=None, max_length=512)
    """EPP image. Unset: ``ghcr.io/llm-d/llm-d-inference-scheduler:<llmdVersion>``."""

    epp_replicas: int = Field(default=1, ge=1, le=16)
    """EPP replicas."""

    sidecar_image: str | None = Field(default=None, max_length=512)
    """Routing sidecar image on decode pods (connector nixlv2). Unset:
    ``ghcr.io/llm-d/llm-d-routing-sidecar:<sidecarVersion>``."""

    pd_threshold_tokens: int = Field(default=512, ge=0, le=1_000_000)
    """Disaggregate only when the uncached part of a prompt is at least this many tokens; shorter
    prompts prefill on decode. The P/D handler of llm-d v0.4.0/v0.5.1 counts prompt characters, so it
    gets this times 4, the inference extension's own characters-per-token estimate. 0: always."""

    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"
    """What the gateway does when the EPP is unavailable."""

    ssrf_protection: bool = False
    """The sidecar only sends prompts to prefillers the InferencePool selects. Off, and refused on, for
    the supported sidecar releases: their guard cannot read an InferencePool v1 selector and would
    refuse every prefiller (see ``api/llmd.py``). Without it, keep the decode pods' port reachable
    only from the gateway (a NetworkPolicy), since the sidecar sends prompts where the header says."""

    @property
    def epp_release(self) -> llmd.LlmdRelease:
        return llmd.release(self.llmd_version)

    @property
    def sidecar_release(self) -> llmd.LlmdRelease:
        return llmd.release(self.sidecar_version)

    @property
    def epp_image_ref(self) -> str:
        return self.epp_image or self.epp_release.epp_image

    @property
    def sidecar_image_ref(self) -> str:
        return self.sidecar_image or self.sidecar_release.sidecar_image


class CanaryStep(ApiModel):
    weight: int = Field(ge=1, le=100)
    """Percent of traffic the candidate revision receives at this step."""
    pause_seconds: int = Field(default=300, ge=0, le=86400)
    """How long to hold the step (watching for errors) before the next one."""


class ParitySpec(ApiModel):
    """The token-parity gate a candidate revision must pass before it receives traffic."""

    enabled: bool = True
    """Gate promotion on greedy token parity over the full prefill -> NIXL -> decode path."""

    prompts: int = Field(default=32, ge=1, le=1024)
    """Prompts to compare (from the built-in set, or ``promptsConfigMap``)."""

    prompts_config_map: str | None = Field(default=None, max_length=253)
    """ConfigMap with a ``prompts.jsonl`` of your own."""

    max_tokens: int = Field(default=128, ge=1, le=8192)
    """Greedy tokens generated per prompt."""

    timeout_seconds: int = Field(default=900, ge=30, le=86400)
    """Give up (and roll back) if parity has not finished in this time."""


class RolloutSpec(ApiModel):
    """How a new revision (image, model revision, engine options) replaces the running one."""

    __cel_rules__: ClassVar = (
        CelRule(
            "!has(self.steps) || size(self.steps) == 0 || (self.steps[size(self.steps) - 1].weight == 100 && "
            "self.steps.all(s, self.steps.exists_one(t, t.weight == s.weight)))",
            "canary steps must have distinct weights and end at weight 100",
            ".steps",
        ),
    )

    strategy: Literal["Canary", "Recreate"] = "Canary"
    """``Canary``: run the candidate as a second full-size fleet beside the stable one (capacity for
    both is needed), gate on token parity, shift traffic by ``steps``, then update the stable fleet and
    remove the candidate; any failure rolls back. ``Recreate``: roll the one fleet in place, a replica
    at a time, without the parity gate."""

    steps: list[CanaryStep] = Field(
        default_factory=lambda: [CanaryStep(weight=10), CanaryStep(weight=50), CanaryStep(weight=100)], max_length=16
    )
    """Traffic steps of a canary, in order; the last must be 100."""

    parity: ParitySpec = Field(default_factory=ParitySpec)
    """Token-parity gate."""


class MonitoringSpec(ApiModel):
    enabled: bool = True
    """Render PodMonitors (Prometheus Operator) for the engines and the EPP."""
    interval: str = Field(default="30s", pattern=r"^[0-9]+(ms|s|m|h)$", max_length=16)
    """Scrape interval."""
    labels: dict[str, str] = Field(default_factory=dict, max_length=16)
    """Extra labels on the PodMonitors (so your Prometheus selects them)."""


class HiSparseDeploymentSpec(ApiModel):
    """A prefill/decode deployment of a DSA model served with HiSparse decode."""

    __cel_rules__: ClassVar = (
        CelRule(
            "!has(self.kvTransfer) || !has(self.kvTransfer.mooncake) || !has(self.kvTransfer.mooncake.enabled) "
            "|| !self.kvTransfer.mooncake.enabled || has(self.prefill)",
            "the Mooncake store runs on the prefill role: add spec.prefill or set kvTransfer.mooncake.enabled: false",
            ".kvTransfer.mooncake.enabled",
        ),
    )

    model: ModelSettings
    """The served model and its DSA sparse-attention facts."""

    engine: EngineSpec = Field(default_factory=EngineSpec)
    """Image and vLLM options for both roles."""

    prefill: PrefillSpec | None = None
    """The prefill fleet. Unset: decode prefills locally (no P/D, no NIXL)."""

    decode: DecodeSpec
    """The decode fleet (HiSparse when ``decode.hisparse`` is set)."""

    kv_transfer: KVTransferSettings = Field(default_factory=KVTransferSettings)
    """NIXL and the optional Mooncake store."""

    routed_experts: RoutedExpertsSpec = Field(default_factory=RoutedExpertsSpec)
    """Routed-experts output."""

    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    """llm-d routing."""

    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """Canary rollout with a token-parity gate."""

    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    """Prometheus scraping."""
