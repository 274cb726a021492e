"""Canary rollouts, as a pure planner over what the status records and what the cluster shows.

A new revision (``render.revision``: whatever shapes serving pods) of a resource that already has a
stable one, with ``spec.rollout.strategy: Canary``, is never applied in place. A candidate fleet of its
own, named by its revision (``<name>-<revision[:6]>``, :func:`..names.fleet`; ``spec.rollout.canary``
replicas per role, its own InferencePool and EPP) starts beside the stable one, and:

- ``Parity``: no traffic. Once the candidate is ready (within ``readyTimeoutSeconds``), a Job compares
  its tokens with the stable revision's; a pass needs a summary that compared at least
  ``parity.prompts`` prompts (end to end when there is a prefill role), within ``parity.timeoutSeconds``
  of the candidate being ready. Anything else rolls back.
- ``Shifting``: the steps. A weight step replaces stable replicas with candidate ones until the
  candidate has that share of each role (at least its canary size), surging by at most the canary's
  size: a stable replica leaves only once a candidate replica is ready to take its place, and only
  ``scaleDownDelaySeconds`` after the route stopped counting it. A step below 100 shares the traffic:
  the stable revision keeps at least one replica of each role (:func:`stable_keep`), so with one decode
  replica a step of 50 runs one replica of each revision and routes 50/50 (the canary's surge), instead
  of handing the whole role to the candidate before the steps are over. Pause and analysis steps hold.
  After the last step the candidate is ramped to every replica.
- ``Promoted``: once the candidate's fleet holds every replica, ready, and the stable fleet none, the
  candidate's fleet *is* the stable fleet (``status.stableFleet``): the entry points select it as they
  already did, the old fleet's objects are pruned, and no pod is recreated. (``Promoting``, in which the
  stable fleet took the candidate's spec and its replicas back, is only continued for a rollout an
  earlier operator started: its status names no candidate fleet.)
- ``RolledBack`` / ``Superseded``: the candidate's replicas go back to the stable fleet by the same rule
  (one that carries traffic keeps replicas, and a weight that only falls, until stable ones are ready in
  their place), then its objects are pruned; ``Degraded`` says why until the spec names another revision
  (or ``retry``).

Traffic is :func:`traffic`, alone: the HTTPRoute's candidate weight is min(the step's, the candidate's
share of ready capacity in every role), never on a pool without a ready endpoint while the other has
one; the resource's own entry points (``<name>-serving``, the InferencePool ``<name>``) select the
stable fleet while it serves and the candidate's while it does not. Every decision is a function of the
previous ``status.canary``, the observations and the clock, so a restarted operator continues the same
rollout.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from hisparse_runtime.engine.parity import ParityRules, ParitySummary, judge
from pydantic import ValidationError

from .. import names
from ..api import HiSparseDeployment, labels as L, role_spec
from ..render.common import meta, obj
from . import conditions as C
from .failure import PodFailure

SNAPSHOT_KEY: Final = "spec"
"""Key of the spec in a ControllerRevision's ``data``."""
RENDERING_KEY: Final = "rendering"
"""Key of the revision's rendered workloads and engine ConfigMap in a ControllerRevision's ``data``."""

ROLES: Final = ("prefill", "decode")
RUNNING: Final = ("Parity", "Shifting", "Promoting")
"""``status.canary.phase`` values of a rollout under way."""
WINDING_DOWN: Final = ("RolledBack", "Superseded")
"""Ended phases whose candidate replicas go back to the stable fleet before its objects are pruned."""
OUTCOMES: Final = {"Promoted": "promoted", "RolledBack": "rolled_back", "Superseded": "superseded"}
"""Phases that end a rollout, and the outcome label the metrics count them under."""

ParityResult = Literal["passed", "failed"]
MeasurementKind = Literal["passed", "failed", "inconclusive", "error"]
ServingFleet = Literal["stable", "candidate"]


@dataclass(frozen=True)
class FleetObs:
    """One role's workload of one fleet, as its controller reports it."""

    revision: str | None = None
    """The workload's revision label (None: no workload)."""
    ready: int = 0
    """Replicas of the workload's revision whose pods are all ready (counted from the pods)."""
    pods: int = 0
    """Replicas that exist, of any template (they hold nodes until they are gone)."""
    current: bool = True
    """The workload's controller has seen its latest spec (``observedGeneration``): no step completes
    on a status older than the last change."""
    failure: PodFailure | None = None
    """The first of its pods (of the workload's revision) that definitely fails (:mod:`.failure`)."""


@dataclass(frozen=True)
class Verdict:
    result: ParityResult
    reason: str
    """``Passed``, ``Diverged``, ``EndpointError``, ``NoSummary``, ``TooFewPrompts``, ``NotEndToEnd``,
    ``TooManyNearTies``, ``TooFewTokens``, ``JobFailed``."""
    message: str
    summary: dict[str, Any] | None = None
    report: str | None = None
    """The ConfigMap the full report was kept in (``status.parity.report``)."""


@dataclass(frozen=True)
class Measurement:
    """What one attempt at an analysis query gave (the executor's half, :mod:`.analysis`)."""

    kind: MeasurementKind
    """``passed``/``failed``: a number within or outside the threshold; ``inconclusive``: no data;
    ``error``: no measurement (Prometheus unreachable or refusing the query, not one number)."""
    message: str


@dataclass(frozen=True)
class Observed:
    """What the reconcile saw of the cluster this time."""

    stable: dict[str, FleetObs] = field(default_factory=dict)
    candidate: dict[str, FleetObs] = field(default_factory=dict)
    stable_router: bool = True
    """The stable pool's endpoint picker is available (True without routing)."""
    candidate_router: bool = True
    parity: Verdict | None = None
    """The parity Job's verdict (None while it runs, or before it exists)."""
    parity_unscheduled: str | None = None
    """Why the running parity Job's pod cannot be scheduled (the scheduler's message), if it cannot."""
    analysis: dict[str, Measurement] | None = None
    """Per query name, the measurements of the queries :func:`analysis_due` named."""
    action: str | None = None
    """The ``ROLLOUT_ACTION`` annotation's value."""


@dataclass(frozen=True)
class Decision:
    """What to render and record."""

    canary: bool = False
    """Render the candidate's objects beside the stable ones."""
    stable_is_candidate: bool = True
    """Render the stable fleet from the candidate's spec; False: from the stable snapshot."""
    replicas: dict[str, tuple[int, int]] | None = None
    """Per role (stable, candidate) replicas while a canary runs; None: the spec's."""
    weight: int = 0
    """The candidate's share of the HTTPRoute."""
    serving: ServingFleet = "stable"
    """The fleet ``<name>-serving`` and the InferencePool ``<name>`` select (see :func:`traffic`)."""
    run_parity: bool = False
    canary_status: dict[str, Any] | None = None
    """``status.canary`` to write (None: remove it)."""
    parity_status: dict[str, Any] | None = None
    """A new ``status.parity`` (None: keep the previous one)."""
    promoted: bool = False
    """The candidate became the stable revision in this step."""
    progressing: tuple[str, str] | None = None
    degraded: tuple[str, str] | None = None
    hold: tuple[str, str] | None = None
    """(reason, message): apply nothing at all, only say why (``Progressing=False``)."""
    events: tuple[tuple[str, str, str], ...] = ()
    """(type, reason, message) to announce."""
    requeue_after: float | None = None
    """Seconds until the planner must look again without an event (a pause or a deadline)."""
    snapshots: tuple[str, ...] = ()
    """Revisions whose spec must be kept (stable, and the candidate of a running canary)."""


def _time(text: str | None, default: dt.datetime) -> dt.datetime:
    if not text:
        return default
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- sizes and the replacement rule -----------------------------------------------------------------


