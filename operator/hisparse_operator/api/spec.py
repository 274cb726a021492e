"""``HiSparseDeployment.spec``: what users write in hisparse-deployment.yaml."""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, Literal, get_args

from hisparse_runtime.engine import (
    DEPRECATED_CACHE_MODES,
    POD_FETCH_MODES,
    EngineOptions,
    KVTransferSettings,
    ModelCacheMode,
    ModelCacheSettings,
    ModelSettings,
    RoleOptions,
)
from pydantic import Field

from . import llmd, topology as T
from ._base import ApiModel, CelRule
from hisparse_runtime.engine.kube import LabelKey, LabelValue, QuantityString

from .kube import Cidr, FreeForm, GatewayRef, LabelMap, Namespace, Resources, Toleration

DEFAULT_RUNTIME_IMAGE = "ghcr.io/hisparse/runtime:0.1.0-vllm0.33.0"
DEFAULT_MOONCAKE_IMAGE = "ghcr.io/hisparse/runtime:0.1.0-vllm0.33.0"
PRE_STOP_SLEEP_SECONDS: Final = 10
"""How long a deleted pod that takes requests (a serving pod, an EPP) keeps taking them while the pickers,
kube-proxy and gateways, which learn of the deletion through their watches, drop it."""


class ModelSpec(ModelSettings, ApiModel):
    """The served model: its source, the pinned revision, where the weights are cached, the credentials
    to fetch them, and the DSA sparse-attention facts preflight checks against its config.json."""

    __cel_rules__: ClassVar = (
        CelRule(
            "!self.source.startsWith('hf://') || has(self.revision)",
            "an hf:// model needs a revision: the cache is filled at it and every pod must load the same bytes "
            "(without one, pods started on different days could load different commits): set spec.model.revision "
            "to the commit sha to serve",
            ".revision",
        ),
        CelRule(
            "!has(self.revision) || !self.revision.startsWith('-')",
            "a revision starting with '-' is read as an option by the download Job's fetch-model and by vllm serve, "
            "not as a revision (and no git branch, tag or commit starts with '-'): set spec.model.revision to the "
            "commit sha to serve",
            ".revision",
        ),
        CelRule(
            "!self.source.startsWith('hf://') || has(self.sizeGiB)",
            "an hf:// model needs sizeGiB, the size of its files: the cache volume (and, with cache.mode PodEphemeral, "
            "each pod's ephemeral-storage request) is sized from it, and an unsized download fills the node's disk "
            "until the kubelet evicts the pod: set spec.model.sizeGiB (the hub's file list gives the total)",
            ".sizeGiB",
        ),
        CelRule(
            "!has(self.sizeGiB) || !has(self.cache) || !has(self.cache.sizeGiB) || self.cache.sizeGiB >= self.sizeGiB",
            "cache.sizeGiB is smaller than the model's sizeGiB: the download Job would fail with a full volume and "
            "no pod would start; raise cache.sizeGiB to at least sizeGiB (unset: twice sizeGiB plus 10%)",
            ".cache.sizeGiB",
        ),
        CelRule(
            "!has(self.cache) || !has(self.cache.mode) || self.cache.mode == 'SharedVolume' || "
            "(!has(self.cache.storageClassName) && !has(self.cache.sizeGiB))",
            "cache.storageClassName and cache.sizeGiB size the SharedVolume claim; with cache.mode NodeCache the "
            "node's directory holds the model and with PodEphemeral (NodeLocal) each pod's ephemeral volume, sized "
            "from sizeGiB, so they would be ignored: remove them or use mode SharedVolume",
            ".cache.mode",
        ),
        CelRule(
            "!has(self.cache) || !has(self.cache.nodePath) || (has(self.cache.mode) && self.cache.mode == 'NodeCache')",
            "cache.nodePath is the node's directory of cache.mode NodeCache; with another mode no pod mounts it, so it "
            "would be ignored: remove it or set spec.model.cache.mode: NodeCache",
            ".cache.nodePath",
        ),
        CelRule(
            "self.source.startsWith('hf://') || !has(self.cache) || (!has(self.cache.storageClassName) && "
            "!has(self.cache.sizeGiB) && !has(self.cache.nodePath) && (!has(self.cache.mode) || self.cache.mode == 'SharedVolume'))",
            "the model cache is for hf:// sources: a pvc:// model is mounted as it is and an s3:// model is streamed "
            "into GPU memory by vLLM's run:ai streamer, so these cache settings would be ignored; remove "
            "spec.model.cache",
            ".cache",
        ),
        CelRule(
            "self.source.startsWith('hf://') || !has(self.endpoint)",
            "endpoint is the hub an hf:// model is downloaded from (HF_ENDPOINT): a pvc:// model is mounted and an "
            "s3:// model is streamed from its bucket, so it would be ignored; remove spec.model.endpoint",
            ".endpoint",
        ),
        CelRule(
            "!self.source.startsWith('pvc://') || !has(self.credentials)",
            "a pvc:// model is a volume the pods mount: there is nothing to authenticate to, and credentials would be "
            "ignored; remove spec.model.credentials",
            ".credentials",
        ),
    )

    cache: ModelCacheSettings = Field(default_factory=ModelCacheSettings)  # type: ignore[assignment]
    """Model cache of an ``hf://`` source: ``SharedVolume`` (default: one ReadWriteMany claim per
    deployment, filled once per revision by a download Job before any serving pod is created), ``NodeCache``
    (a directory on each node that outlives the pods: a pod downloads only what its node lacks) or
    ``PodEphemeral``, earlier ``NodeLocal`` (each pod downloads into its own ephemeral volume). Not used by
    ``pvc://`` (a volume already) nor ``s3://`` (streamed into GPU memory by vLLM's run:ai streamer)."""


