"""Canary rollouts, as a pure state machine over what the status records and what the cluster shows.

A new revision (``render.revision``: everything that shapes serving pods) of a resource that already
has a stable one, with ``spec.rollout.strategy: Canary``, is not applied in place. It runs beside the
stable revision as its own fleet (``<name>-canary-*``, its own InferencePool and EPP) and goes through:

- ``Parity``: the candidate starts with no traffic; once all its replicas are ready, a Job compares its
  greedy tokens with the stable revision's. A divergence, a failed Job, or no verdict within
  ``parity.timeoutSeconds`` of the candidate's start rolls back.
- ``Shifting``: the HTTPRoute sends ``steps[i].weight`` percent to the candidate, each step held
  ``pauseSeconds``; a candidate replica that stops being ready rolls back.
- ``Promoting``: the candidate keeps all traffic while the stable fleet is updated in place to the
  candidate's spec; once it is ready at the new revision, that revision is the stable one, traffic
  returns to it and the candidate's objects are pruned (as Flagger promotes a canary into its primary).
- ``RolledBack``: the candidate's objects are pruned, the stable revision serves untouched, and
  ``Degraded`` says why until the spec names another revision.

The stable revision's spec is kept in a ControllerRevision (``<name>-<revision>``), so the operator
renders it while the resource's spec holds the candidate. Every transition is a function of the
previous status, the observations and the clock, so a restarted operator continues the same rollout.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from hisparse_runtime.engine.parity import ParitySummary
from pydantic import ValidationError

from .. import names
from ..api import HiSparseDeployment, labels as L
from ..render.common import NOT_POD_SHAPING, meta, obj
from . import conditions as C

SNAPSHOT_KEY: Final = "spec"
"""Key of the spec in a ControllerRevision's ``data``."""

ParityVerdict = Literal["passed", "failed"]

RUNNING: Final = ("Parity", "Shifting", "Promoting")
"""``status.canary.phase`` values of a rollout under way (the model's ``CanaryStatus.phase``)."""
OUTCOMES: Final = {"Promoted": "promoted", "RolledBack": "rolled_back"}
"""Phases that end a rollout, and the outcome label the metrics count them under."""


@dataclass(frozen=True)
class Observed:
    """What the reconcile saw of the cluster this time."""

    candidate_ready: bool = False
    """Every replica of the candidate's roles is ready, and its endpoint picker when routing is on."""
    parity: ParityVerdict | None = None
    """The parity Job's verdict, None while it runs (or before it exists)."""
    parity_message: str = ""
    parity_summary: dict[str, Any] | None = None
    """The Job pod's summary (``engine.parity.ParitySummary``), when it left one."""
    stable_ready: bool = False
    """Every replica of the stable fleet is ready at the revision it is rendered with."""


@dataclass(frozen=True)
class Decision:
    """What to render and record."""

    canary: bool = False
    """Render the candidate's objects beside the stable ones."""
    stable_is_candidate: bool = True
    """Render the stable fleet from the resource's (candidate) spec; False: from the stable snapshot."""
    weight: int = 0
    """The candidate's share of the HTTPRoute."""
    run_parity: bool = False
    canary_status: dict[str, Any] | None = None
    """``status.canary`` to write (None: remove it)."""
    parity_status: dict[str, Any] | None = None
    """A new ``status.parity`` (None: keep the previous one)."""
    promoted: bool = False
    """The candidate became the stable revision in this step."""
    progressing: tuple[str, str] | None = None
    """(reason, message) of ``Progressing=True`` while a canary runs."""
    degraded: tuple[str, str] | None = None
    """(reason, message) of ``Degraded=True`` after a rollback."""
    requeue_after: float | None = None
    """Seconds until the state machine must look again without an event (a pause or a deadline)."""
    snapshots: tuple[str, ...] = field(default_factory=tuple)
    """Revisions whose spec must be kept (stable, and the candidate of a running canary)."""