def roles_of(d: HiSparseDeployment) -> dict[str, tuple[int, int]]:
    """Per role present: (replicas the spec asks for, the canary's size, at most that)."""
    out = {}
    for role in ROLES:
        spec = role_spec(d, role)  # type: ignore[arg-type]
        if spec is not None:
            n = spec.replicas
            out[role] = (n, min(getattr(d.spec.rollout.canary, role), n))
    return out


def goal_for(weight: int, n: int, c: int) -> int:
    """Candidate replicas of a role at a weight step: that share of the role, at least the canary."""
    return max(c, min(n, math.ceil(weight * n / 100)))


def stable_keep(weight: int | None, n: int, goal: int) -> int:
    """Stable replicas of a role a step keeps beside ``goal`` candidate ones (``weight``: the step's,
    None before any weight step). The rest of the role, and at least one replica until a step of 100:
    a step below 100 shares the traffic, which follows ready capacity, so it never leaves the stable
    revision without a replica. With ``n == 1`` and a step of 50 that is one replica of each revision
    (50/50), within the surge: ``goal <= n`` and the canary's size is at least one."""
    rest = max(0, n - goal)
    if weight is not None and weight >= 100:
        return rest
    return max(rest, min(1, n))


@dataclass(frozen=True)
class Move:
    src: int
    dst: int
    shrink_wanted: int | None
    """The src count the route already plans for while the scale-down delay runs (None: no shrink)."""


def move(n: int, c: int, src: int, dst: int, goal: int, keep: int, *, src_obs: FleetObs, dst_ready: int,
         src_keeps_capacity: bool, shrink_due: bool, src_regrows: bool = False, shrink_to: int | None = None) -> Move:
    """One tick of moving a role's replicas from ``src`` to ``dst`` until ``dst == goal`` and ``src ==
    keep`` (``n - goal``, or more: :func:`stable_keep`): a rolling replacement with a surge of at most
    ``c``. ``src`` keeps what ``dst`` cannot serve yet (unless ``src_keeps_capacity`` is False: it serves
    nothing), and shrinks only when ``shrink_due`` (the scale-down delay since the route stopped counting
    those replicas is over). With ``src_regrows``, when ``dst`` loses ready replicas it had (a candidate
    failing), ``src`` grows back towards what ``dst`` no longer serves, within the surge: capacity returns
    without waiting for the deadline (a rejected candidate, as ``src`` of a wind-down, never grows).
    ``shrink_to``: the most src replicas the route counted since the delay began; a due shrink goes no
    lower (replicas it stopped counting later wait a delay of their own). None: a status that does not
    keep it (an earlier operator's, or a CRD that prunes it): the due shrink goes to the floor."""
    floor = max(keep, n - dst_ready) if src_keeps_capacity else keep
    new_src, wanted = src, None
    dst_pods = max(dst, 0)
    if floor < src:
        if shrink_due:
            new_src = floor if shrink_to is None else min(src, max(floor, shrink_to))
        if new_src > floor:
            wanted = floor
    elif src_regrows and src_keeps_capacity and floor > src:
        new_src = max(src, min(floor, n + c - dst_pods))
    room = n + c - max(new_src, src_obs.pods if src_obs.revision is not None else 0)
    new_dst = max(dst, min(goal, room))
    return Move(new_src, new_dst, wanted)


@dataclass(frozen=True)
class Traffic:
    weight: int
    """The candidate's percent of the HTTPRoute (``<name>-canary``'s backend weight)."""
    serving: ServingFleet
    """The fleet the resource's own entry points select: the Service ``<name>-serving`` and the
    InferencePool ``<name>`` (which users attach routes of their own to)."""


def step_weight(steps: Any, step: int) -> int:
    """The ceiling a step puts on the candidate's weight: the last weight step reached (0 before the
    first, so a leading pause or analysis routes nothing), 100 for the ramp after the last step."""
    if step >= len(steps):
        return 100
    return next((s.weight for s in reversed(steps[: step + 1]) if s.weight is not None), 0)