class EngineSpec(EngineOptions, ApiModel):
    """The serving engine: image and vLLM options common to both roles."""

    image: str = Field(default=DEFAULT_RUNTIME_IMAGE, min_length=1, max_length=512)
    """hisparse runtime image (vLLM 0.33 + HiSparse kernels + entrypoint). Pin a digest in production:
    the image is part of the KV-compatibility hash and of the revision a canary rolls out."""

    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Pull policy of the serving containers."""

    vllm_version: Literal["0.33.0"] = "0.33.0"
    """vLLM version inside the image; the only one this toolkit renders flags for."""

    ipc_lock: bool = True
    """Keep the ``IPC_LOCK`` capability on the vLLM container: RDMA registration of the pinned host pool and
    NIXL buffers counts against RLIMIT_MEMLOCK unless the process holds it. containerd and CRI-O give a
    non-root process added capabilities in its bounding set only, not its effective set, so for the
    image's non-root user the node's memlock limit must cover the pools (containerd's
    ``LimitMEMLOCK=infinity``); preflight checks the limit and the effective capabilities. With it, serving pods need a
    namespace whose Pod Security level is ``privileged`` (baseline allows no added capability but the
    default set). Turn it off where the node's runtime gives containers an unlimited memlock limit (preflight
    checks the limit either way): the vLLM container then meets the ``restricted`` standard."""


class RoleSpec(RoleOptions, ApiModel):
    """One role (prefill or decode): its engine options plus where and how its pods run."""

    __cel_rules__: ClassVar = (
        CelRule(
            "!has(self.rdma) || !has(self.resources) || "
            "((!has(self.resources.requests) || !(self.rdma.resourceName in self.resources.requests)) && "
            "(!has(self.resources.limits) || !(self.rdma.resourceName in self.resources.limits)))",
            "rdma.resourceName is also set in resources: the RDMA request is rendered from rdma.count (requests and "
            "limits alike), and two sources for one resource would disagree: remove it from resources",
            ".rdma",
        ),
        CelRule(
            "!has(self.resourceClaims) || self.resourceClaims.all(c, self.resourceClaims.exists_one(d, d.name == c.name))",
            "two resourceClaims have one name: a pod's claims are keyed by name, and Kubernetes refuses the pod: "
            "rename one",
            ".resourceClaims",
        ),
        CelRule(
            "!has(self.gangScheduling) || !has(self.gangScheduling.volcano) || !has(self.schedulerName) || "
            f"self.schedulerName != {T.DEFAULT_SCHEDULER!r}",
            f"gangScheduling.volcano with schedulerName {T.DEFAULT_SCHEDULER}: the default scheduler does not read "
            "Volcano's PodGroups, so each group would be scheduled pod by pod, not whole: remove schedulerName (the "
            f"pods get {T.VOLCANO_SCHEDULER!r}) or set the name your Volcano scheduler runs under",
            ".schedulerName",
        ),
    )

    replicas: int = Field(default=1, ge=0, le=512)
    """Engine replicas. Each replica is ``parallelism.nodes`` pods."""

    resources: Resources = Field(default_factory=Resources)
    """CPU, memory and hugepages per pod (GPUs come from ``parallelism.gpusPerNode``)."""

    node_selector: LabelMap = Field(default_factory=dict, max_length=32)
    """Node labels the role's pods require."""

    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations (GPU nodes are usually tainted)."""

    affinity: FreeForm | None = None
    """Pod affinity / anti-affinity / node affinity (core/v1 Affinity), as written."""

    topology_spread_constraints: list[FreeForm] = Field(default_factory=list, max_length=8)
    """core/v1 TopologySpreadConstraint list. Multi-node replicas are also kept in one topology
    domain by ``placementTopologyKey``."""

    placement_topology_key: LabelKey | None = Field(default=None, max_length=316)
    """For multi-node replicas: keep all pods of a replica in one domain of this node label (e.g. a
    rack or NVLink-domain label), so their all-to-all stays on the fast fabric."""

    priority_class_name: str | None = Field(default=None, max_length=253)
    """PriorityClass of the role's pods."""

    extra_volumes: list[FreeForm] = Field(default_factory=list, max_length=16)
    """Additional pod volumes (core/v1 Volume)."""

    extra_volume_mounts: list[FreeForm] = Field(default_factory=list, max_length=16)
    """Additional mounts for the vLLM container (core/v1 VolumeMount)."""

    shm_size: QuantityString = Field(default="64Gi", max_length=16)
    """Size of the memory-backed /dev/shm (NCCL and vLLM workers exchange tensors through it)."""

    pre_stop_sleep_seconds: int = Field(default=PRE_STOP_SLEEP_SECONDS, ge=0, le=600)
    """Seconds a deleted pod keeps serving before its engine gets SIGTERM (a ``preStop`` sleep), so that the
    EPP, kube-proxy and gateways, which learn of the deletion through their watches, stop sending it new
    requests before it stops taking them. Without it, a request routed in that window meets a draining
    server (503). 0: SIGTERM at once. Added to ``terminationGracePeriodSeconds``. Part of the pod template:
    a change is a new revision."""

    # Production topology (api/topology.py): each renders nothing when unset.
    runtime_class_name: T.Dns1123Subdomain | None = None
    """RuntimeClass of the role's pods (for example ``nvidia`` where the NVIDIA container runtime is not the
    node's default)."""

    scheduler_name: T.Dns1123Subdomain | None = None
    """Scheduler of the role's pods; unset: the default scheduler (``volcano`` with ``gangScheduling.volcano``).
    A name no scheduler serves leaves every pod Pending with no event."""

    gang_scheduling: T.GangScheduling | None = None
    """All-or-nothing scheduling of each replica's pods through Kueue or Volcano. Without it, the pods of a
    multi-node replica are scheduled one by one, and a group that only partly fits holds GPUs it cannot use."""

    pod_labels: dict[T.PodLabelKey, LabelValue] = Field(default_factory=dict, max_length=32)
    """Extra labels on the role's pods. Keys the operator, llm-d or LWS set are refused. Part of the pod
    template: a change is a new revision."""

    pod_annotations: dict[T.PodAnnotationKey, T.AnnotationValue] = Field(
        default_factory=dict, max_length=32)
    """Extra annotations on the role's pods. Keys rendered from typed fields (Multus networks, the Volcano
    queue) and the operator's, llm-d's and LWS's prefixes are refused."""

    networks: list[T.NetworkAttachment] = Field(default_factory=list, max_length=8)
    """Multus secondary networks of each pod (for example the RDMA fabric's NetworkAttachmentDefinitions),
    rendered as the ``k8s.v1.cni.cncf.io/networks`` annotation."""

    rdma: T.RdmaSpec | None = None
    """RDMA devices per pod, from a device plugin."""

    resource_claims: list[T.ResourceClaimRef] = Field(default_factory=list, max_length=8)
    """DRA claims of each pod, all given to the vLLM container."""


