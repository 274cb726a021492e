"""``HiSparseDeployment.status``: conditions, per-role counts, revisions and the canary."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field

from ._base import ApiModel

ConditionType = Literal[
    "ConfigValid", "ModelReady", "PrefillReady", "DecodeReady", "RouterReady", "Ready", "Progressing", "Degraded",
    "GatewayAdmitted",
]
"""The condition contract.

- ``ConfigValid``: the spec passed the API model and every engine constraint (also with cluster facts).
  False means nothing new is applied; the message lists every field path to fix.
- ``ModelReady``: the weights of the spec's model revision are where the serving pods load them. For an
  ``hf://`` source with the ``SharedVolume`` cache: the download Job filled the cache (until then no serving
  workload of that revision is created); reasons ``Downloading``, ``CredentialsMissing`` (the credential
  Secret or one of its keys does not exist), ``DownloadFailed`` (the Job gave up; the message carries the
  fetcher's last words), ``Cached``. With ``NodeCache`` or ``PodEphemeral`` each pod downloads before vLLM
  starts (``FetchedByPods``; ``CacheNotWritable`` when the node's directory is not writable); ``pvc://`` and
  ``s3://`` are read in place (``ReadInPlace``).
- ``PrefillReady`` / ``DecodeReady`` (one per role, the workloads): every replica's pods are ready. For
  decode, ready means the runtime's data-path probe proved a prefill -> decode KV transfer.
- ``RouterReady``: the InferencePool and its EPP are in place and the EPP is available.
- ``Ready``: all of the above; the deployment serves through llm-d.
- ``Progressing``: a rollout (or first rollout) is under way; reason says the step.
- ``Degraded``: serving, but with fewer ready replicas than asked, or a canary rolled back.
- ``GatewayAdmitted``: whether the NetworkPolicies name the gateway that routes to the deployment (its
  pods in ``gatewayNamespaces`` or ``routing.gatewayRef``'s namespace, or ``gatewayCIDRs``). False while
  routing and the policies are on and nothing names it: no gateway reaches decode or the EPP where the
  network enforces NetworkPolicies. It does not enter ``Ready`` (a cluster that enforces no policy serves).
"""

CONDITION_TYPES: Final[tuple[str, ...]] = ConditionType.__args__  # type: ignore[attr-defined]


class Condition(ApiModel):
    """A metav1.Condition."""

    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: str
    observed_generation: int | None = Field(default=None, ge=0)


class RoleStatus(ApiModel):
    replicas: int = 0
    """Engine replicas asked for."""
    ready_replicas: int = 0
    """Replicas whose pods are all ready."""
    pods: int = 0
    """Serving pods that exist."""
    ready: str = "0/0"
    """``ready/asked`` replicas, for ``kubectl get``."""


class ParityStatus(ApiModel):
    revision: str
    """Candidate revision that was compared with the stable one."""
    passed: bool
    """Every prompt produced identical token ids."""
    prompts: int = 0
    """Prompts compared."""
    diverged: int = 0
    """Prompts whose tokens differed."""
    near_ties: int = 0
    """Prompts with a near-tie (both revisions' top-2 logprobs within the near-tie epsilon)."""
    tokens: int = 0
    """Generated tokens compared in all."""
    reason: str | None = Field(default=None, max_length=64)
    """Why it failed: ``Diverged``, ``EndpointError``, ``NoSummary``, ``TooFewPrompts``, ``NotEndToEnd``,
    ``TooManyNearTies``, ``TooFewTokens``, ``JobFailed``, ``TimedOut``."""
    first_divergence: str | None = None
    """``prompt N at token T`` of the first divergent prompt."""
    message: str | None = Field(default=None, max_length=1024)
    """The verdict in words."""
    report: str | None = Field(default=None, max_length=253)
    """ConfigMap holding the full report (every prompt, its first divergence, both sides' margins, the
    tokens compared); it stays until the next rollout starts."""
    finished_at: str | None = None
    """When the comparison finished (RFC 3339)."""


class FleetReplicas(ApiModel):
    stable: int = 0
    """Replicas the stable fleet is given."""
    candidate: int = 0
    """Replicas the candidate fleet is given."""


class QueryMeasurements(ApiModel):
    """One analysis query's measurements so far (the counters of Argo Rollouts' metric result)."""

    measured: int = Field(default=0, ge=0)
    """Measurements taken (passed, failed or inconclusive; errors are not measurements)."""
    passed: int = Field(default=0, ge=0)
    """Measurements within the threshold."""
    failed: int = Field(default=0, ge=0)
    """Measurements outside it (or without data, where ``emptyResult`` is ``Failed``)."""
    inconclusive: int = Field(default=0, ge=0)
    """Measurements without data (an empty vector, NaN)."""
    errors: int = Field(default=0, ge=0)
    """Attempts that gave no measurement (Prometheus unreachable, a query error, not one number)."""
    consecutive_errors: int = Field(default=0, ge=0)
    """Errors since the last measurement."""
    last_at: str | None = None
    """When the last attempt was made (RFC 3339): the next one is due ``intervalSeconds`` later."""
    last: str | None = Field(default=None, max_length=512)
    """What the last attempt gave."""
    phase: Literal["Running", "Passed", "Failed", "Inconclusive"] = "Running"
    """``Running`` until ``count`` measurements are taken or a limit is exceeded."""


class AnalysisStatus(ApiModel):
    """The measurements of the current analysis step, kept so that a restarted operator continues them."""

    step: int = Field(ge=0)
    """Index of the analysis step in ``spec.rollout.steps`` they belong to."""
    queries: dict[str, QueryMeasurements] = Field(default_factory=dict, max_length=16)
    """Per query name."""


class CandidateFailure(ApiModel):
    """The first evidence of a candidate pod that definitely fails (see ``rollout.progressDeadlineSeconds``)."""

    role: str = Field(max_length=16)
    """``prefill`` or ``decode``."""
    pod: str = Field(max_length=253)
    """The failing pod."""
    container: str | None = Field(default=None, max_length=63)
    """Its failing container (unset: the pod cannot be scheduled)."""
    reason: str = Field(max_length=128)
    """The kubelet's or the scheduler's reason (``ImagePullBackOff``, ``CrashLoopBackOff``,
    ``Unschedulable``, ...), or ``RepeatedExits``."""
    message: str = Field(default="", max_length=1024)
    """Their message (the image reference that cannot be pulled, the scheduler's account, the exit code)."""


class CanaryStatus(ApiModel):
    revision: str
    """Candidate revision."""
    attempt: int = Field(default=1, ge=1)
    """Attempt of this revision (``hisparse rollout retry`` starts another)."""
    step: int = 0
    """Index of the current step in ``spec.rollout.steps`` (0 before traffic moves)."""
    weight: int = 0
    """Percent of traffic on the candidate."""
    fleet: str | None = Field(default=None, max_length=47)
    """Base name of the candidate's fleet (``<name>-<revision[:6]>``): its objects are named from it and
    keep that name when it is promoted. Unset on a rollout an earlier operator started (``<name>-canary``)."""
    upgrade: bool = False
    """Started to roll in this operator's rendering of a stable revision an earlier operator rendered
    otherwise (kept as it ran); counts against the operator's ``HISPARSE_UPGRADE_CANARIES``."""
    phase: Literal["Parity", "Shifting", "Promoting", "Promoted", "RolledBack", "Superseded"] = "Parity"
    """Parity gate (the candidate starts, then its tokens are compared), steps (replicas replaced, traffic
    following ready capacity), done (promoted: the candidate's fleet, at every replica, became the stable
    one), rolled back, or superseded (a new spec or a revert before it ended). ``Promoting`` is only seen
    on a rollout an earlier operator started, whose stable fleet takes the candidate's spec back."""
    step_started_at: str | None = None
    """When the current phase or step began (RFC 3339)."""
    ready_at: str | None = None
    """When the candidate was first ready: the parity deadline counts from here."""
    waiting_since: str | None = None
    """Since when replicas asked for are not yet ready (``rollout.readyTimeoutSeconds`` counts from here)."""
    failing_since: str | None = None
    """Since when a candidate pod has definitely failed without a break (``rollout.progressDeadlineSeconds``
    counts from here)."""
    failure: CandidateFailure | None = None
    """The first evidence of that failure (kept after a rollback it caused)."""
    shrink_since: str | None = None
    """Since when replicas leaving the route wait out ``scaleDownDelaySeconds``."""
    shrink_to: dict[str, Annotated[int, Field(ge=0)]] | None = None
    """Per role, the most replicas of the shrinking fleet the route counted since ``shrinkSince``: when the
    delay is over the fleet shrinks to no fewer (replicas the route stopped counting later wait a delay of
    their own)."""
    replicas: dict[str, FleetReplicas] = Field(default_factory=dict)
    """Per role, the replicas of each fleet."""
    serving_fleet: Literal["candidate"] | None = None
    """``candidate`` while the Service ``<name>-serving`` and the InferencePool ``<name>`` select the
    candidate's pods (the stable fleet has no ready replica of some role, or has not caught up with the
    candidate since); absent: they select the stable fleet's."""
    paused: bool = False
    """Held by a pause step or ``hisparse rollout pause``."""
    hold_reason: str | None = Field(default=None, max_length=1024)
    """Why the rollout holds (a pause step waiting for a promote, an inconclusive analysis)."""
    promote: bool = False
    """A ``promote`` control received, kept until the step it continues is reached (a promote sent while
    the step's replicas are still being replaced continues it once they are ready)."""
    handled_action: str | None = Field(default=None, max_length=128)
    """The last rollout control (annotation value) acted on."""
    message: str | None = Field(default=None, max_length=1024)
    """Why the candidate was rolled back, is held, or was superseded."""
    analysis: AnalysisStatus | None = None
    """The measurements of the analysis step under way (or the one that rolled the candidate back)."""


class HiSparseDeploymentStatus(ApiModel):
    observed_generation: int | None = None
    """The ``metadata.generation`` this status describes."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Conditions (see ``ConditionType``), one per type."""
    prefill: RoleStatus | None = None
    """Prefill replicas."""
    decode: RoleStatus | None = None
    """Decode replicas."""
    stable_revision: str | None = None
    """Revision serving user traffic."""
    stable_fleet: str | None = Field(default=None, max_length=47)
    """Base name of the stable fleet's objects, when it is not the resource's own name (a promoted
    candidate's fleet, ``<name>-<revision[:6]>``)."""
    canary_revision: str | None = None
    """Candidate revision being rolled out, if any."""
    canary: CanaryStatus | None = None
    """The rollout of ``canaryRevision``, when one is under way."""
    parity: ParityStatus | None = None
    """Latest token-parity result."""
    kv_compat_hash: str | None = None
    """KV-compatibility hash of the stable revision's pods."""