def traffic(*, ceiling: int, stable: dict[str, int] | None, candidate: dict[str, int] | None, allowed: bool,
            previous: Traffic) -> Traffic:
    """The one traffic model. ``stable``/``candidate``: per role (with replicas), the ready replicas the
    route may count (planned scale-downs already gone), or None when the pool's endpoint picker is down.

    Weight: min(``ceiling``, the candidate's share of ready capacity in every role), rounded down; a pool
    without a ready replica of every role gets nothing while the other has one (availability wins over
    the ceiling only then); a candidate that is not ``allowed`` gets nothing; nothing ready anywhere keeps
    the previous split. The entry points select the stable fleet while it can serve, and the candidate's
    (when allowed) while the stable fleet cannot; once on the candidate they stay there until the stable
    fleet has caught up with it in every role, so a returning fleet is not handed the whole load at its
    first ready replica."""
    s_ok = stable is not None and bool(stable) and all(v > 0 for v in stable.values())
    c_ok = allowed and candidate is not None and bool(candidate) and all(v > 0 for v in candidate.values())
    if c_ok and s_ok:
        assert stable is not None and candidate is not None
        share = min(100 * candidate[r] // (candidate[r] + stable[r]) for r in candidate)
        weight = min(max(0, ceiling), share)
    elif c_ok:
        weight = 100
    elif s_ok:
        weight = 0
    else:
        weight = previous.weight if allowed else 0
    serving: ServingFleet
    if not c_ok:
        serving = previous.serving if allowed and not s_ok else "stable"
    elif not s_ok:
        serving = "candidate"
    else:
        assert stable is not None and candidate is not None
        behind = any(stable[r] < candidate[r] for r in candidate)
        serving = "candidate" if previous.serving == "candidate" and behind else "stable"
    return Traffic(weight, serving)


# --- the parity verdict -----------------------------------------------------------------------------


def pod_summary(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The summary a parity Job's pod left as its termination message (None if none parses)."""
    for pod in pods:
        for c in (pod.get("status") or {}).get("containerStatuses") or []:
            message = ((c.get("state") or {}).get("terminated") or {}).get("message")
            if not message:
                continue
            try:
                return ParitySummary.model_validate_json(message).model_dump()
            except ValidationError:
                continue
    return None


def unscheduled(pods: list[dict[str, Any]]) -> str | None:
    """The scheduler's message for a Pending pod it cannot place (a parity Job's pod that would otherwise
    leave the rollout in Parity with no word of why until the parity timeout)."""
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Pending":
            continue
        for c in status.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                return str(c.get("message") or "Unschedulable")
    return None


def job_verdict(job: dict[str, Any] | None, summary: dict[str, Any] | None, *, required: int,
                end_to_end: bool, max_near_tie_fraction: float = 1.0, min_tokens: int = 0,
                report: str | None = None) -> Verdict | None:
    """A finished parity Job's verdict: a pass needs the Job Complete *and* a summary that breaks none of
    the rules (:func:`hisparse_runtime.engine.parity.judge`: at least ``required`` prompts compared, every
    one matching or excused as a near-tie, end to end when asked, at most ``max_near_tie_fraction`` of
    them with a near-tie, at least ``min_tokens`` tokens compared). ``report``: the ConfigMap the full
    report was kept in, named in the message (the Job's pod and its log go with the candidate)."""
    if job is None:
        return None
    ended = None
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in ("Complete", "Failed"):
            ended = c
    if ended is None:
        return None
    name = job["metadata"]["name"]
    where = f"; the full report is in ConfigMap {report}" if report else f" (Job {name})"
    if summary is None:
        return Verdict("failed", "NoSummary", f"the Job ended ({ended['type']}) without a readable summary in its "
                       f"pod's termination message: nothing counts as compared{where}")
    rules = ParityRules(prompts=max(1, required), end_to_end=end_to_end,
                        max_near_tie_fraction=max_near_tie_fraction, min_tokens=min_tokens)
    broken = judge(ParitySummary.model_validate(summary), rules)
    if broken is not None:
        return Verdict("failed", broken[0], broken[1] + where, summary)
    if ended["type"] != "Complete" or not summary.get("ok"):
        why = ended.get("message") or ended.get("reason") or "the Job failed"
        return Verdict("failed", "JobFailed", f"{why}{where}", summary)
    compared, ties = int(summary.get("compared") or 0), int(summary.get("near_ties") or 0)
    return Verdict("passed", "Passed", f"{compared} prompts gave the same tokens"
                   + (f" ({ties} with a near-tie)" if ties else "") + where, summary)


def _parity(revision: str, v: Verdict | None, now: dt.datetime, *, reason: str = "", message: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"revision": revision, "passed": v is not None and v.result == "passed",
                           "finishedAt": rfc3339(now), "reason": v.reason if v else reason}
    text = v.message if v else message
    if text:
        out["message"] = text[:1024]
    s = v.summary if v else None
    if s:
        out.update(prompts=int(s.get("compared") or 0), diverged=int(s.get("diverged") or 0),
                   nearTies=int(s.get("near_ties") or 0), tokens=int(s.get("tokens") or 0))
        if s.get("first_divergence"):
            out["firstDivergence"] = s["first_divergence"]
    if v is not None and v.report:
        out["report"] = v.report
    return out


# --- controls ---------------------------------------------------------------------------------------


def action_of(value: str | None) -> str | None:
    """The action of a ``ROLLOUT_ACTION`` annotation value (``<action>`` or ``<action>@<id>``)."""
    if not value:
        return None
    action = value.split("@", 1)[0].strip().lower()
    return action if action in L.ROLLOUT_ACTIONS else None


@dataclass(frozen=True)
class AnalysisDue:
    """The analysis step under way and its queries to measure now (I/O: the executor runs them)."""

    step: int
    analysis: Any
    """The step's ``AnalysisStep``."""
    queries: tuple[Any, ...]
    """Its ``AnalysisQuery``s whose next measurement is due."""


def _analysis_step(d: HiSparseDeployment, prev: dict[str, Any]) -> tuple[int, Any] | None:
    """(index, AnalysisStep) when ``prev`` is at an analysis step whose replicas are in place."""
    if prev.get("phase") != "Shifting" or prev.get("waitingSince") or prev.get("paused"):
        return None
    steps = d.spec.rollout.steps
    step = int(prev.get("step") or 0)
    if step >= len(steps) or steps[step].analysis is None:
        return None
    return step, steps[step].analysis


def measurements(prev: dict[str, Any], step: int) -> dict[str, dict[str, Any]]:
    """Per query name, the counters recorded for analysis step ``step`` (none yet: empty)."""
    a = prev.get("analysis") or {}
    if a.get("step") != step:
        return {}
    return {k: dict(v) for k, v in (a.get("queries") or {}).items()}


def next_measurement_at(q: Any, counters: dict[str, Any] | None, first: dt.datetime, now: dt.datetime) -> dt.datetime | None:
    """When query ``q`` is measured next (None: it is done); ``first``: the end of the step's delay."""
    c = counters or {}
    if c.get("phase", "Running") != "Running":
        return None
    return first if not c.get("lastAt") else _time(c["lastAt"], now) + dt.timedelta(seconds=q.interval_seconds)


def analysis_due(d: HiSparseDeployment, previous: dict[str, Any] | None, now: dt.datetime) -> AnalysisDue | None:
    """The analysis queries to measure now (each ``intervalSeconds`` after its last attempt, the first
    ``delaySeconds`` into the step), or None."""
    prev = previous or {}
    at = _analysis_step(d, prev)
    if at is None:
        return None
    step, a = at
    first = _time(prev.get("stepStartedAt"), now) + dt.timedelta(seconds=a.delay_seconds)
    done = measurements(prev, step)
    due = tuple(q for q in a.queries if (t := next_measurement_at(q, done.get(q.name), first, now)) is not None and t <= now)
    return AnalysisDue(step, a, due) if due else None


def record(q: Any, counters: dict[str, Any] | None, m: Measurement, now: dt.datetime) -> dict[str, Any]:
    """``counters`` after measurement ``m`` of query ``q``, and the query's phase (Argo's rule: a limit
    is exceeded by one more than it tolerates; errors do not count toward ``count``)."""
    c = {"measured": 0, "passed": 0, "failed": 0, "inconclusive": 0, "errors": 0, "consecutiveErrors": 0, **(counters or {})}
    c.update(lastAt=rfc3339(now), last=m.message[:512])
    if m.kind == "error":
        c["errors"] += 1
        c["consecutiveErrors"] += 1
    else:
        c["consecutiveErrors"] = 0
        c["measured"] += 1
        c[m.kind] += 1
    if c["failed"] > q.failure_limit or c["consecutiveErrors"] > q.consecutive_error_limit:
        c["phase"] = "Failed"
    elif c["inconclusive"] > q.inconclusive_limit:
        c["phase"] = "Inconclusive"
    elif c["measured"] >= q.count:
        # (Admission keeps failureLimit + inconclusiveLimit below count, so a pass has a passed measurement.)
        c["phase"] = "Passed" if c["passed"] else "Inconclusive"
    else:
        c["phase"] = "Running"
    return c


def why_ended(q: Any, c: dict[str, Any]) -> str:
    """A finished query's outcome in words, with the limit it went past."""
    if c["phase"] == "Failed" and c["consecutiveErrors"] > q.consecutive_error_limit:
        why = f"{c['consecutiveErrors']} errors in a row, consecutiveErrorLimit {q.consecutive_error_limit}"
    elif c["phase"] == "Failed":
        why = f"{c['failed']} of {c['measured']} measurements failed, failureLimit {q.failure_limit}"
    elif c["phase"] == "Inconclusive":
        why = f"{c['inconclusive']} of {c['measured']} measurements inconclusive, inconclusiveLimit {q.inconclusive_limit}"
    else:
        why = f"{c['passed']} of {c['measured']} measurements passed"
    return f"{q.name}: {why}; last: {c.get('last') or ''}"


# --- the planner ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpgradeSlots:
    """The stable fleet is kept as an earlier operator rendered it (:mod:`..render.pinned`), so a canary
    that starts now rolls this operator's rendering in: ``free`` more such canaries may start across the
    operator's deployments (None: no limit), ``limit`` of them at once."""

    free: int | None
    limit: int


UPGRADE_QUEUE_SECONDS: Final = 30.0
"""How often a deployment waiting for an upgrade canary's slot looks again."""


def decide(d: HiSparseDeployment, *, stable: str | None, candidate: str, has_snapshot: bool,
           previous: dict[str, Any] | None, observed: Observed, now: dt.datetime,
           hold: tuple[str, str] | None = None, fleet: str | None = None, upgrade: UpgradeSlots | None = None) -> Decision:
    """The next step of the rollout of ``candidate`` (``d``'s revision) over ``stable``.

    ``previous``: the last ``status.canary``; ``has_snapshot``: the stable revision's spec is at hand
    and renders to ``stable``; ``hold``: the executor found something it cannot act on safely;
    ``fleet``: the base name a rollout that starts now gives the candidate's fleet (recorded as
    ``status.canary.fleet``; a running one keeps its own); ``upgrade``: a canary that starts now is an
    upgrade canary (``status.canary.upgrade``), and how many may start."""
    if hold is not None:
        return Decision(hold=hold, canary_status=previous, snapshots=tuple(r for r in (stable, candidate) if r))
    return _Planner(d, stable, candidate, has_snapshot, previous, observed, now, fleet, upgrade).decide()


class _Planner:
    def __init__(self, d: HiSparseDeployment, stable: str | None, candidate: str, has_snapshot: bool,
                 previous: dict[str, Any] | None, observed: Observed, now: dt.datetime, fleet: str | None = None,
                 upgrade: UpgradeSlots | None = None) -> None:
        self.d, self.stable, self.candidate, self.has_snapshot = d, stable, candidate, has_snapshot
        self.fleet, self.upgrade = fleet, upgrade
        self.prev, self.obs, self.now = dict(previous or {}), observed, now
        self.rollout = d.spec.rollout
        self.roles = roles_of(d)
        self.events: list[tuple[str, str, str]] = []

    # -- helpers

    def elapsed(self, key: str) -> float:
        return (self.now - _time(self.prev.get(key), self.now)).total_seconds()

    def replicas(self, st: dict[str, Any]) -> dict[str, tuple[int, int]]:
        reps = st.get("replicas") or {}
        out = {}
        for role, (n, c) in self.roles.items():
            r = reps.get(role) or {}
            out[role] = (int(r.get("stable", n)), int(r.get("candidate", c)))
        return out

    @staticmethod
    def _reps_json(reps: dict[str, tuple[int, int]]) -> dict[str, Any]:
        return {role: {"stable": s, "candidate": c} for role, (s, c) in reps.items()}

    def ready(self, fleet: str, role: str, revision: str) -> int:
        o = (self.obs.stable if fleet == "stable" else self.obs.candidate).get(role, FleetObs())
        return o.ready if o.revision == revision else 0

    def capacity(self, fleet: str, revision: str, planned: dict[str, int], router: bool) -> int:
        """Ready decode replicas a pool can route to (0 if any of its roles has none, or no EPP)."""
        caps = self.role_capacity(fleet, revision, planned, router)
        if not caps or any(v <= 0 for v in caps.values()):
            return 0
        return caps.get("decode", 0)

    def role_capacity(self, fleet: str, revision: str, planned: dict[str, int], router: bool) -> dict[str, int] | None:
        """Per role with replicas, the ready ones of ``revision`` the route may count (at most
        ``planned``); None without an available endpoint picker."""
        if not router:
            return None
        return {role: min(self.ready(fleet, role, revision), planned[role]) for role, (n, _) in self.roles.items() if n > 0}

    def action(self) -> str | None:
        value = self.obs.action
        if not value or value == self.prev.get("handledAction"):
            return None
        self.prev["handledAction"] = value
        return action_of(value)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def finish(self, dec: Decision) -> Decision:
        serving: ServingFleet = "candidate" if dec.canary and (dec.canary_status or {}).get("servingFleet") == "candidate" else "stable"
        return dataclasses.replace(dec, events=tuple(self.events) + dec.events, serving=serving)

    # -- definite failures of the candidate (rollout.progressDeadlineSeconds)

    def candidate_failure(self, *, both_fleets: bool = False) -> tuple[str, PodFailure] | None:
        """(role, evidence) of a failing pod of the candidate's revision: in the candidate fleet, and
        with ``both_fleets`` (promoting: the stable fleet runs that revision too) in the stable one."""
        rev = self.candidate_rev()
        for fleet in (self.obs.candidate, self.obs.stable) if both_fleets else (self.obs.candidate,):
            for role in self.roles:
                o = fleet.get(role, FleetObs())
                if o.failure is not None and o.revision == rev:
                    return role, o.failure
        return None

    def failing(self, *, both_fleets: bool = False) -> float | None:
        """Track since when a pod of the candidate has definitely failed without a break, and the first
        evidence of it; the seconds left of ``progressDeadlineSeconds`` (None: nothing fails now, and the
        clock starts afresh at the next failure)."""
        found = self.candidate_failure(both_fleets=both_fleets)
        if found is None:
            self.prev.pop("failingSince", None)
            self.prev.pop("failure", None)
            return None
        if not self.prev.get("failingSince"):
            role, f = found
            self.prev["failingSince"] = rfc3339(self.now)
            self.prev["failure"] = {"role": role, "pod": f.pod, **({"container": f.container} if f.container else {}),
                                    "reason": f.reason, "message": f.message}
        return self.rollout.progress_deadline - self.elapsed("failingSince")

    def failure_text(self) -> str:
        """The evidence in words: pod, role, container, the kubelet's (or scheduler's) reason and message."""
        f = self.prev.get("failure") or {}
        where = f"pod {f.get('pod')} ({f.get('role')})" + (f", container {f['container']}" if f.get("container") else "")
        return f"{where}: {f.get('reason')}" + (f": {f['message']}" if f.get("message") else "")

    def failed_for(self) -> str:
        return (f"a candidate pod has failed for {self.rollout.progress_deadline}s without a break "
                f"(spec.rollout.progressDeadlineSeconds): {self.failure_text()}")

    def failing_note(self, left: float | None, then: str = "rolled back") -> str:
        if left is None:
            return ""
        return (f"; failing since {self.prev.get('failingSince')}: {self.failure_text()} ({then} in "
                f"{max(0, round(left))}s unless it recovers)")

    def _unready(self) -> bool:
        """Some replica given to a fleet of the candidate's revision is not ready."""
        rev = self.candidate_rev()
        for role, (s, k) in self.replicas(self.prev).items():
            if self.ready("candidate", role, rev) < k:
                return True
            o = self.obs.stable.get(role, FleetObs())
            if o.revision == rev and o.ready < s:
                return True
        return False

    def watch_failures(self, dec: Decision) -> Decision:
        """Look again at the progress deadline, and soon while a replica is not ready: pods are not
        watched, and a pod that never starts changes its workload's status only once."""
        if not dec.canary or self.prev.get("phase") not in RUNNING:
            return dec
        waits = [w for w in (dec.requeue_after,) if w is not None]
        if self.prev.get("failingSince"):
            waits.append(max(0.5, self.rollout.progress_deadline - self.elapsed("failingSince")))
        if self._unready():
            waits.append(float(max(5, min(30, self.rollout.progress_deadline // 10))))
        return dataclasses.replace(dec, requeue_after=min(waits)) if waits else dec

    # -- entry

    def decide(self) -> Decision:
        prev, cand, stable = self.prev, self.candidate, self.stable
        phase = prev.get("phase")
        if phase in RUNNING or (phase in WINDING_DOWN and self._candidate_left()):
            if phase in RUNNING and prev.get("revision") != cand and phase != "Promoting":
                return self.finish(self.wind_down_start("Superseded", self._superseded_message(), outcome_event=True))
            # (Promoting: the candidate already serves everything; a newer spec rolls out after it.)
            return self.finish(self.running())
        # Nothing under way.
        kept = prev if phase in OUTCOMES else None
        in_place = stable is None or stable == cand or self.rollout.strategy != "Canary"
        if in_place:
            rolled_back = kept is not None and kept.get("phase") == "RolledBack" and kept.get("revision") == cand
            return self.finish(Decision(canary_status=kept, snapshots=(cand,),
                                        degraded=(C.CANARY_ROLLED_BACK, _rolled_back_message(kept)) if rolled_back else None))
        assert stable is not None
        if not self.has_snapshot:
            return self.finish(Decision(hold=(C.ROLLOUT_HELD, f"revision {cand} cannot be rolled out: the snapshot of the "
                                              f"stable revision {stable} (ControllerRevision {names.snapshot(self.d.name, stable)}) "
                                              "is missing or no longer renders that revision, so the stable fleet could not be "
                                              "kept; nothing was changed. Restore it, or set spec.rollout.strategy: Recreate to "
                                              "roll in place without the gate."),
                                        canary_status=kept, snapshots=(stable, cand)))
        act = self.action()
        if kept and kept.get("phase") == "RolledBack" and kept.get("revision") == cand:
            if act == "retry":
                self.event("Normal", C.ROLLOUT_ACTION, f"retry: revision {cand} starts attempt {int(kept.get('attempt') or 1) + 1}")
                return self.finish(self.queued(kept) or self.start(int(kept.get("attempt") or 1) + 1))
            st = {**kept, "handledAction": prev.get("handledAction")} if prev.get("handledAction") else kept
            return self.finish(Decision(stable_is_candidate=False, canary_status=st, snapshots=(stable,),
                                        degraded=(C.CANARY_ROLLED_BACK, _rolled_back_message(kept))))
        return self.finish(self.queued(kept) or self.start(1))

    def queued(self, kept: dict[str, Any] | None) -> Decision | None:
        """An upgrade canary with no slot free: the stable fleet stays as it runs, and no canary starts."""
        u = self.upgrade
        if u is None or u.free is None or u.free > 0:
            return None
        return Decision(stable_is_candidate=False, canary_status=kept, snapshots=(self.stable,),  # type: ignore[arg-type]
                        requeue_after=UPGRADE_QUEUE_SECONDS,
                        progressing=(C.UPGRADE_QUEUED, f"revision {self.candidate} (this operator's rendering of the "
                                     f"stable spec) waits to canary: {u.limit} upgrade canar{'y' if u.limit == 1 else 'ies'} "
                                     f"at once (HISPARSE_UPGRADE_CANARIES) are under way; revision {self.stable} keeps "
                                     "serving as it runs"))

    def _candidate_left(self) -> bool:
        """The candidate fleet of an ended rollout still has replicas to give back."""
        return bool(self.prev.get("replicas"))

    def _superseded_message(self) -> str:
        to = "the stable revision" if self.candidate == self.stable else f"revision {self.candidate}"
        return f"revision {self.prev.get('revision')} was superseded by a spec change to {to} before it was promoted"

    def start(self, attempt: int) -> Decision:
        reps = {role: (n, c) for role, (n, c) in self.roles.items()}
        st = {"revision": self.candidate, "attempt": attempt, "phase": "Parity", "step": 0, "weight": 0,
              "stepStartedAt": rfc3339(self.now), "waitingSince": rfc3339(self.now), "replicas": self._reps_json(reps)}
        if self.fleet:
            st["fleet"] = self.fleet
        if self.upgrade is not None:
            st["upgrade"] = True
        if self.prev.get("handledAction"):
            st["handledAction"] = self.prev["handledAction"]
        self.prev = st
        return self.watch_failures(self.parity())

    # -- running phases

    def running(self) -> Decision:
        act = self.action()
        phase = self.prev["phase"]
        if act == "pause" and phase in RUNNING:
            self.prev["paused"] = True
            self.event("Normal", C.ROLLOUT_ACTION, f"paused at {phase}")
        elif (act == "resume" or (act == "promote" and phase == "Promoting")) and self.prev.get("paused"):
            # (Promoting has no step for a promote to skip: there it continues a paused promotion.)
            self.prev["paused"] = False
            self.prev.pop("holdReason", None)
            self.event("Normal", C.ROLLOUT_ACTION, "resumed")
        elif act == "abort":
            if phase in ("Parity", "Shifting"):
                return self.rollback("aborted by a rollout control (hisparse rollout abort)", reason="Aborted")
            self.event("Warning", C.ROLLOUT_ACTION, f"abort refused in {phase}: the candidate already serves, or is being removed")
        elif act == "promote" and phase in ("Parity", "Shifting"):
            self.prev["promote"] = True
            if phase == "Parity":
                self.event("Warning", C.ROLLOUT_ACTION, "promote cannot skip the parity gate: it applies once parity passed")
        elif act == "promote" and phase != "Promoting":
            self.event("Warning", C.ROLLOUT_ACTION, f"promote refused in {phase}: the rollout has ended")
        elif act == "retry":
            self.event("Warning", C.ROLLOUT_ACTION, f"retry refused in {phase}: only a rolled-back revision can be retried")
        if phase == "Parity":
            return self.watch_failures(self.parity())
        if phase == "Shifting":
            return self.watch_failures(self.shifting())
        if phase == "Promoting":
            return self.watch_failures(self.promoting())
        return self.winding_down()

    def _waiting(self, done: bool) -> float | None:
        """Track since when replicas asked for are not ready; the seconds left of that deadline."""
        if done:
            self.prev.pop("waitingSince", None)
            return None
        self.prev.setdefault("waitingSince", rfc3339(self.now))
        return self.rollout.ready_timeout_seconds - self.elapsed("waitingSince")

    def parity(self) -> Decision:
        cand, stable = self.candidate, self.stable
        assert stable is not None
        reps = self.replicas(self.prev)
        planned_c = {r: c for r, (_, c) in reps.items()}
        ready = all(self.ready("candidate", r, cand) >= planned_c[r] for r in self.roles) and self.obs.candidate_router
        p = self.rollout.parity
        base = Decision(canary=True, stable_is_candidate=False, replicas=reps, weight=0, snapshots=(stable, cand))
        failing = self.failing()
        if failing is not None and failing <= 0:
            return self.rollback(self.failed_for(), reason="CandidateFailed")
        if not self.prev.get("readyAt"):
            if not ready:
                left = self._waiting(False)
                assert left is not None
                if left <= 0:
                    return self.rollback(f"the candidate was not ready within readyTimeoutSeconds "
                                         f"({self.rollout.ready_timeout_seconds}s)", reason="NotReady")
                return dataclasses.replace(base, canary_status=self.prev, requeue_after=left,
                                           progressing=(C.CANARY_STARTING, f"waiting for the candidate {cand} to be ready "
                                                        f"(no traffic){self.failing_note(failing)}"))
            self._waiting(True)
            self.prev["readyAt"] = rfc3339(self.now)
        if not p.enabled:
            return self.next_step(0, None)
        v = self.obs.parity
        # A verdict is read before the deadline: one that arrived while the operator was down counts.
        if v is not None and v.result == "failed":
            return self.rollback(f"token parity failed ({v.reason}): {v.message}", parity=_parity(cand, v, self.now), reason=v.reason)
        if v is not None and v.result == "passed":
            if self.prev.get("paused"):
                return dataclasses.replace(base, canary_status=self.prev, parity_status=_parity(cand, v, self.now),
                                           progressing=(C.CANARY_PAUSED, f"parity passed; paused before any traffic reaches {cand}"))
            return self.next_step(0, _parity(cand, v, self.now))
        left = p.timeout_seconds - self.elapsed("readyAt")
        if left <= 0:
            return self.rollback(f"no parity verdict within {p.timeout_seconds}s of the candidate being ready",
                                 parity=_parity(cand, None, self.now, reason="TimedOut",
                                                message=f"no verdict within {p.timeout_seconds}s"), reason="TimedOut")
        waiting = self.obs.parity_unscheduled
        # Once started, the comparison keeps its Job and its deadline (from readyAt) while a candidate pod
        # goes unready: withdrawing the Job would start it over each time, and a flapping candidate would
        # never be judged. Its requests to an unready candidate fail, and that is a verdict too.
        return dataclasses.replace(base, run_parity=True, canary_status=self.prev, requeue_after=left,
                                   progressing=(C.CANARY_PARITY, f"comparing the tokens of {cand} with {stable} (no traffic)"
                                                + (f"; the parity Job's pod cannot be scheduled: {waiting}" if waiting else "")
                                                + ("" if ready else "; a candidate replica is not ready (the comparison "
                                                   "and its deadline go on)") + self.failing_note(failing)))

    def goal(self, step: int) -> tuple[dict[str, int], dict[str, int]]:
        """(candidate, stable) replicas per role at ``step``: by the last weight step at or before it
        (past the end: every replica the candidate's, none the stable's)."""
        steps = self.rollout.steps
        if step >= len(steps):
            return {r: n for r, (n, _) in self.roles.items()}, {r: 0 for r in self.roles}
        w = next((s.weight for s in reversed(steps[: step + 1]) if s.weight is not None), None)
        goal = {r: (c if w is None else goal_for(w, n, c)) for r, (n, c) in self.roles.items()}
        return goal, {r: stable_keep(w, n, goal[r]) for r, (n, _) in self.roles.items()}

    def next_step(self, step: int, parity: dict[str, Any] | None) -> Decision:
        """Start ``step`` now (past the last one: ramp to every replica, still ``Shifting``)."""
        self.prev.update(phase="Shifting", step=step, stepStartedAt=rfc3339(self.now))
        self.prev.pop("analysis", None)  # an analysis step's measurements end with it (passed or promoted past)
        # (A promote is consumed by the step it continues: shifting() pops it; one sent during Parity waits
        # for the first step.)
        steps = self.rollout.steps
        if step < len(steps) and steps[step].pause is not None and steps[step].pause.seconds is None:
            self.prev["paused"] = True
            self.prev["holdReason"] = f"step {step + 1} waits for a promote (hisparse rollout promote)"
        dec = self.shifting()
        return dataclasses.replace(dec, parity_status=parity) if parity else dec

    def moved(self, src_fleet: str, *, goal: dict[str, int], src_rev: str, dst_rev: str, src_keeps: bool,
              keep: dict[str, int] | None = None, regrow: bool = False,
              ) -> tuple[dict[str, tuple[int, int]], bool, dict[str, int]]:
        """Apply :func:`move` to every role (src/dst: "candidate" or "stable"; src ends at ``keep``, by
        default the rest of the role). Returns the new replicas as (stable, candidate), whether every
        role reached its goal with every dst replica ready, and the per-role src count the route should
        plan for."""
        reps = self.replicas(self.prev)
        shrink_due = bool(self.prev.get("shrinkSince")) and self.elapsed("shrinkSince") >= self.rollout.scale_down_delay_seconds
        counted = self.prev.get("shrinkTo") if self.prev.get("shrinkSince") else None
        out, planned_src, done, wanted_any = {}, {}, True, False
        dst_fleet = "stable" if src_fleet == "candidate" else "candidate"
        # A pool serves only with a ready replica of every role (and its EPP): until the dst pool can,
        # src gives nothing up, whatever one role alone shows.
        dst_pool = self.capacity(dst_fleet, dst_rev, {r: 10**6 for r in self.roles},
                                 self.obs.stable_router if dst_fleet == "stable" else self.obs.candidate_router) > 0
        # The src pool serves only with a replica of every role too: while any role of src must keep
        # replicas, no role gives up its last one (a lone prefill fleet serves nothing).
        src_goals = {r: keep[r] if keep is not None else max(0, n - goal[r]) for r, (n, _) in self.roles.items()}
        pool_kept = any(max(src_goals[r], n - (self.ready(dst_fleet, r, dst_rev) if dst_pool else 0)) > 0
                        for r, (n, _) in self.roles.items()) if src_keeps else False
        for role, (n, c) in self.roles.items():
            s, k = reps[role]
            src, dst = (k, s) if src_fleet == "candidate" else (s, k)
            src_obs = (self.obs.candidate if src_fleet == "candidate" else self.obs.stable).get(role, FleetObs())
            dst_ready = self.ready(dst_fleet, role, dst_rev)
            dst_obs = (self.obs.stable if dst_fleet == "stable" else self.obs.candidate).get(role, FleetObs())
            src_goal = src_goals[role]
            m = move(n, c, src, dst, goal[role], max(src_goal, min(1, n, src)) if pool_kept else src_goal,
                     src_obs=src_obs, dst_ready=dst_ready if dst_pool else 0, src_keeps_capacity=src_keeps,
                     shrink_due=shrink_due, src_regrows=regrow,
                     shrink_to=None if counted is None else int(counted.get(role, src)))
            wanted_any = wanted_any or m.shrink_wanted is not None
            planned_src[role] = m.shrink_wanted if m.shrink_wanted is not None else m.src
            out[role] = (m.dst, m.src) if src_fleet == "candidate" else (m.src, m.dst)
            done = done and m.dst >= goal[role] and m.src <= src_goal and dst_ready >= m.dst \
                and m.shrink_wanted is None and (m.dst, m.src) == (dst, src) and dst_obs.current and src_obs.current
        if not wanted_any:
            self.prev.pop("shrinkSince", None)
            self.prev.pop("shrinkTo", None)
        elif shrink_due or not self.prev.get("shrinkSince"):
            # A new delay for what the route stops counting now (route() raises it to what it counts).
            self.prev["shrinkSince"] = rfc3339(self.now)
            self.prev["shrinkTo"] = dict(planned_src)
        self.prev["replicas"] = self._reps_json(out)
        return out, done, planned_src

    def route(self, reps: dict[str, tuple[int, int]], planned_src: dict[str, int], src_fleet: str, *,
              stable_rev: str, allowed: bool, ceiling: int) -> int:
        """The route's weight and the entry points' fleet by :func:`traffic`, recorded in the status."""
        stable_plan = {r: (planned_src[r] if src_fleet == "stable" else s) for r, (s, _) in reps.items()}
        cand_plan = {r: (planned_src[r] if src_fleet == "candidate" else k) for r, (_, k) in reps.items()}
        prev = Traffic(int(self.prev.get("weight") or 0), "candidate" if self.prev.get("servingFleet") == "candidate" else "stable")

        def caps(stable_p: dict[str, int], cand_p: dict[str, int]) -> tuple[dict[str, int] | None, dict[str, int] | None]:
            return (self.role_capacity("stable", stable_rev, stable_p, self.obs.stable_router),
                    self.role_capacity("candidate", self.candidate_rev(), cand_p, self.obs.candidate_router))

        stable_cap, cand_cap = caps(stable_plan, cand_plan)
        serves = lambda c: bool(c) and all(v > 0 for v in c.values())  # noqa: E731
        if not serves(stable_cap) and not (allowed and serves(cand_cap)):
            # Nothing left once the planned scale-down is done: replicas still there keep serving.
            stable_plan, cand_plan = {r: s for r, (s, _) in reps.items()}, {r: k for r, (_, k) in reps.items()}
            stable_cap, cand_cap = caps(stable_plan, cand_plan)
        if self.prev.get("shrinkTo") is not None:
            # The scale-down under way removes no replica this route counts until its own delay is over.
            counted = stable_plan if src_fleet == "stable" else cand_plan
            self.prev["shrinkTo"] = {r: max(int(self.prev["shrinkTo"].get(r, 0)), counted[r]) for r in counted}
        t = traffic(ceiling=ceiling, stable=stable_cap, candidate=cand_cap, allowed=allowed, previous=prev)
        self.prev["weight"] = t.weight
        if t.serving == "candidate":
            self.prev["servingFleet"] = "candidate"
        else:
            self.prev.pop("servingFleet", None)
        return t.weight

    def candidate_rev(self) -> str:
        return str(self.prev.get("revision") or self.candidate)

    def shifting(self) -> Decision:
        stable = self.stable
        assert stable is not None
        step = int(self.prev.get("step") or 0)
        steps = self.rollout.steps
        goal, keep = self.goal(step)
        reps, done, planned = self.moved("stable", goal=goal, keep=keep, src_rev=stable, dst_rev=self.candidate_rev(),
                                         src_keeps=True, regrow=True)
        w = self.route(reps, planned, "stable", stable_rev=stable, allowed=True, ceiling=step_weight(steps, step))
        left = self._waiting(done)
        base = Decision(canary=True, stable_is_candidate=False, replicas=reps, weight=w, canary_status=self.prev,
                        snapshots=(stable, self.candidate_rev()))
        failing = self.failing()
        if failing is not None and failing <= 0:
            return self.rollback(self.failed_for(), reason="CandidateFailed")
        if left is not None and left <= 0:
            return self.rollback(f"replicas of step {step + 1} were not ready within readyTimeoutSeconds "
                                 f"({self.rollout.ready_timeout_seconds}s)", reason="NotReady")
        label = f"step {step + 1}/{len(steps)}" if step < len(steps) else "ramping to every replica"
        if not done:
            self.prev["stepStartedAt"] = rfc3339(self.now)  # a step's hold counts from its capacity being ready
            return dataclasses.replace(base, requeue_after=self._shrink_requeue(left),
                                       progressing=(C.CANARY_SHIFTING, f"{label}: replacing stable replicas; {w}% of requests "
                                                    f"to {self.candidate_rev()}{self.failing_note(failing)}"))
        if step >= len(steps):
            return self.promoting_start()
        s = steps[step]
        promote = bool(self.prev.pop("promote", False))
        if self.prev.get("paused") and not promote:
            why = self.prev.get("holdReason") or "paused (hisparse rollout resume or promote continues)"
            return dataclasses.replace(base, progressing=(C.CANARY_PAUSED, f"{label}: {why}; {w}% of requests to {self.candidate_rev()}"))
        if promote:
            self.prev["paused"] = False
            self.prev.pop("holdReason", None)
            return self.next_step(step + 1, None)
        if s.analysis is not None:
            return self.analysing(step, s.analysis, base, label, w)
        hold = (s.pause.seconds or 0) if s.pause is not None else (s.pause_seconds if s.weight is not None else 0)
        left_hold = hold - self.elapsed("stepStartedAt")
        if left_hold > 0:
            return dataclasses.replace(base, requeue_after=left_hold,
                                       progressing=(C.CANARY_SHIFTING, f"{label}: {w}% of requests to {self.candidate_rev()}"))
        return self.next_step(step + 1, None)

    def analysing(self, step: int, a: Any, base: Decision, label: str, w: int) -> Decision:
        """An analysis step whose replicas are in place: record the measurements the executor took of
        the due queries, then decide (any query failed: roll back; every query done, one inconclusive:
        hold; every query passed: next step; else measure again at the next query's interval)."""
        done = measurements(self.prev, step)
        if done and all(c.get("phase") != "Running" for c in done.values()) and \
                any(c.get("phase") == "Inconclusive" for c in done.values()):
            # An inconclusive analysis held the rollout and ``resume`` released it: measure again.
            self.event("Normal", C.CANARY_ANALYSIS, f"analysis at step {step + 1} measures again after resume")
            done = {}
        due = analysis_due(self.d, {**self.prev, "analysis": {"step": step, "queries": done}}, self.now)
        got = self.obs.analysis or {}
        for q in (due.queries if due else ()):
            m = got.get(q.name)
            if m is None:
                continue
            c = done[q.name] = record(q, done.get(q.name), m, self.now)
            if m.kind == "error" and c["phase"] == "Running":
                self.event("Warning", C.CANARY_ANALYSIS, f"analysis at step {step + 1}, query {q.name}: {m.message} "
                           f"(error {c['consecutiveErrors']} in a row of {q.consecutive_error_limit} tolerated; "
                           f"retried in {q.interval_seconds}s)")
        self.prev["analysis"] = {"step": step, "queries": done}
        by_name = {q.name: q for q in a.queries}
        ended = {n: c for n, c in done.items() if c.get("phase") != "Running" and n in by_name}
        failed = [why_ended(by_name[n], c) for n, c in ended.items() if c["phase"] == "Failed"]
        if failed:
            return self.rollback(f"analysis at step {step + 1} failed: {'; '.join(failed)}"[:1024], reason="AnalysisFailed")
        if len(ended) == len(a.queries):
            notes = "; ".join(why_ended(by_name[n], c) for n, c in ended.items())
            if any(c["phase"] == "Inconclusive" for c in ended.values()):
                self.prev["paused"] = True
                self.prev["holdReason"] = (f"analysis at step {step + 1} was inconclusive ({notes}); "
                                           "promote, resume (measure again) or abort")[:1024]
                self.event("Warning", C.CANARY_ANALYSIS, self.prev["holdReason"])
                return dataclasses.replace(base, canary_status=self.prev,
                                           progressing=(C.CANARY_PAUSED, f"{label}: {self.prev['holdReason']}"))
            self.event("Normal", C.CANARY_ANALYSIS, f"analysis at step {step + 1} passed: {notes}"[:1024])
            self.prev.pop("analysis", None)
            return self.next_step(step + 1, None)
        first = _time(self.prev.get("stepStartedAt"), self.now) + dt.timedelta(seconds=a.delay_seconds)
        waits = [(t - self.now).total_seconds() for q in a.queries
                 if (t := next_measurement_at(q, done.get(q.name), first, self.now)) is not None]
        progress = ", ".join(f"{q.name} {done.get(q.name, {}).get('measured', 0)}/{q.count}" for q in a.queries)
        return dataclasses.replace(base, canary_status=self.prev, requeue_after=max(1.0, min(waits)),
                                   progressing=(C.CANARY_ANALYSIS, f"{label}: analysis at {w}% of requests ({progress} measured)"))

    def _shrink_requeue(self, left: float | None) -> float | None:
        waits = [x for x in (left,) if x is not None]
        if self.prev.get("shrinkSince"):
            waits.append(max(0.5, self.rollout.scale_down_delay_seconds - self.elapsed("shrinkSince")))
        return min(waits) if waits else None

    def promoting_start(self) -> Decision:
        if self.prev.get("fleet"):
            return self.promote()
        # A rollout an earlier operator started: its candidate fleet (``<name>-canary``) hands its replicas
        # back to the stable fleet, which takes the candidate's spec (:meth:`promoting`).
        self.prev.update(phase="Promoting", stepStartedAt=rfc3339(self.now), paused=False)
        self.prev.pop("holdReason", None)
        self.prev.pop("waitingSince", None)
        self.event("Normal", C.CANARY_PROMOTING, f"revision {self.candidate_rev()} serves every replica; the stable fleet takes its spec")
        return self.promoting()

    def promote(self) -> Decision:
        """The candidate's fleet holds every replica, ready, and the stable fleet none (the ramp is done):
        it becomes the stable fleet as it is. No replica moves and no pod is recreated; the entry points
        and the route, on the candidate's pools already, stay on the same pods; the old fleet is pruned."""
        cand = self.candidate_rev()
        self.prev.update(phase="Promoted", weight=0, stepStartedAt=rfc3339(self.now))
        for key in ("replicas", "shrinkSince", "shrinkTo", "waitingSince", "paused", "readyAt", "servingFleet", "failingSince",
                    "failure", "holdReason", "promote"):
            self.prev.pop(key, None)
        self.event("Normal", C.CANARY_PROMOTED, f"revision {cand} is the stable revision: its fleet {self.prev['fleet']} "
                   "serves every replica and stays as it is")
        return Decision(canary_status=self.prev, promoted=True, snapshots=(cand,))

    def promoting(self) -> Decision:
        """Continues a ``Promoting`` an earlier operator started (see :meth:`promoting_start`)."""
        cand = self.candidate_rev()
        # (Abort is refused here: a failure is reported, and both fleets keep serving by ready capacity.)
        failing = self.failing(both_fleets=True)
        if self.prev.get("paused"):
            # Held where it is: no replica moves; the route still follows the fleets' ready capacity.
            reps = self.replicas(self.prev)
            w = self.route(reps, {r: k for r, (_, k) in reps.items()}, "candidate", stable_rev=cand, allowed=True, ceiling=100)
            self.prev.pop("waitingSince", None)
            return Decision(canary=True, stable_is_candidate=True, replicas=reps, weight=w, canary_status=self.prev,
                            snapshots=tuple(dict.fromkeys(r for r in (self.stable, cand) if r)),
                            progressing=(C.CANARY_PAUSED, f"promotion paused (hisparse rollout resume continues); "
                                                          f"{w}% of requests on the candidate fleet"))
        goal = {r: n for r, (n, _) in self.roles.items()}
        reps, done, planned = self.moved("candidate", goal=goal, src_rev=cand, dst_rev=cand, src_keeps=True, regrow=True)
        # Both fleets run the candidate's revision now.
        w = self.route(reps, planned, "candidate", stable_rev=cand, allowed=True, ceiling=100)
        left = self._waiting(done)
        base = Decision(canary=True, stable_is_candidate=True, replicas=reps, weight=w, canary_status=self.prev,
                        snapshots=tuple(dict.fromkeys(r for r in (self.stable, cand) if r)))
        if done and w == 0 and not self.prev.get("servingFleet"):
            self.prev.update(phase="Promoted", weight=0, stepStartedAt=rfc3339(self.now))
            for key in ("replicas", "shrinkSince", "shrinkTo", "waitingSince", "paused", "readyAt", "servingFleet", "failingSince",
                        "failure"):
                self.prev.pop(key, None)
            self.event("Normal", C.CANARY_PROMOTED, f"revision {cand} is the stable revision")
            return Decision(canary_status=self.prev, promoted=True, snapshots=(cand,))
        if failing is not None and failing <= 0:
            msg = (f"promotion stalled: {self.failed_for()}; both fleets keep serving by ready capacity (abort is "
                   "refused while promoting and a new spec waits until it ends: fix the cause)")
            return dataclasses.replace(base, degraded=(C.CANARY_STALLED, msg), progressing=(C.CANARY_STALLED, msg))
        if left is not None and left <= 0:
            msg = (f"promotion stalled: replicas asked for were not ready within readyTimeoutSeconds "
                   f"({self.rollout.ready_timeout_seconds}s); both fleets keep serving by ready capacity")
            return dataclasses.replace(base, degraded=(C.CANARY_STALLED, msg), progressing=(C.CANARY_STALLED, msg))
        return dataclasses.replace(base, requeue_after=self._shrink_requeue(left),
                                   progressing=(C.CANARY_PROMOTING, f"the stable fleet takes revision {cand}; {w}% of requests "
                                                f"on the candidate fleet{self.failing_note(failing, 'reported as stalled')}"))

    def rollback(self, why: str, *, parity: dict[str, Any] | None = None, reason: str = "") -> Decision:
        if reason != "CandidateFailed":
            self.prev.pop("failure", None)  # the evidence is kept only with the rollback it caused
        self.event("Warning", C.CANARY_ROLLED_BACK, f"revision {self.candidate_rev()} rolled back: {why}")
        dec = self.wind_down_start("RolledBack", why)
        return dataclasses.replace(dec, parity_status=parity)

    def wind_down_start(self, phase: str, why: str, *, outcome_event: bool = False) -> Decision:
        self.prev.update(phase=phase, message=why[:1024], stepStartedAt=rfc3339(self.now), paused=False)
        # (A scale-down the steps planned for the stable fleet is void: a rollback never takes its replicas.)
        for key in ("holdReason", "waitingSince", "promote", "shrinkSince", "shrinkTo", "failingSince"):
            self.prev.pop(key, None)
        if outcome_event:
            self.prev.pop("failure", None)
            self.event("Normal", C.CANARY_SUPERSEDED, why)
        return self.winding_down()

    def winding_down(self) -> Decision:
        stable = self.stable
        assert stable is not None
        goal = {r: n for r, (n, _) in self.roles.items()}
        # A candidate that carries traffic (a rollback after the first weight step, or a ramp's) keeps its
        # replicas, and a share of the route that only falls, until stable replicas are ready in their
        # place: traffic leaves it no faster than stable capacity returns. One that never had traffic
        # (rolled back in Parity) serves nothing and goes at once.
        carried = int(self.prev.get("weight") or 0) > 0 or self.prev.get("servingFleet") == "candidate"
        reps, done, planned = self.moved("candidate", goal=goal, src_rev=self.candidate_rev(), dst_rev=stable,
                                         src_keeps=carried)
        w = self.route(reps, planned, "candidate", stable_rev=stable, allowed=carried,
                       ceiling=int(self.prev.get("weight") or 0))
        snapshots = tuple(dict.fromkeys((stable, self.candidate_rev())))
        degraded = (C.CANARY_ROLLED_BACK, _rolled_back_message(self.prev)) if self.prev["phase"] == "RolledBack" else None
        if all(k == 0 for _, k in reps.values()) and not self.prev.get("shrinkSince"):
            self.prev.pop("replicas", None)
            self.prev.pop("readyAt", None)
            self.prev.pop("servingFleet", None)
            self.prev["weight"] = 0
            return Decision(stable_is_candidate=False, canary_status=self.prev, snapshots=(stable,), degraded=degraded)
        return Decision(canary=True, stable_is_candidate=False, replicas=reps, weight=w, canary_status=self.prev,
                        snapshots=snapshots, degraded=degraded, requeue_after=self._shrink_requeue(None),
                        progressing=(C.CANARY_WINDING_DOWN, f"returning the candidate's replicas to the stable revision {stable}; "
                                     f"{w}% of requests to {self.candidate_rev()}"))


def _rolled_back_message(st: dict[str, Any] | None) -> str:
    if not st:
        return ""
    return (f"revision {st.get('revision')} was rolled back: {st.get('message', '')}; the stable revision serves. "
            "Change the spec to roll out another revision, or run hisparse rollout retry.")


def snapshot(d: HiSparseDeployment, revision: str, *, rendering: bool = True) -> dict[str, Any]:
    """ControllerRevision keeping ``d``'s spec as revision ``revision`` (owned by the resource), and, when
    this operator renders ``d`` as that revision, the pods as it renders them (:mod:`..render.pinned`): a
    later operator keeps the fleet from those while it rolls its own rendering through the gate. (Written
    once: a ControllerRevision's data is immutable, so the executor passes ``rendering=False`` for one
    that exists, and the render is not repeated at every reconcile.)"""
    from ..render import pinned, revision as revision_of

    m = meta(d, names.snapshot(d.name, revision), "revision", extra_labels={L.REVISION: revision})
    data: dict[str, Any] = {SNAPSHOT_KEY: d.spec.model_dump(mode="json", by_alias=True, exclude_none=True)}
    if rendering and revision_of(d) == revision:
        data[RENDERING_KEY] = pinned.rendering(d)
    return obj("apps/v1", "ControllerRevision", m, revision=max(1, d.metadata.generation or 1), data=data)


def spec_of(snapshot_obj: dict[str, Any] | None) -> dict[str, Any] | None:
    if not snapshot_obj:
        return None
    data = snapshot_obj.get("data") or {}
    spec = data.get(SNAPSHOT_KEY)
    return spec if isinstance(spec, dict) else None


def rendering_of(snapshot_obj: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The pods a snapshot keeps as its operator rendered them (None: a snapshot an earlier operator wrote)."""
    kept = ((snapshot_obj or {}).get("data") or {}).get(RENDERING_KEY)
    return kept if isinstance(kept, list) and all(isinstance(o, dict) for o in kept) else None