class PrefillSpec(RoleSpec):
    """The prefill fleet: computes prompts and hands KV to decode over NIXL."""

    # Scaling prefill to zero is refused rather than applied: without prefill, decode pods drop NIXL and
    # the routing sidecar, a new pod template that would restart every decode pod outside the canary gate.
    __cel_rules__: ClassVar = (
        *RoleSpec.__cel_rules__,
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
    """Return routed experts with responses (``--enable-return-routed-experts``). vLLM refuses it beside
    a NIXL (or MooncakeConnector) P/D connector, so only a decode-only deployment (no prefill role; with
    HiSparse and/or ``decode.cpuOffload``) can turn it on, and only with prefix caching on."""


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
    """Render the InferencePool, the EPP and the decode routing sidecar. False only without ``spec.prefill``:
    the sidecar is what sends prompts to prefill, so a P/D deployment without it is refused."""

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

    epp_replicas: int = Field(default=2, ge=1, le=16)
    """EPP replicas, all serving (active-active), spread over nodes and zones, one at a time disrupted (a
    PodDisruptionBudget from 2). Each keeps its own prefix-cache index of the requests it routed. 1: the
    EPP is a single point of failure (with ``failureMode: FailClose`` every request fails while it
    restarts)."""

    sidecar_image: str | None = Field(default=None, max_length=512)
    """Routing sidecar image on decode pods (connector nixlv2). Unset:
    ``ghcr.io/llm-d/llm-d-routing-sidecar:<sidecarVersion>``."""

    pd_threshold_tokens: int = Field(default=512, ge=0, le=1_000_000)
    """Disaggregate only when the uncached part of a prompt is at least this many tokens; shorter
    prompts prefill on decode. The P/D handler of llm-d v0.4.0/v0.5.1 counts prompt characters, so it
    gets this times 4, the inference extension's own characters-per-token estimate. 0: always."""

    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"
    """What the gateway does when the EPP is unavailable."""

    epp_resources: Resources = Field(default_factory=lambda: Resources(requests={"cpu": "2", "memory": "2Gi"},
                                                                        limits={"memory": "4Gi"}))
    """CPU and memory of each EPP pod (it tokenizes prompts for prefix-aware scoring)."""

    sidecar_resources: Resources = Field(default_factory=lambda: Resources(requests={"cpu": "1", "memory": "1Gi"},
                                                                            limits={"memory": "1Gi"}))
    """CPU and memory of the routing sidecar on each decode pod. Part of the decode pod template: a change
    is a new revision."""

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


class PauseStep(ApiModel):
    seconds: int | None = Field(default=None, ge=0, le=86400)
    """Hold this long; unset: hold until ``hisparse rollout promote`` (or the promote annotation)."""


class AnalysisQuery(ApiModel):
    """One PromQL query, its threshold, and how often it is measured (Argo Rollouts' metric: ``count``
    measurements ``intervalSeconds`` apart, ``failureLimit``, ``inconclusiveLimit``,
    ``consecutiveErrorLimit``). The query may use ``{{revision}}``, ``{{pods}}`` (a regex of the fleet's
    serving pod names), ``{{namespace}}`` and ``{{name}}``; it is run for the candidate and, for
    ``maxRatioToStable``, again for the stable revision. It must give one number.

    Each measurement is passed (within the threshold), failed (outside it), inconclusive (no data: an
    empty vector or NaN, unless ``emptyResult`` says failed) or an error (Prometheus unreachable or
    refusing the query, a result that is not one number). Errors are retried at the interval and do not
    count toward ``count``."""

    __cel_rules__: ClassVar = (
        CelRule("has(self.max) || has(self.min) || has(self.maxRatioToStable)",
                "an analysis query needs a threshold: max, min or maxRatioToStable"),
        CelRule("self.failureLimit + self.inconclusiveLimit < self.count",
                "failureLimit + inconclusiveLimit must be below count: a pass needs at least one measurement within "
                "the threshold (with failureLimit >= count every measurement could fail and the analysis still pass); "
                "raise count above failureLimit + inconclusiveLimit, or lower the limits",
                field_path=".failureLimit",
                python_message="'failureLimit (' + string(self.failureLimit) + ') + inconclusiveLimit (' + "
                                   "string(self.inconclusiveLimit) + ') must be below count (' + string(self.count) + "
                                   "'): a pass needs at least one measurement within the threshold (with failureLimit "
                                   ">= count every measurement could fail and the analysis still pass); set count to ' + "
                                   "string(self.failureLimit + self.inconclusiveLimit + 1) + ' or more, or lower the limits'"),
    )

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Name in status and Events (unique within the step)."""
    query: str = Field(min_length=1, max_length=4096)
    """PromQL evaluated as an instant query. To read no data as a number, say so in the query
    (``... or vector(0)``)."""
    max: float | None = None
    """Fail when the candidate's value is above this."""
    min: float | None = None
    """Fail when the candidate's value is below this."""
    max_ratio_to_stable: float | None = Field(default=None, gt=0)
    """Fail when the candidate's value is above this multiple of the stable revision's (e.g. 1.2 for
    an inter-token latency p99 at most 20% worse). A stable value of 0 compares as absolute ``max`` 0."""
    count: int = Field(default=1, ge=1, le=1000)
    """Measurements to take (errors are not measurements); the query passes once ``count`` are taken
    within the limits below."""
    interval_seconds: int = Field(default=60, ge=1, le=86400)
    """Seconds between measurements, and between retries after an error."""
    failure_limit: int = Field(default=0, ge=0, le=100)
    """Failed measurements tolerated; one more fails the analysis (the candidate rolls back at once)."""
    inconclusive_limit: int = Field(default=0, ge=0, le=100)
    """Inconclusive measurements tolerated; one more makes the analysis inconclusive (the rollout holds
    for ``promote``, or ``resume`` to measure again, or ``abort``)."""
    consecutive_error_limit: int = Field(default=4, ge=0, le=100)
    """Errors in a row tolerated (each retried after ``intervalSeconds``); one more fails the analysis."""
    empty_result: Literal["Inconclusive", "Failed"] = "Inconclusive"
    """What a measurement with no data (an empty vector, NaN) is. Never a pass."""


class AnalysisStep(ApiModel):
    """Metric analysis at the current weight: every query is measured ``count`` times; passed (next
    step) once each has, failed (rollback) as soon as one fails, inconclusive (the rollout holds until
    ``promote``, ``resume`` or ``abort``) once each is done and one of them is."""

    __cel_rules__: ClassVar = (
        CelRule("self.queries.all(q, self.queries.exists_one(p, p.name == q.name))",
                "the queries of an analysis step need distinct names (status counts measurements by name): rename one",
                field_path=".queries"),
    )

    prometheus_url: str | None = Field(default=None, max_length=512, pattern=r"^https?://")
    """Prometheus base URL; unset: the operator's ``HISPARSE_PROMETHEUS_URL`` (chart value
    ``prometheusUrl``). With neither, the step is refused."""
    queries: list[AnalysisQuery] = Field(min_length=1, max_length=16)
    """Every query must pass."""
    delay_seconds: int = Field(default=300, ge=0, le=86400)
    """Traffic time at the current weight before the first measurement (the window it looks at)."""

    def prometheus(self, operator_default: str | None) -> str | None:
        """The Prometheus this step queries: its own, else the operator's."""
        return self.prometheus_url or operator_default


class CanaryStep(ApiModel):
    """One step: a ``weight`` (held ``pauseSeconds``), a ``pause``, or an ``analysis``."""

    __cel_rules__: ClassVar = (
        CelRule("(has(self.weight) ? 1 : 0) + (has(self.pause) ? 1 : 0) + (has(self.analysis) ? 1 : 0) == 1",
                "a canary step sets exactly one of weight, pause or analysis"),
    )

    weight: int | None = Field(default=None, ge=1, le=100)
    """Percent of each role's replicas (and so of the traffic, which follows ready capacity) the
    candidate revision serves at this step; at least the canary's own size."""
    pause_seconds: int = Field(default=300, ge=0, le=86400)
    """With ``weight``: how long to hold the step (watching for errors) before the next one."""
    pause: PauseStep | None = None
    """Hold, for ``seconds`` or until promoted."""
    analysis: AnalysisStep | None = None
    """Query Prometheus and compare with thresholds."""


class CanarySize(ApiModel):
    """Replicas of each role the candidate starts with (a multi-node role's replica is one whole group)."""

    prefill: int = Field(default=1, ge=1, le=64)
    """Candidate prefill replicas (at most the role's own count)."""
    decode: int = Field(default=1, ge=1, le=64)
    """Candidate decode replicas (at most the role's own count). Promotion also surges by this much."""


class ParitySpec(ApiModel):
    """The token-parity gate a candidate revision must pass before it receives traffic."""

    __cel_rules__: ClassVar = (
        CelRule("!has(self.minTokens) || self.minTokens <= self.prompts * self.maxTokens",
                "minTokens is more than prompts x maxTokens, so no run could ever compare enough tokens and every "
                "canary would be rolled back: lower minTokens (or leave it unset for a quarter of the budget), "
                "or raise prompts or maxTokens", ".minTokens"),
    )

    enabled: bool = True
    """Gate promotion on greedy token parity over the full prefill -> NIXL -> decode path."""

    prompts: int = Field(default=32, ge=1, le=1024)
    """Prompts to compare (from the built-in set, or ``promptsConfigMap``). A verdict that compared fewer
    is a failure."""

    prompts_config_map: str | None = Field(default=None, max_length=253)
    """ConfigMap with a ``prompts.jsonl`` of your own."""

    max_tokens: int = Field(default=128, ge=1, le=8192)
    """Greedy tokens generated per prompt."""

    top_logprobs: int = Field(default=5, ge=2, le=20)
    """Top-k logprobs returned per generated token; the near-tie rule reads the top two."""

    near_tie_epsilon: float = Field(default=0.02, ge=0, le=1)
    """A divergence where *both* revisions' top-2 logprob margins are below this (nats), each picking one
    of the other's top two, is a near-tie, not a failure: the comparison goes on from the stable's token
    (0: exact tokens only)."""

    max_near_tie_fraction: float = Field(default=0.1, ge=0, le=1)
    """Fail when more than this fraction of the compared prompts had a near-tie: ties that frequent are a
    numerics change, not noise (0: any near-tie fails)."""

    min_tokens: int | None = Field(default=None, ge=0, le=8388608)
    """Fail when fewer generated tokens than this were compared in all (ties and their continuations
    included). Unset: a quarter of ``prompts`` x ``maxTokens``; at most that product."""

    concurrency: int = Field(default=4, ge=1, le=64)
    """Prompts in flight at once on each revision. Where the engine's numerics depend on batch composition
    (vLLM's sparse MLA backends offer no batch invariance), 1 compares each prompt alone on both sides."""

    timeout_seconds: int = Field(default=900, ge=30, le=86400)
    """Give up (and roll back) if the comparison has not finished this long after the candidate was
    ready (model load is not counted: see ``rollout.readyTimeoutSeconds``)."""


DEFAULT_READY_TIMEOUT_SECONDS: Final = 4500
DEFAULT_PROGRESS_DEADLINE_SECONDS: Final = 600
"""``rollout.progressDeadlineSeconds`` when unset (or ``readyTimeoutSeconds``, if shorter)."""


class RolloutSpec(ApiModel):
    """How a new revision (whatever shapes serving pods) replaces the running one."""

    __cel_rules__: ClassVar = (
        CelRule("!has(self.progressDeadlineSeconds) || self.progressDeadlineSeconds <= "
                f"(has(self.readyTimeoutSeconds) ? self.readyTimeoutSeconds : {DEFAULT_READY_TIMEOUT_SECONDS})",
                "progressDeadlineSeconds is longer than readyTimeoutSeconds, so a candidate pod that cannot pull its "
                "image or crash-loops would be rolled back by the ready timeout first and the deadline would never "
                "act: set spec.rollout.progressDeadlineSeconds to at most readyTimeoutSeconds (or remove it: 600 s, "
                "or readyTimeoutSeconds if shorter)",
                field_path=".progressDeadlineSeconds"),
    )

    strategy: Literal["Canary", "Recreate"] = "Canary"
    """``Canary``: start ``canary`` replicas of the candidate beside the stable fleet, gate on token
    parity, then replace stable replicas by candidate ones step by step (surging by at most the canary's
    size) while traffic follows each revision's ready capacity; any failure rolls back. ``Recreate``:
    roll the one fleet in place, a replica at a time, without the parity gate."""

    canary: CanarySize = Field(default_factory=CanarySize)
    """Size of the candidate before promotion, and the surge of every replacement step."""

    steps: list[CanaryStep] = Field(
        default_factory=lambda: [CanaryStep(weight=10), CanaryStep(weight=50)], max_length=16
    )
    """Steps after parity, in order; after the last one the candidate is ramped to every replica and
    promoted."""

    parity: ParitySpec = Field(default_factory=ParitySpec)
    """Token-parity gate."""

    ready_timeout_seconds: int = Field(default=DEFAULT_READY_TIMEOUT_SECONDS, ge=60, le=86400)
    """Roll back (hold, once promoting) when replicas asked for are not ready within this time: the
    serving pods' startup budget (an hour of model load and CUDA-graph capture) plus scheduling."""

    progress_deadline_seconds: int | None = Field(default=None, ge=30, le=86400)
    """Roll back (report ``CanaryPromotionStalled``, once promoting) a candidate whose pod has definitely
    failed for this long without a break: a container waiting in ``CrashLoopBackOff``,
    ``ImagePullBackOff``, ``ErrImagePull``, ``InvalidImageName``, ``CreateContainerConfigError`` or
    ``CreateContainerError``, one that has exited non-zero three times and is not ready, or a pod the
    scheduler reports ``Unschedulable`` (the time a cluster autoscaler takes to add a node counts). A
    pod that runs and is not ready yet (its model loading) never counts; that is
    ``readyTimeoutSeconds``'s. At most ``readyTimeoutSeconds``; unset: 600, or ``readyTimeoutSeconds``
    if that is shorter."""

    scale_down_delay_seconds: int = Field(default=30, ge=0, le=3600)
    """Time between taking replicas out of the route's capacity and removing them (in-flight requests
    finish), and before the candidate's emptied fleet is pruned."""

    @property
    def progress_deadline(self) -> int:
        """``progressDeadlineSeconds`` as it acts (its default resolved)."""
        if self.progress_deadline_seconds is not None:
            return self.progress_deadline_seconds
        return min(DEFAULT_PROGRESS_DEADLINE_SECONDS, self.ready_timeout_seconds)


class EppMetricsAuth(ApiModel):
    """The credential Prometheus presents to the EPP's authenticated ``/metrics``."""

    token_secret_name: str = Field(max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """Secret in the deployment's namespace holding a bearer token (for example the
    ``kubernetes.io/service-account-token`` Secret of a ServiceAccount there) whose identity may ``get``
    the non-resource URL ``/metrics``. The EPP's PodMonitor sends it; the EPP checks it with a
    TokenReview and a SubjectAccessReview."""
    token_secret_key: str = Field(default="token", max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key of the token in that Secret."""


class MonitoringSpec(ApiModel):
    enabled: bool = True
    """Render PodMonitors (Prometheus Operator) for the engines and the EPP."""
    interval: str = Field(default="30s", pattern=r"^[0-9]+(ms|s|m|h)$", max_length=16)
    """Scrape interval."""
    labels: LabelMap = Field(default_factory=dict, max_length=16)
    """Extra labels on the PodMonitors (so your Prometheus selects them)."""
    epp_metrics_auth: EppMetricsAuth | None = None
    """Unset: the EPP serves ``/metrics`` without authentication (``--metrics-endpoint-auth=false``), as
    vLLM and the sidecar serve theirs; the NetworkPolicies admit only the monitoring namespaces to its
    metrics port. Set: the EPP authenticates every scrape (upstream's default), and its ServiceAccounts
    (``<name>-epp``, and ``<name>-canary-epp`` while a canary runs) must be allowed to create
    TokenReviews and SubjectAccessReviews, a cluster-scoped grant the operator does not hold: bind them
    to the built-in ClusterRole ``system:auth-delegator`` (README, "Monitoring")."""


_POD_FETCH_MODE_NAMES: Final = [m for m in get_args(ModelCacheMode) if DEPRECATED_CACHE_MODES.get(m, m) in POD_FETCH_MODES]
TcpUdpPort = Annotated[int, Field(ge=1, le=65535)]

DNS_NAMESPACE: Final = "kube-system"
DNS_POD_LABELS: Final = {"k8s-app": "kube-dns"}
"""The label kubeadm's CoreDNS (and kube-dns before it) carries; most distributions keep it."""


class EgressSpec(ApiModel):
    """Egress of the serving pods (prefill and decode): once on, they reach only their own fleet's serving
    pods (NIXL, UCX and a group's DP/EP traffic, the sidecar's calls to prefill), the Mooncake master, the
    cluster DNS and, where they download the model themselves, the model source. What a serving pod can then
    not do is be turned into a proxy: the sidecar's ``x-prefiller-host-port`` can reach nothing outside the
    fleet. The EPP (it watches the apiserver), the parity Job and the download Job are not restricted."""

    enabled: bool = False
    """Render the egress policies. Needs a network plugin that enforces egress NetworkPolicies."""
    dns_namespaces: list[Namespace] = Field(default_factory=lambda: [DNS_NAMESPACE], max_length=8)
    """Namespaces of the cluster DNS pods."""
    dns_pod_labels: LabelMap = Field(default_factory=lambda: dict(DNS_POD_LABELS), max_length=8)
    """Labels of the cluster DNS pods in ``dnsNamespaces``."""
    dns_cidrs: list[Cidr] = Field(default_factory=list, max_length=8, alias="dnsCIDRs")
    """DNS servers that are not pods: a node-local DNS cache (``169.254.20.10/32``), a resolver outside."""
    dns_ports: list[TcpUdpPort] = Field(default_factory=lambda: [53], min_length=1, max_length=4)
    """Ports the DNS servers listen on, UDP and TCP. NetworkPolicies match the pod's port, not the
    Service's: a CoreDNS pod that listens on another port than 53 needs that port here."""
    model_source_namespaces: list[Namespace] = Field(default_factory=list, max_length=8)
    """Namespaces of an in-cluster model source (a hub mirror, an S3-compatible store) that the serving pods
    reach when they read the model themselves (``s3://``, or ``hf://`` with ``NodeCache`` or
    ``PodEphemeral``)."""
    model_source_pod_labels: LabelMap = Field(default_factory=dict, max_length=8)
    """Labels of the model source's pods in ``modelSourceNamespaces``. Empty: every pod there."""
    model_source_cidrs: list[Cidr] = Field(default_factory=list, max_length=16, alias="modelSourceCIDRs")
    """Networks of a model source outside the cluster. The public hub serves files from CDNs whose
    addresses change: ``0.0.0.0/0`` reaches it (and then every address, for the pods that download), a
    mirror inside the cluster's network (``model.endpoint``) keeps the rule narrow."""
    model_source_ports: list[TcpUdpPort] = Field(default_factory=list, max_length=4)
    """TCP ports of the model source, as its pods listen. Empty: the port of ``model.endpoint`` (80 or 443
    by its scheme when it names none), else 443."""


class NetworkPolicySpec(ApiModel):
    """NetworkPolicies: ingress to the deployment's pods is denied except on the paths serving needs (prefill
    from decode, the serving port from the gateway and the EPP, metrics from monitoring; see
    ``render/network.py``). Needs a network plugin that enforces NetworkPolicy."""

    __cel_rules__: ClassVar = (
        CelRule(
            "!has(self.egress) || !has(self.egress.enabled) || !self.egress.enabled || !has(self.enabled) || self.enabled",
            "networkPolicy.egress.enabled with networkPolicy.enabled false: no policy is rendered, so the serving "
            "pods' egress would not be restricted as asked: set networkPolicy.enabled: true, or egress.enabled: false",
            ".egress.enabled",
        ),
    )

    enabled: bool = True
    """Render the NetworkPolicies."""
    gateway_namespaces: list[Namespace] = Field(default_factory=list, max_length=16)
    """Namespaces where the gateway's proxies run; those of them that ``gatewayPodLabels`` selects may reach
    decode's serving port and the EPP. Empty: the namespace of ``routing.gatewayRef`` (the deployment's own
    for a reference with no namespace); with neither, no namespace, and the ``GatewayAdmitted`` condition is
    False while routing is on (the deployment's namespace is never assumed)."""
    gateway_pod_labels: LabelMap | None = Field(default=None, max_length=16)
    """Labels of the gateway's proxy pods in the gateway namespaces. Unset: with ``routing.gatewayRef`` and no
    ``gatewayNamespaces``, ``gateway.networking.k8s.io/gateway-name: <gatewayRef.name>``, the label Gateway
    API (GEP-1762) has an implementation put on the proxies it deploys for a Gateway (Istio and kgateway do),
    so other pods of that namespace are not let in; otherwise every pod of the gateway namespaces. ``{}``:
    every pod of the gateway namespaces."""
    gateway_cidrs: list[Cidr] = Field(default_factory=list, max_length=16, alias="gatewayCIDRs")
    """Source networks of gateway proxies that are not pods of the cluster (a cloud load balancer's
    proxy-only subnet, proxies on the nodes' network): they may reach decode's serving port and the EPP too
    (``ipBlock`` peers, canonical CIDRs such as ``10.129.0.0/23``)."""
    monitoring_namespaces: list[Namespace] = Field(default_factory=lambda: ["monitoring"], max_length=16)
    """Namespaces whose pods (Prometheus) may reach the metrics ports; vLLM serves ``/metrics`` on its API
    port, so these reach that port too."""
    client_namespaces: list[Namespace] = Field(default_factory=list, max_length=16)
    """More namespaces whose pods may call decode's serving port (the ``<name>-serving`` Service) directly,
    not through the gateway. The deployment's own namespace is not implied."""
    egress: EgressSpec = Field(default_factory=EgressSpec)
    """Egress of the serving pods (off by default: turning it on needs the cluster DNS's and the model
    source's addresses, which only the cluster's owner knows)."""


class SupportPodsSpec(ApiModel):
    """Placement of the deployment's pods that need no GPU: the endpoint picker, the Mooncake master, the
    canary's parity Job and the model download Job (``SharedVolume`` cache)."""

    node_selector: LabelMap = Field(default_factory=dict, max_length=32)
    """Node labels these pods require. Empty: any schedulable node."""

    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations of these pods."""


class HiSparseDeploymentSpec(ApiModel):
    """A prefill/decode deployment of a DSA model served with HiSparse decode."""

    __cel_rules__: ClassVar = (
        CelRule(
            "!has(self.kvTransfer) || !has(self.kvTransfer.mooncake) || !has(self.kvTransfer.mooncake.enabled) "
            "|| !self.kvTransfer.mooncake.enabled || has(self.prefill)",
            "the Mooncake store runs on the prefill role: add spec.prefill or set kvTransfer.mooncake.enabled: false",
            ".kvTransfer.mooncake.enabled",
        ),
        CelRule(
            "!has(self.networkPolicy) || !has(self.networkPolicy.egress) || !has(self.networkPolicy.egress.enabled) "
            "|| !self.networkPolicy.egress.enabled || !(self.model.source.startsWith('s3://') || "
            "(self.model.source.startsWith('hf://') && has(self.model.cache) && has(self.model.cache.mode) && "
            f"self.model.cache.mode in {_POD_FETCH_MODE_NAMES!r})) || "
            "(has(self.networkPolicy.egress.modelSourceNamespaces) && size(self.networkPolicy.egress.modelSourceNamespaces) > 0) || "
            "(has(self.networkPolicy.egress.modelSourceCIDRs) && size(self.networkPolicy.egress.modelSourceCIDRs) > 0)",
            "networkPolicy.egress.enabled names no model source, and the serving pods read the model themselves "
            "(s3://, or hf:// with cache.mode NodeCache or PodEphemeral): the policy would refuse their download and "
            "no pod would start: name the source in egress.modelSourceNamespaces (an in-cluster mirror) or "
            "egress.modelSourceCIDRs (0.0.0.0/0 for the public hub)",
            ".networkPolicy.egress.enabled",
        ),
        # Only llm-d's routing sidecar on decode sends a prompt to prefill and has decode pull its KV: without
        # it nothing reaches prefill, and decode's readiness (a transfer proven through the sidecar) never passes.
        CelRule(
            "!has(self.prefill) || !has(self.routing) || !has(self.routing.enabled) || self.routing.enabled",
            "spec.routing.enabled false with spec.prefill set: only the llm-d routing sidecar on decode sends prompts "
            "to prefill and pulls their KV, so prefill would receive no request and decode would never become Ready "
            "(its readiness proves a KV transfer through the sidecar): set routing.enabled: true, or remove "
            "spec.prefill to serve decode-only",
            ".routing.enabled",
        ),
    )

    model: ModelSpec
    """The served model, its cache and credentials, and its DSA sparse-attention facts."""

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

    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    """Who may reach the deployment's pods."""

    support_pods: SupportPodsSpec = Field(default_factory=SupportPodsSpec)
    """Where the pods that need no GPU run (EPP, Mooncake master, parity Job)."""
