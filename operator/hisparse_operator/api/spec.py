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

from ._base import ApiModel, CelRule
from .kube import FreeForm, GatewayRef, Resources, Toleration

DEFAULT_RUNTIME_IMAGE = "ghcr.io/hisparse/runtime:0.1.0-vllm0.33.0"
DEFAULT_EPP_IMAGE = "ghcr.io/llm-d/llm-d-inference-scheduler:v0.5.0"
DEFAULT_SIDECAR_IMAGE = "ghcr.io/llm-d/llm-d-routing-sidecar:v0.5.0"
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

    # Scaling prefill to zero is refused rather than applied: without prefill, decode pods drop NIXL and
    # the routing sidecar, a new pod template that would restart every decode pod outside the canary gate.
    __cel_rules__: ClassVar = (
        CelRule(
            "!has(self.replicas) || self.replicas >= 1",
            "spec.prefill.replicas 0 would take NIXL and the routing sidecar off every decode pod (decode would prefill "
            "locally), a new decode pod template that restarts every decode pod outside the canary gate: keep at least "
            "1 replica, or remove spec.prefill to run decode-only as a new revision that goes through the rollout",
            ".replicas",
        ),
    )

    replicas: int = Field(default=1, ge=0, le=512)
    """Prefill engine replicas, at least 1 (each replica is ``parallelism.nodes`` pods). Zero is refused:
    it would turn decode into a decode-only fleet (no NIXL, no sidecar) and restart every decode pod;
    to serve without prefill, remove ``spec.prefill``, which is a new revision rolled out like any other."""


class DecodeSpec(RoleSpec):
    """The decode fleet: pulls KV over NIXL and decodes with HiSparse, behind the llm-d sidecar."""


class RoutedExpertsSpec(ApiModel):
    enabled: bool = False
    """Return routed experts with responses (``--enable-return-routed-experts``). vLLM refuses it with
    NIXL or Mooncake P/D, so only a decode-only deployment (no prefill role) can turn it on."""


class RoutingSpec(ApiModel):
    """llm-d routing: InferencePool, the endpoint picker (EPP) with the P/D profile, and the sidecar."""

    enabled: bool = True
    """Render the InferencePool, the EPP and the decode routing sidecar."""

    gateway_ref: GatewayRef | None = None
    """Gateway to attach an HTTPRoute to. Unset: no HTTPRoute (attach one yourself)."""

    epp_image: str = Field(default=DEFAULT_EPP_IMAGE, max_length=512)
    """llm-d inference scheduler image (the EPP)."""

    epp_replicas: int = Field(default=1, ge=1, le=16)
    """EPP replicas."""

    sidecar_image: str = Field(default=DEFAULT_SIDECAR_IMAGE, max_length=512)
    """llm-d routing sidecar image on decode pods (``cmd/pd-sidecar``, connector nixlv2)."""

    pd_threshold_tokens: int = Field(default=512, ge=0, le=1_000_000)
    """Disaggregate only when the uncached part of a prompt is at least this many tokens
    (``prefix-based-pd-decider`` ``nonCachedTokens``); shorter prompts prefill on decode."""

    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"
    """What the gateway does when the EPP is unavailable."""

    ssrf_protection: bool = True
    """The sidecar only sends prompts to prefillers the InferencePool selects."""


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