def _time(text: str | None, default: dt.datetime) -> dt.datetime:
    if not text:
        return default
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def decide(d: HiSparseDeployment, *, stable: str | None, candidate: str, has_snapshot: bool,
           previous: dict[str, Any] | None, observed: Observed, now: dt.datetime) -> Decision:
    """The next step of the rollout of ``candidate`` (``d``'s revision) over ``stable``.

    ``previous``: the last ``status.canary``; ``has_snapshot``: the stable revision's spec is at hand."""
    rollout = d.spec.rollout
    prev = previous if previous and previous.get("revision") == candidate else None
    if prev and prev.get("phase") == "Promoting" and (stable == candidate or observed.stable_ready):
        # The stable fleet is ready at the candidate's revision (the status may already say so).
        st = {**prev, "phase": "Promoted", "weight": 0, "stepStartedAt": rfc3339(now)}
        return Decision(canary_status=st, promoted=True, snapshots=(candidate,))
    in_place = stable is None or stable == candidate or rollout.strategy != "Canary" or not has_snapshot
    if in_place and not (prev and prev.get("phase") == "Promoting"):
        # First rollout, Recreate, nothing new, or no stable spec to keep serving: the fleet follows the
        # spec. The last canary's outcome stays on record, an unfinished one is withdrawn.
        kept = previous if previous and previous.get("phase") in OUTCOMES else None
        rolled_back = kept is not None and kept.get("phase") == "RolledBack" and kept.get("revision") == candidate
        return Decision(canary_status=kept, snapshots=(candidate,),
                        degraded=(C.CANARY_ROLLED_BACK, _rolled_back_message(kept)) if rolled_back else None)
    assert stable is not None
    keep = (stable, candidate)
    if prev and prev.get("phase") == "RolledBack":
        return Decision(stable_is_candidate=False, canary_status=prev, snapshots=(stable,),
                        degraded=(C.CANARY_ROLLED_BACK, _rolled_back_message(prev)))
    if prev is None or prev.get("phase") == "Promoted":
        prev = {"revision": candidate, "phase": "Parity", "step": 0, "weight": 0, "stepStartedAt": rfc3339(now)}
    started = _time(prev.get("stepStartedAt"), now)
    elapsed = (now - started).total_seconds()
    phase = prev["phase"]

    def rollback(why: str, parity: dict[str, Any] | None = None) -> Decision:
        st = {**prev, "phase": "RolledBack", "weight": 0, "message": why, "stepStartedAt": rfc3339(now)}
        return Decision(stable_is_candidate=False, canary_status=st, parity_status=parity, snapshots=(stable,),
                        degraded=(C.CANARY_ROLLED_BACK, _rolled_back_message(st)))

    def promoting(st: dict[str, Any]) -> Decision:
        return Decision(canary=True, stable_is_candidate=True, weight=100, canary_status=st, snapshots=keep,
                        progressing=(C.CANARY_PROMOTING, f"updating the stable fleet to {candidate}; the candidate serves all traffic"))

    def at_step(step: int, st: dict[str, Any], requeue_after: float) -> Decision:
        s = rollout.steps[step]
        return Decision(canary=True, stable_is_candidate=False, weight=s.weight, canary_status=st, snapshots=keep,
                        requeue_after=requeue_after,
                        progressing=(C.CANARY_SHIFTING, f"step {step + 1}/{len(rollout.steps)}: {s.weight}% of requests to {candidate}"))

    def shifting(step: int) -> Decision:
        """Start ``step`` now (past the last one: promote)."""
        if step >= len(rollout.steps):
            return promoting({"revision": candidate, "phase": "Promoting", "step": step, "weight": 100,
                              "stepStartedAt": rfc3339(now)})
        s = rollout.steps[step]
        st = {"revision": candidate, "phase": "Shifting", "step": step, "weight": s.weight, "stepStartedAt": rfc3339(now)}
        return at_step(step, st, float(s.pause_seconds))

    if phase == "Parity":
        timeout = rollout.parity.timeout_seconds
        if elapsed >= timeout:
            return rollback(f"no parity verdict within {timeout}s of the candidate's start"
                            + ("" if observed.candidate_ready else " (its replicas never became ready)"),
                            _parity(candidate, False, f"timed out after {timeout}s", now))
        if not observed.candidate_ready:
            return Decision(canary=True, stable_is_candidate=False, canary_status=prev, snapshots=keep,
                            requeue_after=timeout - elapsed,
                            progressing=(C.CANARY_STARTING, f"waiting for the candidate {candidate} to be ready (no traffic)"))
        if not rollout.parity.enabled:
            return shifting(0)
        if observed.parity == "failed":
            where = (observed.parity_summary or {}).get("first_divergence")
            return rollback(f"token parity failed: {where or observed.parity_message}",
                            _parity(candidate, False, observed.parity_message, now, observed.parity_summary))
        if observed.parity == "passed":
            return dataclasses.replace(shifting(0), parity_status=_parity(candidate, True, observed.parity_message, now,
                                                                          observed.parity_summary))
        return Decision(canary=True, stable_is_candidate=False, run_parity=True, canary_status=prev, snapshots=keep,
                        requeue_after=timeout - elapsed,
                        progressing=(C.CANARY_PARITY, f"comparing the greedy tokens of {candidate} with {stable} (no traffic)"))
    if phase == "Shifting":
        step = int(prev.get("step") or 0)
        if not observed.candidate_ready:
            return rollback(f"a replica of the candidate stopped being ready at step {step + 1}")
        pause = rollout.steps[step].pause_seconds if step < len(rollout.steps) else 0
        if elapsed < pause:
            return at_step(step, prev, pause - elapsed)
        return shifting(step + 1)
    # Promoting: the stable fleet is rendered from the candidate's spec until it is ready (above).
    return promoting(prev)


def _parity(revision: str, passed: bool, message: str, now: dt.datetime,
            summary: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"revision": revision, "passed": passed, "finishedAt": rfc3339(now)}
    if message:
        out["message"] = message[:1024]
    if summary:
        out.update(prompts=summary["prompts"], diverged=summary["diverged"])
        if summary.get("first_divergence"):
            out["firstDivergence"] = summary["first_divergence"]
    return out


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


def _rolled_back_message(st: dict[str, Any] | None) -> str:
    if not st:
        return ""
    return (f"revision {st.get('revision')} was rolled back: {st.get('message', '')}; the stable revision serves. "
            "Change the spec to roll out another revision.")


def job_verdict(job: dict[str, Any] | None) -> tuple[ParityVerdict | None, str]:
    """A finished parity Job's verdict from its conditions (the Job controller sets them)."""
    if job is None:
        return None, ""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") == "Complete":
            return "passed", f"every prompt gave the same tokens (Job {job['metadata']['name']})"
        if c.get("type") == "Failed":
            why = c.get("message") or c.get("reason") or "the Job failed"
            return "failed", f"{why}; the full report is in the log of Job {job['metadata']['name']}'s pod"
    return None, ""


def snapshot(d: HiSparseDeployment, revision: str) -> dict[str, Any]:
    """ControllerRevision keeping ``d``'s spec as revision ``revision`` (owned by the resource)."""
    m = meta(d, names.snapshot(d.name, revision), "revision", extra_labels={L.REVISION: revision})
    return obj("apps/v1", "ControllerRevision", m, revision=max(1, d.metadata.generation or 1),
               data={SNAPSHOT_KEY: d.spec.model_dump(mode="json", by_alias=True, exclude_none=True)})


def stable_spec(kept: dict[str, Any], d: HiSparseDeployment) -> dict[str, Any]:
    """The stable fleet's spec: what shapes its pods from the snapshot ``kept`` (written once, when its
    revision was current), replica counts and the sections that do not shape pods from the resource
    now, so scaling, routing and monitoring changes reach the stable fleet during a canary too."""
    now = d.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    out = {k: v for k, v in kept.items() if k not in NOT_POD_SHAPING}
    out.update({k: now[k] for k in NOT_POD_SHAPING if k in now})
    for role in ("prefill", "decode"):
        if isinstance(out.get(role), dict) and isinstance(now.get(role), dict) and "replicas" in now[role]:
            out[role] = {**out[role], "replicas": now[role]["replicas"]}
    return out


def spec_of(snapshot_obj: dict[str, Any] | None) -> dict[str, Any] | None:
    if not snapshot_obj:
        return None
    data = snapshot_obj.get("data") or {}
    spec = data.get(SNAPSHOT_KEY)
    return spec if isinstance(spec, dict) else None
