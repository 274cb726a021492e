"""Canary rollouts: the state machine (pure), the two-fleet render, and whole rollouts driven through the
reconciler against an in-memory apiserver (the real control plane runs them in e2e)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime as dt
import time
from typing import Any

import pytest
import yaml
from hypothesis import given, settings, strategies as st
from prometheus_client import REGISTRY
from opsupport import EXAMPLES
from test_reconcile_caches import NAME, NS, FakeKube, Operator
from test_reconcile_caches import R as RC

from hisparse_operator import names
from hisparse_operator.api import HiSparseDeployment, labels as L, validate
from hisparse_operator.api.status import CanaryStatus
from hisparse_operator.controller import conditions as C
from hisparse_operator.controller import failure as F
from hisparse_operator.controller import rollout as R
from hisparse_runtime.engine.parity import ParitySummary
from hisparse_operator.render import Canary, render_validated, revision

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


def _deployment(path: str = "hisparse-deployment.yaml", image: str | None = None, **rollout: Any):
    doc = yaml.safe_load((EXAMPLES / path).read_text())
    if image:
        doc["spec"].setdefault("engine", {})["image"] = image
    if rollout:
        doc["spec"]["rollout"] = rollout
    d, errors = validate(doc, None)
    assert not errors and d is not None, errors
    return d


CANARY = {"strategy": "Canary", "steps": [{"weight": 10, "pauseSeconds": 60}, {"weight": 100, "pauseSeconds": 30}],
          "parity": {"timeoutSeconds": 600}}


# --- the planner --------------------------------------------------------------------------------

STABLE = "stable0001"


def _fleet(d: Any, ready: dict[str, int] | int, rev: str) -> dict[str, R.FleetObs]:
    roles = R.roles_of(d)
    return {r: R.FleetObs(revision=rev, ready=ready if isinstance(ready, int) else ready.get(r, 0),
                          pods=ready if isinstance(ready, int) else ready.get(r, 0)) for r in roles}


def _passed(prompts: int = 32) -> R.Verdict:
    return R.Verdict("passed", "Passed", "ok", {"ok": True, "prompts": prompts, "compared": prompts, "diverged": 0,
                                                 "errors": 0, "end_to_end": True})


def _step(d: Any, prev: dict[str, Any] | None, now: dt.datetime, *, cand: int | dict[str, int] = 0,
          stable: int | dict[str, int] = 99, parity: R.Verdict | None = None, action: str | None = None,
          stable_rev: str = STABLE, analysis: Any = None, unscheduled: str | None = None,
          pods: dict[str, list[dict[str, Any]]] | None = None, stable_pods: dict[str, list[dict[str, Any]]] | None = None,
          ) -> R.Decision:
    """``pods`` / ``stable_pods``: per role, pod objects of that fleet as the apiserver returns them (their
    definite failures are read as the reconciler reads them)."""
    rev = revision(d)
    promoting = (prev or {}).get("phase") == "Promoting"

    def with_pods(fleet: dict[str, R.FleetObs], by_role: dict[str, list[dict[str, Any]]] | None) -> dict[str, R.FleetObs]:
        return {r: dataclasses.replace(o, failure=F.first_failure((by_role or {}).get(r, []))) for r, o in fleet.items()}

    obs = R.Observed(stable=with_pods(_fleet(d, stable, rev if promoting else stable_rev), stable_pods),
                     candidate=with_pods(_fleet(d, cand, rev), pods),
                     parity=parity, parity_unscheduled=unscheduled, action=action, analysis=analysis)
    return R.decide(d, stable=STABLE, candidate=rev, has_snapshot=True, previous=prev, observed=obs, now=now)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _settle(d: Any, s: R.Decision, t: float, **kw: Any) -> tuple[R.Decision, float]:
    """Tick (every replica given is ready, time passing) until the step reaches its capacity."""
    for _ in range(50):
        reps = s.replicas or {}
        t += 31
        s = _step(d, s.canary_status, _at(t), cand={r: k for r, (_, k) in reps.items()},
                  stable={r: v for r, (v, _) in reps.items()}, **kw)
        if not (s.canary_status or {}).get("waitingSince") and not (s.canary_status or {}).get("shrinkSince") \
                and s.progressing and "replacing" not in s.progressing[1]:
            return s, t
    raise AssertionError("never settled")


def test_the_phases_the_operator_acts_on_are_the_api_model_s() -> None:
    assert set(R.RUNNING) | set(R.OUTCOMES) == set(CanaryStatus.model_fields["phase"].annotation.__args__)


def test_a_canary_is_one_replica_per_role_and_gets_no_traffic_before_parity() -> None:
    d = _deployment(image="rt:new", **CANARY)  # prefill 8 x 1 node, decode 1 x 8 nodes
    s = _step(d, None, T0)
    assert s.replicas == {"prefill": (8, 1), "decode": (1, 1)} and s.weight == 0 and not s.run_parity
    # Not ready yet: looked at again soon (pods are not watched; a definite failure must be seen in time).
    assert s.canary_status["phase"] == "Parity" and s.requeue_after == 30
    s = _step(d, s.canary_status, _at(3000), cand=1)  # ready after a model load: parity's clock starts now
    assert s.run_parity and s.weight == 0 and s.canary_status["readyAt"] == R.rfc3339(_at(3000))
    assert s.requeue_after == d.spec.rollout.parity.timeout_seconds  # model load not counted


def test_a_parity_job_pod_the_scheduler_cannot_place_is_named_in_the_progress_message() -> None:
    d = _deployment(image="rt:new", **CANARY)
    s = _step(d, _step(d, None, T0).canary_status, _at(3000), cand=1)
    pending = {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 Insufficient cpu."}]}}
    running = {"status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}}
    gated = {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}}
    assert R.unscheduled([running, gated, pending]) == "0/3 nodes are available: 3 Insufficient cpu."
    assert R.unscheduled([running, gated]) is None
    why = R.unscheduled([pending])
    waiting = _step(d, s.canary_status, _at(3010), cand=1, unscheduled=why)
    assert waiting.canary_status["phase"] == "Parity" and waiting.run_parity
    assert waiting.progressing == (C.CANARY_PARITY, f"comparing the tokens of {revision(d)} with {STABLE} (no traffic); "
                                   "the parity Job's pod cannot be scheduled: 0/3 nodes are available: 3 Insufficient cpu.")
    assert "scheduled" not in _step(d, s.canary_status, _at(3010), cand=1).progressing[1]


def test_a_whole_canary_replaces_stable_replicas_progressively_and_promotes() -> None:
    d = _deployment(image="rt:new", strategy="Canary", canary={"prefill": 1, "decode": 1},
                    steps=[{"weight": 50, "pauseSeconds": 0}], scaleDownDelaySeconds=10)
    n = {"prefill": 8, "decode": 1}
    t = 0.0
    s = _step(d, None, _at(t))
    s = _step(d, s.canary_status, _at(t), cand=1)
    s = _step(d, s.canary_status, _at(t), cand=1, parity=_passed())
    assert s.canary_status["phase"] == "Shifting" and s.parity_status["passed"]
    seen_phases, weights = [], []
    for _ in range(200):
        t += 11
        reps = s.replicas or {}
        st = s.canary_status or {}
        ready_c = {r: k for r, (_, k) in reps.items()}
        ready_s = {r: v for r, (v, _) in reps.items()}
        for role, (sr, cr) in reps.items():
            assert sr + cr <= n[role] + 1, (role, sr, cr)  # surge: at most the canary's size
        s = _step(d, st, _at(t), cand=ready_c, stable=ready_s)
        seen_phases.append(s.canary_status["phase"])
        weights.append(s.weight)
        if s.promoted:
            break
    assert s.promoted and not s.canary and s.snapshots == (revision(d),)
    # One decode replica: the step of 50 runs one of each revision (the canary's surge) and shares the
    # route, before the ramp hands the candidate everything.
    assert "Promoting" in seen_phases and 50 in weights and max(weights) == 100
    assert weights.index(50) < weights.index(100)


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3),
       st.lists(st.integers(1, 99), min_size=1, max_size=3))
def test_property_every_step_below_100_shares_the_route(prefill: int, decode: int, canary_p: int, canary_d: int,
                                                        weights: list[int]) -> None:
    """Whatever the sizes and the (rising) weight steps below 100: once a step's replicas are ready, both
    revisions serve (the route is strictly between 0 and 100, each fleet keeps a ready replica of each
    role), and replicas never exceed the spec's plus the canary's size. With one decode replica the old
    rule handed the candidate the whole role at the first step (route 0 -> 100, no shared step)."""
    steps = [{"weight": w, "pauseSeconds": 60} for w in sorted(weights)]
    d = _sized(_deployment(image="rt:new", strategy="Canary", canary={"prefill": canary_p, "decode": canary_d},
                           steps=steps, parity={"enabled": False}, scaleDownDelaySeconds=10),
               prefill=prefill, decode=decode)
    n = {"prefill": prefill, "decode": decode}
    c = {r: min(k, n[r]) for r, k in (("prefill", canary_p), ("decode", canary_d))}
    s = _step(d, None, T0)
    t = 0.0
    shared: dict[int, int] = {}
    for _ in range(400):
        t += 11
        reps = s.replicas or {}
        for r, (sr, cr) in reps.items():
            assert sr + cr <= n[r] + c[r], (r, sr, cr)
        s = _step(d, s.canary_status, _at(t), cand={r: k for r, (_, k) in reps.items()},
                  stable={r: v for r, (v, _) in reps.items()})
        st_ = s.canary_status or {}
        if st_.get("phase") != "Shifting":
            break
        settled = s.progressing is not None and s.progressing[0] == C.CANARY_SHIFTING and "replacing" not in s.progressing[1]
        if settled and int(st_["step"]) < len(steps):
            shared[int(st_["step"])] = s.weight
            assert all(v > 0 for v, _ in s.replicas.values()), s.replicas
    assert (s.canary_status or {}).get("phase") in ("Promoting", "Promoted"), s.canary_status
    assert sorted(shared) == list(range(len(steps))), (shared, steps)
    assert all(0 < w < 100 for w in shared.values()), (shared, steps, n, c)


def _sized(d: Any, *, prefill: int, decode: int) -> Any:
    spec = d.spec.model_copy(update={"prefill": d.spec.prefill.model_copy(update={"replicas": prefill}),
                                     "decode": d.spec.decode.model_copy(update={"replicas": decode})})
    return d.model_copy(update={"spec": spec})


def test_divergent_tokens_roll_back_and_stay_rolled_back_until_the_spec_changes_or_a_retry() -> None:
    d = _deployment(image="rt:bad", **CANARY)
    s = _step(d, None, T0)
    s = _step(d, s.canary_status, T0, cand=1)
    bad = R.Verdict("failed", "Diverged", "1 of 32 prompts diverged, first prompt 3 at token 17", {
        "ok": False, "prompts": 32, "compared": 32, "diverged": 1, "errors": 0, "first_divergence": "prompt 3 at token 17"})
    s = _step(d, s.canary_status, T0, cand=1, parity=bad)
    assert s.canary_status["phase"] == "RolledBack" and s.weight == 0 and not s.stable_is_candidate
    assert s.parity_status["passed"] is False and s.parity_status["reason"] == "Diverged"
    assert any("token 17" in e[2] for e in s.events)
    s = _step(d, s.canary_status, _at(60), cand=1)  # the candidate's replica goes after the delay
    assert not s.canary and s.canary_status["phase"] == "RolledBack" and s.degraded
    later = _step(d, s.canary_status, _at(86400), cand=0)
    assert not later.canary and later.degraded
    retried = _step(d, later.canary_status, _at(86401), action="retry@1")
    assert retried.canary and retried.canary_status["phase"] == "Parity" and retried.canary_status["attempt"] == 2
    fixed = _deployment(image="rt:fixed", **CANARY)
    again = _step(fixed, s.canary_status, _at(86400))
    assert again.canary and again.canary_status["phase"] == "Parity" and again.canary_status["attempt"] == 1


def test_deadlines_count_from_their_own_phase_and_a_passed_verdict_wins_over_the_deadline() -> None:
    d = _deployment(image="rt:new", **CANARY)
    s = _step(d, None, T0)
    late = _step(d, s.canary_status, _at(d.spec.rollout.ready_timeout_seconds))
    assert late.canary_status["phase"] == "RolledBack" and "not ready within" in late.canary_status["message"]
    ready = _step(d, s.canary_status, _at(4000), cand=1)
    timeout = d.spec.rollout.parity.timeout_seconds
    assert _step(d, ready.canary_status, _at(4000 + timeout - 1), cand=1).canary_status["phase"] == "Parity"
    assert _step(d, ready.canary_status, _at(4000 + timeout), cand=1).parity_status["reason"] == "TimedOut"
    # The operator was down past the deadline; the Job's pass is read first.
    after = _step(d, ready.canary_status, _at(4000 + 10 * timeout), cand=1, parity=_passed())
    assert after.canary_status["phase"] == "Shifting"


def test_in_place_without_a_stable_revision_and_with_recreate_but_a_lost_snapshot_holds() -> None:
    d = _deployment(image="rt:new", **CANARY)
    first = R.decide(d, stable=None, candidate=revision(d), has_snapshot=False, previous=None,
                     observed=R.Observed(), now=T0)
    recreate = _deployment(image="rt:new", strategy="Recreate")
    rec = _step(recreate, None, T0)
    assert revision(recreate) == revision(d)  # the strategy does not shape pods
    for s in (first, rec):
        assert not s.canary and s.stable_is_candidate and s.canary_status is None and s.hold is None
    lost = R.decide(d, stable=STABLE, candidate=revision(d), has_snapshot=False, previous=None,
                    observed=R.Observed(), now=T0)
    assert lost.hold is not None and lost.hold[0] == C.ROLLOUT_HELD and "Recreate" in lost.hold[1]


def test_a_pause_step_without_a_duration_waits_for_promote_and_controls_act_once() -> None:
    d = _deployment(image="rt:new", strategy="Canary", steps=[{"pause": {}}, {"weight": 100, "pauseSeconds": 0}])
    s = _step(d, None, T0)
    s = _step(d, s.canary_status, T0, cand=1)
    s = _step(d, s.canary_status, T0, cand=1, parity=_passed())
    s, t = _settle(d, s, 0)
    for t in (t + 10, t + 1000, t + 100000):
        s = _step(d, s.canary_status, _at(t), cand={"prefill": 1, "decode": 1}, stable={"prefill": 7, "decode": 0})
        assert s.canary_status["step"] == 0 and s.progressing[0] == C.CANARY_PAUSED, s.progressing
    s = _step(d, s.canary_status, _at(100001), cand=1, action="promote@a")
    assert s.canary_status["step"] == 1 and s.canary_status["handledAction"] == "promote@a"
    again = _step(d, s.canary_status, _at(100002), cand=1, action="promote@a")
    assert again.canary_status["step"] == 1  # the same value is not acted on twice
    aborted = _step(d, s.canary_status, _at(100003), cand=1, action="abort@b")
    assert aborted.canary_status["phase"] == "RolledBack" and "aborted" in aborted.canary_status["message"]


def test_promote_never_skips_parity_and_a_revert_mid_canary_supersedes_it() -> None:
    d = _deployment(image="rt:new", **CANARY)
    s = _step(d, None, T0)
    s = _step(d, s.canary_status, T0, cand=1, action="promote")
    assert s.canary_status["phase"] == "Parity" and s.weight == 0 and any("parity" in e[2] for e in s.events)
    other = _deployment(image="rt:newer", **CANARY)
    sup = _step(other, s.canary_status, _at(1), cand=1)
    assert sup.canary_status["phase"] == "Superseded" and sup.canary_status["revision"] == revision(d)
    assert any(e[1] == C.CANARY_SUPERSEDED for e in sup.events)


def test_a_verdict_with_nothing_compared_never_passes() -> None:
    job = {"metadata": {"name": "j"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert R.job_verdict(job, None, required=4, end_to_end=False).reason == "NoSummary"
    few = {"ok": True, "prompts": 4, "compared": 3, "diverged": 0, "errors": 0, "end_to_end": True}
    assert R.job_verdict(job, few, required=4, end_to_end=True).reason == "TooFewPrompts"
    old = ParitySummary(ok=True, prompts=4, diverged=0, errors=0).model_dump()  # no "compared": nothing counted
    assert R.job_verdict(job, old, required=4, end_to_end=False).result == "failed"
    decode_only = {**few, "compared": 4, "end_to_end": False}
    assert R.job_verdict(job, decode_only, required=4, end_to_end=True).reason == "NotEndToEnd"
    assert R.job_verdict(job, decode_only, required=4, end_to_end=False).result == "passed"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10**6)), st.integers(0, 8))
def test_property_verdicts_pass_only_with_enough_prompts_compared(seeds: list[int], required: int) -> None:
    job = {"metadata": {"name": "j"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    for x in seeds:
        summary = {"ok": x % 2 == 0, "prompts": x % 9, "compared": x % 7, "diverged": (x // 7) % 2, "errors": (x // 11) % 2,
                   "end_to_end": True}
        v = R.job_verdict(job, summary, required=max(1, required), end_to_end=True)
        if v.result == "passed":
            assert summary["compared"] >= max(1, required) and not summary["diverged"] and not summary["errors"]


READY = st.sampled_from([0, 1, 2, 3, 3, 3, 3])  # mostly all of what was given (at most that, see below)
ROLE_OBS = st.fixed_dictionaries({"cand": READY, "stable": READY})
TICK = st.fixed_dictionaries({
    "prefill": ROLE_OBS, "decode": ROLE_OBS, "seconds": st.sampled_from([0, 1, 5, 31, 31, 400, 5000]),
    "parity": st.sampled_from([None, "passed", "passed", "failed"]),
    "action": st.sampled_from([None] * 8 + ["promote", "promote", "abort", "pause", "resume", "retry"]),
    "new_spec": st.sampled_from([False] * 12 + [True]),
})  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(TICK, min_size=1, max_size=60), st.booleans())
def test_property_no_unsafe_state_is_reachable(script: list, gate: bool) -> None:
    """Whatever the cluster shows (each fleet's ready replicas, at most what it was given), the verdicts,
    the controls and the clock: (1) no traffic reaches a candidate before a passed verdict; (2) the route
    never sends traffic to a pool without a ready endpoint while the other has one; (3) per role, stable
    plus candidate replicas never exceed the spec's plus the canary's size; (4) after a rollback the stable
    fleet is rendered from its own snapshot and never loses replicas."""
    rollout = {"strategy": "Canary", "canary": {"prefill": 1, "decode": 1}, "scaleDownDelaySeconds": 30,
               "steps": [{"weight": 70, "pauseSeconds": 60}, {"pause": {}}],
               "parity": {"enabled": gate, "timeoutSeconds": 900}}
    specs = [_deployment(image="rt:new", **rollout), _deployment(image="rt:newer", **rollout)]
    d = _big(specs[0])
    n = {"prefill": 3, "decode": 2}
    prev, now, passed_rev, last = None, T0, set(), None
    rolled_back_stable: dict[str, int] | None = None
    for i, tick in enumerate(script):
        if tick["new_spec"]:
            d = _big(specs[1]) if revision(d) == revision(_big(specs[0])) else _big(specs[0])
        now += dt.timedelta(seconds=tick["seconds"])
        reps = (last.replicas if last is not None and last.replicas else {r: (n[r], 0) for r in n})
        ready_c = {r: min(tick[r]["cand"], reps[r][1]) for r in n}
        ready_s = {r: min(tick[r]["stable"], reps[r][0]) for r in n}
        running_rev = str((prev or {}).get("revision") or revision(d))
        promoting = (prev or {}).get("phase") == "Promoting"
        verdict = {"passed": _passed(), "failed": R.Verdict("failed", "Diverged", "x", None)}.get(tick["parity"])
        obs = R.Observed(
            stable={r: R.FleetObs(revision=running_rev if promoting else STABLE, ready=ready_s[r], pods=reps[r][0]) for r in n},
            candidate={r: R.FleetObs(revision=running_rev, ready=ready_c[r], pods=reps[r][1]) for r in n},
            parity=verdict, action=f"{tick['action']}@{i}" if tick["action"] else None)
        s = R.decide(d, stable=STABLE, candidate=revision(d), has_snapshot=True, previous=prev, observed=obs, now=now)
        st_ = s.canary_status or {}
        if (s.parity_status or {}).get("passed") or (not gate and st_.get("phase") == "Shifting"):
            passed_rev.add((st_.get("revision"), st_.get("attempt")))
        if s.weight > 0:
            assert (st_.get("revision"), st_.get("attempt")) in passed_rev, "traffic before a passed verdict"
        if s.canary and s.replicas:
            cap = {"candidate": all(min(ready_c[r], s.replicas[r][1]) > 0 for r in n),
                   "stable": all(min(ready_s[r], s.replicas[r][0]) > 0 for r in n)}
            if s.weight > 0 and not cap["candidate"]:
                assert not cap["stable"], "traffic to a candidate pool with no ready endpoint"
            if s.weight < 100 and not cap["stable"]:
                assert not cap["candidate"] or st_.get("phase") not in ("Shifting", "Promoting"), \
                    "traffic to a stable pool with no ready endpoint"
            for r in n:
                assert sum(s.replicas[r]) <= n[r] + 1, (r, s.replicas[r])
        if st_.get("phase") == "RolledBack" and s.canary:
            assert not s.stable_is_candidate
            now_stable = {r: s.replicas[r][0] for r in n}
            if rolled_back_stable is not None:
                assert all(now_stable[r] >= rolled_back_stable[r] for r in n), "a rollback took stable replicas"
            rolled_back_stable = now_stable
        elif st_.get("phase") != "RolledBack":
            rolled_back_stable = None
        prev, last = s.canary_status, s
        if s.promoted:
            break


def _big(d: Any) -> Any:
    """``d`` with 3 prefill and 2 decode replicas (the example's decode is one 8-node group)."""
    spec = d.spec.model_copy(update={"prefill": d.spec.prefill.model_copy(update={"replicas": 3}),
                                     "decode": d.spec.decode.model_copy(update={"replicas": 2})})
    return d.model_copy(update={"spec": spec})


def test_route_weight_follows_ready_capacity_in_every_role_and_never_points_at_an_empty_pool() -> None:
    """(Was ``route_weight``, which weighed decode capacity alone: 3 stable and 1 candidate decode replica
    gave 25 whatever prefill showed.) Now the least share of any role, under the step's ceiling."""
    S, K = R.Traffic(0, "stable"), R.Traffic(50, "candidate")

    def w(stable: dict[str, int] | None, cand: dict[str, int] | None, *, ceiling: int = 100, allowed: bool = True,
          previous: R.Traffic = S) -> R.Traffic:
        return R.traffic(ceiling=ceiling, stable=stable, candidate=cand, allowed=allowed, previous=previous)

    assert w({"decode": 3}, {"decode": 1}) == R.Traffic(25, "stable")
    assert w({"prefill": 3, "decode": 3}, {"prefill": 1, "decode": 3}).weight == 25  # prefill's share
    assert w({"prefill": 7, "decode": 1}, {"prefill": 1, "decode": 1}, ceiling=10).weight == 10
    assert w({"prefill": 7, "decode": 1}, {"prefill": 1, "decode": 1}, ceiling=50).weight == 12  # 1/8, rounded down
    assert w({"decode": 0}, {"decode": 1}, ceiling=10) == R.Traffic(100, "candidate")  # no endpoint: availability
    assert w(None, {"decode": 1}, ceiling=10) == R.Traffic(100, "candidate")  # the stable EPP is down
    assert w({"decode": 2}, {"decode": 0}, previous=K) == R.Traffic(0, "stable")
    assert w({"decode": 2}, {"decode": 5}, allowed=False, previous=K) == R.Traffic(0, "stable")
    assert w({"decode": 100}, {"decode": 1}) == R.Traffic(0, "stable")  # below 1%: nothing, not 1
    assert w({"decode": 0}, {"decode": 0}, previous=K) == K  # nothing ready anywhere: as it was
    # Back from the candidate only once the stable fleet has caught up in every role.
    assert w({"prefill": 1, "decode": 1}, {"prefill": 3, "decode": 1}, previous=K).serving == "candidate"
    assert w({"prefill": 3, "decode": 1}, {"prefill": 3, "decode": 1}, previous=K).serving == "stable"
    assert w({"prefill": 1, "decode": 1}, {"prefill": 3, "decode": 1}).serving == "stable"  # never to it while stable serves


# --- the two fleets ------------------------------------------------------------------------------


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _selectors(objs: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = []
    for o in objs:
        spec = o.get("spec") or {}
        sel = spec.get("selector")
        if isinstance(sel, dict):
            out.append(sel.get("matchLabels", sel))
    return out


def _pod_labels(objs: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = []
    for o in objs:
        spec = o.get("spec") or {}
        template = spec.get("template") or (spec.get("leaderWorkerTemplate") or {}).get("workerTemplate")
        if template:
            out.append(template["metadata"]["labels"])
    return out


def test_the_candidate_fleet_is_disjoint_owned_and_weighted() -> None:
    stable = _deployment()
    candidate = _deployment(image="ghcr.io/example/hisparse-runtime:candidate")
    alone = render_validated(stable)
    both = render_validated(stable, Canary(candidate, 25, True))
    canary = [o for o in both if (o["metadata"]["labels"]).get(L.TRACK) == L.TRACK_CANARY]
    stable_objs = [o for o in both if o not in canary]
    # The stable fleet is exactly what it was, but for the route's split.
    assert [o for o in stable_objs if o["kind"] != "HTTPRoute"] == [o for o in alone if o["kind"] != "HTTPRoute"]
    route = next(o for o in both if o["kind"] == "HTTPRoute")
    assert [(b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]] == [
        (names.inference_pool(stable.name), 75), (names.inference_pool(names.fleet(stable.name, revision(candidate))), 25)]
    # Every candidate object: its own name, owned by (and labelled for) the resource, so prune finds it.
    assert not {(o["kind"], o["metadata"]["name"]) for o in canary} & {(o["kind"], o["metadata"]["name"]) for o in alone}
    assert all(o["metadata"]["labels"][L.DEPLOYMENT] == stable.name for o in canary)
    assert all(len(o["metadata"]["name"]) <= 63 for o in both)
    # No selector of one fleet matches a pod of the other (pools, Services, PDBs, monitors, workloads).
    for sel in _selectors(stable_objs):
        assert not any(_matches(sel, pod) for pod in _pod_labels(canary)), sel
    for sel in _selectors(canary):
        assert not any(_matches(sel, pod) for pod in _pod_labels(stable_objs)), sel
    candidate_images = {c["image"] for o in canary for c in _containers(o) if c["name"] == "vllm"}
    assert candidate_images == {"ghcr.io/example/hisparse-runtime:candidate"}
    assert {c["image"] for o in stable_objs for c in _containers(o) if c["name"] == "vllm"} == {stable.spec.engine.image}
    # The judge is not the defendant: the parity Job runs the stable revision's image.
    assert {c["image"] for o in both for c in _containers(o) if c["name"] == "parity"} == {stable.spec.engine.image}


def _containers(o: dict[str, Any]) -> list[dict[str, Any]]:
    spec = o.get("spec") or {}
    template = spec.get("template") or (spec.get("leaderWorkerTemplate") or {}).get("workerTemplate") or {}
    return (template.get("spec") or {}).get("containers") or []


def test_parity_job_compares_each_revision_through_its_own_prefill_and_is_parsed_by_the_runtime() -> None:
    from hisparse_runtime import parity

    stable = _deployment()
    candidate = _deployment(image="rt:candidate")
    job = next(o for o in render_validated(stable, Canary(candidate, 0, True)) if o["kind"] == "Job"
               and o["metadata"]["labels"][L.APP_COMPONENT] == "parity")
    container = job["spec"]["template"]["spec"]["containers"][0]
    parser = argparse.ArgumentParser()
    parity.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(container["args"])
    ns, fleet = stable.namespace, names.fleet("glm52", revision(candidate))
    assert fleet == f"glm52-{revision(candidate)[:6]}"
    assert (args.stable, args.candidate) == (f"http://glm52-serving.{ns}.svc:8000", f"http://{fleet}-serving.{ns}.svc:8000")
    assert (args.stable_prefiller, args.candidate_prefiller) == (f"glm52-prefill-nixl.{ns}.svc:8000",
                                                                 f"{fleet}-prefill-nixl.{ns}.svc:8000")
    assert args.limit == stable.spec.rollout.parity.prompts and args.prompts == "builtin"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == stable.spec.rollout.parity.timeout_seconds
    assert job["metadata"]["labels"][L.REVISION] == revision(candidate)
    # Another parity setting is another Job (a Job's pod cannot change).
    other = _deployment(image="rt:candidate", **{"parity": {"maxTokens": 7}})
    job2 = next(o for o in render_validated(stable, Canary(other, 0, True)) if o["kind"] == "Job"
                and o["metadata"]["labels"][L.APP_COMPONENT] == "parity")
    assert job2["metadata"]["name"] != job["metadata"]["name"]


def _parity_container(stable: Any, candidate: Any, judge: Any = None) -> dict[str, Any]:
    # (One candidate fleet name for every candidate: the container is compared across candidates.)
    job = next(o for o in render_validated(stable, Canary(candidate, 0, True, judge=judge, fleet="glm52-fleet1")) if o["kind"] == "Job"
               and o["metadata"]["labels"][L.APP_COMPONENT] == "parity")
    return job["spec"]["template"]["spec"]["containers"][0]


def test_the_parity_job_runs_the_stable_image_or_the_pinned_one_never_the_candidate_s() -> None:
    from hisparse_operator.render.parity import JudgeImage

    stable = _deployment(image="rt:stable")
    stable = stable.model_copy(update={"spec": stable.spec.model_copy(update={
        "engine": stable.spec.engine.model_copy(update={"image_pull_policy": "Always"})})})
    candidate = _deployment(image="rt:candidate")
    c = _parity_container(stable, candidate)
    assert (c["image"], c["imagePullPolicy"]) == ("rt:stable", "Always")
    pinned = _parity_container(stable, candidate, JudgeImage("registry.example/judge:1", "IfNotPresent"))
    assert (pinned["image"], pinned["imagePullPolicy"]) == ("registry.example/judge:1", "IfNotPresent")
    # Whatever the candidate's image or pull policy, the Job's container does not change with it.
    other = _deployment(image="rt:other-candidate")
    assert _parity_container(stable, other) == c


def test_a_candidate_whose_own_parity_command_always_matches_cannot_pass_a_divergence(tmp_path: Any) -> None:
    """The Job's container is run here as the kubelet would run it: its image's code with its args. The
    stable image holds the real parity client; the candidate's image holds a parity command that prints
    a passing summary without comparing anything. The candidate's tokens diverge. The verdict fails
    because the Job runs the stable image: the candidate image's code never runs the comparison. (Run
    from the candidate's image, the same Job would pass: the second half shows the test can fail.)"""
    from hisparse_runtime import parity
    from hisparse_runtime.engine.parity import ParitySummary
    from hisparse_runtime.testing import CompletionsServer

    def counting(prompt: list[int], n: int) -> list[int]:
        history, out = list(prompt), []
        for _ in range(n):
            history.append((sum(history) * 31 + len(history)) % 1000)
            out.append(history[-1])
        return out

    def always_match(args: argparse.Namespace) -> int:
        args.summary.write_text(ParitySummary(ok=True, prompts=args.limit, compared=args.limit, end_to_end=True,
                                              diverged=0, errors=0, tokens=args.limit * args.max_tokens).model_dump_json())
        return 0

    images = {"rt:stable": parity.run, "rt:always-match": always_match}
    doc = yaml.safe_load((EXAMPLES / "deepseek-v32-single-node.yaml").read_text())
    doc["spec"].pop("prefill", None)
    doc["spec"]["rollout"] = {"parity": {"prompts": 3, "maxTokens": 6}}

    def make(image: str) -> Any:
        doc["spec"]["engine"] = {**(doc["spec"].get("engine") or {}), "image": image}
        d, errors = validate(copy.deepcopy(doc), None)
        assert not errors and d is not None, errors
        return d

    stable, candidate = make("rt:stable"), make("rt:always-match")
    container = _parity_container(stable, candidate)
    with CompletionsServer(counting) as good, CompletionsServer(lambda p, n: [(t + 1) % 1000 for t in counting(p, n)]) as bad:
        def run_as(image: str) -> dict[str, Any] | None:
            parser = argparse.ArgumentParser()
            parity.add_parser(parser.add_subparsers(dest="command"))
            args = parser.parse_args(container["args"])
            # The cluster's Service names resolve to the two revisions' servers; the termination log is a file.
            args.stable, args.candidate, args.summary = good.url, bad.url, tmp_path / f"{image}.log"
            code = images[image](args)
            pod = {"status": {"containerStatuses": [{"name": "parity", "state": {"terminated": {
                "exitCode": code, "message": args.summary.read_text()}}}]}}
            job = {"metadata": {"name": "j"}, "status": {"conditions": [
                {"type": "Complete" if code == 0 else "Failed", "status": "True"}]}}
            v = R.job_verdict(job, R.pod_summary([pod]), required=3, end_to_end=False)
            assert v is not None
            return {"result": v.result, "reason": v.reason}

        assert run_as(container["image"]) == {"result": "failed", "reason": "Diverged"}
        assert run_as(candidate.spec.engine.image) == {"result": "passed", "reason": "Passed"}


def test_near_tie_and_token_rules_have_their_own_verdicts() -> None:
    job = {"metadata": {"name": "j"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    ok = {"ok": True, "prompts": 10, "compared": 10, "diverged": 0, "errors": 0, "end_to_end": True, "near_ties": 1,
          "tokens": 400}
    assert R.job_verdict(job, ok, required=10, end_to_end=True, max_near_tie_fraction=0.1, min_tokens=400).result == "passed"
    tied = R.job_verdict(job, {**ok, "near_ties": 2}, required=10, end_to_end=True, max_near_tie_fraction=0.1)
    assert tied.reason == "TooManyNearTies" and "maxNearTieFraction" in tied.message
    short = R.job_verdict(job, ok, required=10, end_to_end=True, min_tokens=401)
    assert short.reason == "TooFewTokens" and "minTokens" in short.message
    # A summary from a runtime that does not count tokens compared none.
    old = {k: v for k, v in ok.items() if k != "tokens"}
    assert R.job_verdict(job, old, required=10, end_to_end=True, min_tokens=1).reason == "TooFewTokens"
    # The report's name, not a pod log that goes with the candidate.
    named = R.job_verdict(job, {**ok, "diverged": 1, "first_divergence": "prompt p at token 3"}, required=10,
                          end_to_end=True, report="x-parity-report")
    assert named.reason == "Diverged" and named.message.endswith("the full report is in ConfigMap x-parity-report")


def test_the_default_min_tokens_is_a_quarter_of_the_budget_and_an_impossible_one_is_refused() -> None:
    from hisparse_operator.render.parity import rules

    d = _deployment(**{"parity": {"prompts": 8, "maxTokens": 100}})
    assert rules(d).min_tokens == 200 and rules(d).max_near_tie_fraction == 0.1
    doc = yaml.safe_load((EXAMPLES / "hisparse-deployment.yaml").read_text())
    doc["spec"]["rollout"] = {"parity": {"prompts": 8, "maxTokens": 100, "minTokens": 801}}
    _, errors = validate(doc, None)
    assert [e.path for e in errors] == ["spec.rollout.parity.minTokens"], errors
    assert "lower minTokens" in str(errors[0])
    doc["spec"]["rollout"]["parity"]["minTokens"] = 800  # the fix is accepted
    assert not validate(doc, None)[1]


# --- whole rollouts through the reconciler ---------------------------------------------------------


class SimKube(FakeKube):
    """The in-memory apiserver plus what the apiserver and the workload controllers do that a rollout
    depends on, and that the plain fake hides: a spec change bumps ``generation`` and the workload's status
    lags (``observedGeneration``) until its controller syncs (:meth:`sync`), which is also when pods of
    the new template appear; a status write with an old resourceVersion is refused."""

    def __init__(self) -> None:
        super().__init__()
        self.unready: set[str] = set()
        """Workloads whose new pods never become ready."""

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        old = copy.deepcopy(self.objects.get(key))
        live = super().apply(obj)
        if obj["kind"] in ("Deployment", "LeaderWorkerSet"):
            gen = (old or {}).get("metadata", {}).get("generation", 0)
            if old is None or old.get("spec") != live.get("spec"):
                gen += 1
            stored = copy.deepcopy(self.objects[key])
            stored["metadata"]["generation"] = gen
            stored["status"] = (old or {}).get("status") or {}
            live = self._store(stored)
        return live

    def patch_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException
        from kubernetes.dynamic.exceptions import ConflictError

        live = self.objects[(L.KIND, body["metadata"]["namespace"], body["metadata"]["name"])]
        if body["metadata"].get("resourceVersion") not in (None, live["metadata"]["resourceVersion"]):
            self.calls.append("status-conflict")
            raise ConflictError(ApiException(status=409, reason="Conflict"))
        return super().patch_status(body, status)

    def sync(self) -> None:
        """Every workload controller's sync: pods of the current template, as many as asked, ready unless
        the workload is in ``unready``; status current. Pods of a deleted workload go (the garbage
        collector's part)."""
        owners = {n for (k, _, n) in self.objects if k in ("Deployment", "LeaderWorkerSet")}
        for key, p in list(self.objects.items()):
            if key[0] == "Pod" and p["metadata"].get("owner") and p["metadata"]["owner"] not in owners:
                del self.objects[key]
        for (kind, ns, name), w in list(self.objects.items()):
            if kind not in ("Deployment", "LeaderWorkerSet"):
                continue
            spec = w["spec"]
            template = spec.get("template") or spec["leaderWorkerTemplate"]["workerTemplate"]
            size = int(spec.get("leaderWorkerTemplate", {}).get("size") or 1)
            want = int(spec.get("replicas", 1))
            mine = {n: p for (k, pns, n), p in self.objects.items() if k == "Pod" and pns == ns and p["metadata"].get("owner") == name}
            current = [p for p in mine.values() if p["metadata"]["labels"] == template["metadata"]["labels"]]
            for n, p in mine.items():
                if p not in current:
                    del self.objects[("Pod", ns, n)]
            groups = sorted({p["metadata"]["labels"].get("leaderworkerset.sigs.k8s.io/group-index", n)
                             for n, p in mine.items() if p in current})
            ready = name not in self.unready
            for i in range(want):
                for j in range(size):
                    pod = f"{name}-{i}-{j}-{(w['metadata']['labels'] or {}).get(L.REVISION, '')}"
                    labels = {**template["metadata"]["labels"], "leaderworkerset.sigs.k8s.io/group-index": str(i)}
                    if size == 1:
                        labels.pop("leaderworkerset.sigs.k8s.io/group-index")
                        labels = dict(template["metadata"]["labels"])
                    if ("Pod", ns, pod) not in self.objects:
                        self._store({"apiVersion": "v1", "kind": "Pod", "metadata": {
                            "name": pod, "namespace": ns, "labels": labels, "owner": name},
                            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})
            for (k, pns, n), p in list(self.objects.items()):
                if k == "Pod" and pns == ns and p["metadata"].get("owner") == name:
                    idx = int(n[len(name) + 1:].split("-")[0])
                    if idx >= want:
                        del self.objects[(k, pns, n)]
            del groups
            count = want
            self._store({**w, "status": {"observedGeneration": w["metadata"]["generation"], "replicas": count,
                                         "readyReplicas": count if ready else 0, "updatedReplicas": count,
                                         "availableReplicas": count if ready else 0}})


def _violations(kube: FakeKube) -> list[str]:
    """The route watcher's rule (hisparse_devcluster.route_watch) on the in-memory cluster."""
    from hisparse_devcluster.route_watch import route_violations

    pods = [o for (k, _, _), o in kube.objects.items() if k == "Pod"]
    pools = {n: o for (k, _, n), o in kube.objects.items() if k == "InferencePool"}
    return [v for (k, _, _), o in kube.objects.items() if k == "HTTPRoute" for v in route_violations(o, pools, pods)]


class Sim:
    """The reconciler over a :class:`SimKube`, its clock moved forward by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, doc: dict[str, Any], kube: SimKube | None = None) -> None:
        self.kube = kube or SimKube()
        doc = copy.deepcopy(doc)
        doc["metadata"].update(namespace=NS, name=NAME, generation=1)
        self.kube._store(doc)
        self.op = Operator(self.kube)
        self.t = T0
        self.violations: list[str] = []
        self.weights: list[list[int]] = []

        class Clock(dt.datetime):
            @classmethod
            def now(cls, tz: Any = None) -> Any:
                return self.t

        monkeypatch.setattr(RC.dt, "datetime", Clock)
        monkeypatch.setattr(RC, "now", lambda: R.rfc3339(self.t))

    def watch(self) -> None:
        """The operator's watches: its resource and its child kinds (not pods)."""
        for (kind, _, _), o in self.kube.objects.items():
            if kind == L.KIND:
                self.op.deployments.put(copy.deepcopy(o))
            elif kind != "Pod":
                self.op.children.put(copy.deepcopy(o))

    def tick(self, seconds: float = 1.0, sync: bool = True) -> RC.Outcome:
        self.t += dt.timedelta(seconds=seconds)
        self.watch()
        out = self.op.reconcile()
        self.observe()
        if sync:
            self.kube.sync()
            self.observe()
        return out

    def observe(self) -> None:
        self.violations += _violations(self.kube)
        route = self.kube.objects.get(("HTTPRoute", NS, NAME))
        if route:
            w = [b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]]
            if not self.weights or self.weights[-1] != w:
                self.weights.append(w)

    def status(self) -> dict[str, Any]:
        return self.kube.objects[(L.KIND, NS, NAME)].get("status") or {}

    def phase(self) -> str | None:
        return (self.status().get("canary") or {}).get("phase")

    def fleet(self) -> str:
        """The base name of the candidate's fleet of the rollout under way (or the last one)."""
        return str((self.status().get("canary") or {})["fleet"])

    def fleet_of(self, image: str) -> str:
        """The fleet a rollout of ``image`` will start (named by its revision)."""
        return names.fleet(NAME, revision(_deployment_of(self, image)))

    def pods(self, fleet: str) -> dict[str, str]:
        """The pods of a fleet's workloads, by name, with their resourceVersion (a recreated pod has another)."""
        return {n: p["metadata"]["resourceVersion"] for (k, _, n), p in self.kube.objects.items()
                if k == "Pod" and p["metadata"]["labels"].get(L.DEPLOYMENT) == fleet}

    def edit(self, change: Any) -> None:
        body = copy.deepcopy(self.kube.objects[(L.KIND, NS, NAME)])
        change(body)
        body["metadata"]["generation"] += 1
        self.kube._store(body)

    def until(self, what: Any, *, seconds: float = 5.0, limit: int = 400) -> None:
        for _ in range(limit):
            if what():
                return
            self.tick(seconds)
        raise AssertionError(f"not reached; phase {self.phase()}, status {self.status().get('canary')}")

    def job(self) -> dict[str, Any] | None:
        return next((o for (k, _, _), o in self.kube.objects.items() if k == "Job"), None)

    def finish_job(self, ok: bool = True, summary: ParitySummary | None = None, log: str | None = None) -> None:
        """The Job ends; its pod leaves ``summary`` as its termination message and ``log`` as its log."""
        job = self.job()
        assert job is not None
        kind = "Complete" if ok else "Failed"
        self.kube._store({**job, "status": {"conditions": [{"type": kind, "status": "True"}]}})
        if summary is not None:
            self.kube._store({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"{job['metadata']['name']}-x7k2p", "namespace": NS,
                "labels": {RC.JOB_NAME_LABEL: job["metadata"]["name"]}},
                "status": {"containerStatuses": [{"name": "parity", "state": {"terminated": {
                    "exitCode": 0 if ok else 1, "message": summary.model_dump_json()}}}]}})
            if log is not None:
                self.kube.logs[(NS, f"{job['metadata']['name']}-x7k2p")] = log


def _doc(**rollout: Any) -> dict[str, Any]:
    """The single-node example with 3 prefill and 2 decode replicas, a gateway route and ``rollout``."""
    doc = yaml.safe_load((EXAMPLES / "deepseek-v32-single-node.yaml").read_text())
    doc["spec"]["prefill"]["replicas"], doc["spec"]["decode"]["replicas"] = 3, 2
    doc["spec"]["routing"] = {**(doc["spec"].get("routing") or {}), "gatewayRef": {"name": "inference-gateway"}}
    doc["spec"]["rollout"] = {"strategy": "Canary", "scaleDownDelaySeconds": 10,
                              "parity": {"prompts": 4, "timeoutSeconds": 300}, **rollout}
    return doc


def _new_image(image: str) -> Any:
    def change(body: dict[str, Any]) -> None:
        body["spec"].setdefault("engine", {})["image"] = image
    return change


GOOD = ParitySummary(ok=True, prompts=4, compared=4, end_to_end=True, diverged=0, errors=0, tokens=4 * 128)


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Sim:
    s = Sim(monkeypatch, _doc(steps=[{"weight": 50, "pauseSeconds": 20}]))
    s.until(lambda: s.status().get("stableRevision") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in s.status().get("conditions", [])))
    return s


def _workload(sim: Sim, name: str) -> dict[str, Any]:
    return sim.kube.objects[("Deployment", NS, name)]


def test_reconciled_canary_replaces_stable_progressively_and_never_routes_to_an_empty_pool(sim: Sim) -> None:
    promoted = _outcomes("promoted")
    stable_rev = sim.status()["stableRevision"]
    stable_pods = sim.pods(NAME)
    sim.edit(_new_image("rt:candidate"))
    sim.tick()
    assert sim.phase() == "Parity"
    fleet = sim.fleet()
    assert fleet == names.fleet(NAME, sim.status()["canary"]["revision"])  # named by its revision
    assert _workload(sim, f"{fleet}-decode")["spec"]["replicas"] == 1  # a canary, not a second fleet
    assert _workload(sim, f"{fleet}-prefill")["spec"]["replicas"] == 1
    assert _workload(sim, f"{NAME}-decode")["spec"]["replicas"] == 2
    sim.until(lambda: sim.job() is not None)
    assert sim.weights[-1] == [100, 0]  # no traffic before the verdict
    sim.finish_job(summary=GOOD)
    sim.tick()
    assert sim.phase() == "Shifting" and sim.status()["parity"]["passed"] and sim.status()["parity"]["prompts"] == 4
    surges, before_promotion = [], {}
    for _ in range(300):
        for role, n in (("prefill", 3), ("decode", 2)):
            total = _workload(sim, f"{NAME}-{role}")["spec"]["replicas"] + _workload(sim, f"{fleet}-{role}")["spec"]["replicas"] \
                if ("Deployment", NS, f"{fleet}-{role}") in sim.kube.objects and ("Deployment", NS, f"{NAME}-{role}") in sim.kube.objects else n
            surges.append(total - n)
        if sim.phase() == "Promoted":
            break
        before_promotion = sim.pods(fleet)
        sim.tick(5)
    st = sim.status()
    assert sim.phase() == "Promoted" and st["stableRevision"] == st["canary"]["revision"] != stable_rev
    assert max(surges) <= 1  # the canary's size
    assert not sim.violations, sim.violations
    assert len(sim.weights) > 3 and sim.weights[-1] == [100], sim.weights
    print("route weights:", sim.weights)
    # Promotion recreated no pod: the candidate's fleet, every replica of it, is the stable fleet as it was.
    assert st["stableFleet"] == fleet and sim.pods(fleet) == before_promotion
    assert len([n for n in before_promotion if "-epp-" not in n]) == 5  # 3 prefill, 2 decode
    assert _workload(sim, f"{fleet}-decode")["spec"]["template"]["spec"]["containers"][0]["image"] == "rt:candidate"
    assert L.TRACK not in _workload(sim, f"{fleet}-decode")["metadata"]["labels"]
    # The old fleet is gone; the resource's entry points select the new one's pods.
    assert not [n for (_, _, n) in sim.kube.objects if n.startswith(f"{NAME}-decode") or n.startswith(f"{NAME}-prefill")]
    assert not set(sim.pods(NAME)) & set(stable_pods) and not sim.pods(NAME)
    for kind, entry in (("Service", f"{NAME}-serving"), ("InferencePool", NAME)):
        selector = sim.kube.objects[(kind, NS, entry)]["spec"]["selector"]
        labels = selector.get("matchLabels", selector)
        assert labels[L.DEPLOYMENT] == fleet, (kind, labels)
    route = sim.kube.objects[("HTTPRoute", NS, NAME)]
    assert [b["name"] for b in route["spec"]["rules"][0]["backendRefs"]] == [fleet]
    assert _outcomes("promoted") == promoted + 1
    sim.tick()
    sim.kube.calls.clear()
    sim.watch()
    sim.op.reconcile()  # settled: nothing to write
    assert not [c for c in sim.kube.calls if not c.startswith("get")], sim.kube.calls


def test_a_second_rollout_starts_beside_the_promoted_fleet_and_promotes_past_it(sim: Sim) -> None:
    """Fleets are named by the revision that started them: a second rollout's candidate starts beside the
    first one's promoted fleet, and its promotion prunes that fleet in turn; the resource's entry points
    and route move with them and never name a fleet that is gone."""
    for image in ("rt:first", "rt:second"):
        sim.edit(_new_image(image))
        sim.until(lambda: sim.job() is not None)
        fleet = sim.fleet()
        sim.finish_job(summary=GOOD)
        sim.until(lambda: sim.phase() == "Promoted")
        assert sim.status()["stableFleet"] == fleet
    first = names.fleet(NAME, revision(_deployment_of(sim, "rt:first")))
    assert fleet != first and not [n for (_, _, n) in sim.kube.objects if n.startswith(first)]
    assert not sim.violations, sim.violations
    assert _workload(sim, f"{fleet}-decode")["spec"]["replicas"] == 2 and _workload(sim, f"{fleet}-prefill")["spec"]["replicas"] == 3


def _deployment_of(sim: Sim, image: str) -> HiSparseDeployment:
    body = copy.deepcopy(sim.kube.objects[(L.KIND, NS, NAME)])
    _new_image(image)(body)
    return HiSparseDeployment.model_validate({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec")})


def test_reconciled_canary_of_one_decode_replica_shares_the_route_at_a_step_of_50(monkeypatch: pytest.MonkeyPatch) -> None:
    """The e2e's shape (2 prefill, 1 decode, a step of 50): the stable decode replica stays beside the
    candidate's until the ramp, so the route shows 50/50 before it hands the candidate everything."""
    doc = _doc(steps=[{"weight": 50, "pauseSeconds": 20}], parity={"enabled": False})
    doc["spec"]["prefill"]["replicas"], doc["spec"]["decode"]["replicas"] = 2, 1
    sim = Sim(monkeypatch, doc)
    sim.until(lambda: sim.status().get("stableRevision") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in sim.status().get("conditions", [])))
    sim.edit(_new_image("rt:candidate"))
    stable_decode = []
    for _ in range(300):
        sim.tick(5)
        old = sim.kube.objects.get(("Deployment", NS, f"{NAME}-decode"))
        stable_decode.append(old["spec"]["replicas"] if old else 0)
        if sim.phase() == "Promoted":
            break
    assert sim.phase() == "Promoted" and not sim.violations, sim.violations
    print("route weights:", sim.weights)
    assert [50, 50] in sim.weights and sim.weights.index([50, 50]) < sim.weights.index([0, 100]), sim.weights
    assert sim.weights[-1] == [100] and 0 in stable_decode  # the ramp and the promotion did replace it


def test_a_parity_job_that_exits_0_without_a_summary_is_rolled_back_with_the_reason(sim: Sim) -> None:
    before = {k: copy.deepcopy(v["spec"]) for k, v in sim.kube.objects.items() if k[0] in ("Deployment", "InferencePool")}
    sim.edit(_new_image("rt:silent"))
    sim.until(lambda: sim.job() is not None)
    sim.finish_job(ok=True, summary=None)  # Complete, and nothing to read
    sim.tick()
    st = sim.status()
    assert sim.phase() == "RolledBack" and st["parity"]["passed"] is False and st["parity"]["reason"] == "NoSummary"
    assert "without a readable summary" in st["canary"]["message"]
    fleet = sim.fleet()
    sim.until(lambda: not [n for (k, _, n) in sim.kube.objects if k != "Pod" and n.startswith(fleet)])
    after = {k: v["spec"] for k, v in sim.kube.objects.items() if k[0] in ("Deployment", "InferencePool")}
    assert after == before and not sim.violations
    degraded = next(c for c in sim.status()["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == C.CANARY_ROLLED_BACK


def test_divergence_rolls_back_naming_the_prompt_and_retry_starts_a_new_job(sim: Sim) -> None:
    """The verdict names the prompt; the full report the Job's pod printed is kept in a ConfigMap that
    outlives the Job and the candidate's objects, until the retry's rollout starts."""
    import json

    rolled_back = _outcomes("rolled_back")
    sim.edit(_new_image("rt:diverges"))
    sim.until(lambda: sim.job() is not None)
    first = sim.job()["metadata"]["name"]
    printed = {"ok": False, "prompts": [{"id": "builtin-0003", "match": False, "first_divergence": 41,
                                         "stable_margin": 3.1, "candidate_margin": 2.2, "tokens": 41}]}
    sim.finish_job(ok=False, summary=ParitySummary(ok=False, prompts=4, compared=4, end_to_end=True, diverged=1,
                                                   errors=0, first_divergence="prompt builtin-0003 at token 41"),
                   log="loading prompts\n" + json.dumps(printed) + "\n")
    sim.tick()
    st = sim.status()
    assert st["parity"]["firstDivergence"] == "prompt builtin-0003 at token 41" and st["parity"]["reason"] == "Diverged"
    assert "builtin-0003 at token 41" in st["canary"]["message"]
    report_name = f"{NAME}-parity-report"
    assert st["parity"]["report"] == report_name and f"ConfigMap {report_name}" in st["canary"]["message"]
    assert "log" not in st["canary"]["message"]
    sim.until(lambda: sim.job() is None and sim.phase() == "RolledBack" and "replicas" not in sim.status()["canary"])
    assert _outcomes("rolled_back") == rolled_back + 1
    # The Job and the candidate are gone; the report stays, owned by the resource, with every prompt.
    report = sim.kube.objects[("ConfigMap", NS, report_name)]
    assert json.loads(report["data"]["report.json"]) == printed
    assert json.loads(report["data"]["verdict.json"])["reason"] == "Diverged"
    assert json.loads(report["data"]["summary.json"])["first_divergence"] == "prompt builtin-0003 at token 41"
    assert report["metadata"]["ownerReferences"][0]["name"] == NAME and "x7k2p" in report["data"]["source"]
    assert sim.kube.calls.count("log") == 1  # read once, not at every reconcile
    sim.edit(lambda b: b["metadata"].setdefault("annotations", {}).update({L.ROLLOUT_ACTION: "retry@1"}))
    sim.until(lambda: sim.job() is not None)
    assert sim.phase() == "Parity" and sim.status()["canary"]["attempt"] == 2 and sim.job()["metadata"]["name"] != first
    # The next rollout started: the earlier report is pruned, and status no longer names it.
    assert ("ConfigMap", NS, report_name) not in sim.kube.objects and "report" not in sim.status()["parity"]


def test_a_report_the_log_cannot_give_keeps_the_summary_and_says_why(sim: Sim) -> None:
    import json

    sim.edit(_new_image("rt:kwok"))
    sim.until(lambda: sim.job() is not None)
    sim.finish_job(ok=True, summary=GOOD.model_copy(update={"tokens": 3}))  # no log: a node without a kubelet
    sim.tick()
    st = sim.status()
    assert sim.phase() == "RolledBack" and st["parity"]["reason"] == "TooFewTokens" and st["parity"]["tokens"] == 3
    report = sim.kube.objects[("ConfigMap", NS, f"{NAME}-parity-report")]
    assert "report.json" not in report["data"] and "could not be read" in report["data"]["source"]
    assert json.loads(report["data"]["summary.json"])["tokens"] == 3


def test_a_candidate_that_never_becomes_ready_is_aborted_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = Sim(monkeypatch, _doc(readyTimeoutSeconds=600))
    sim.until(lambda: sim.status().get("stableRevision"))
    sim.kube.unready |= {f"{sim.fleet_of('rt:never')}-decode"}
    sim.edit(_new_image("rt:never"))
    sim.tick()
    sim.tick(599)
    assert sim.phase() == "Parity"
    sim.tick(2)
    assert sim.phase() == "RolledBack" and "not ready within" in sim.status()["canary"]["message"]
    assert not sim.violations


def test_a_missing_snapshot_holds_and_touches_nothing(sim: Sim) -> None:
    stable_rev = sim.status()["stableRevision"]
    del sim.kube.objects[("ControllerRevision", NS, names.snapshot(NAME, stable_rev))]
    sim.op.children.drop("ControllerRevision", NS, names.snapshot(NAME, stable_rev))
    sim.edit(_new_image("rt:candidate"))
    sim.kube.calls.clear()
    out = sim.tick(sync=False)
    assert out.result == "held" and not out.applied and not out.pruned
    assert not [c for c in sim.kube.calls if c.startswith(("apply", "delete"))]
    cond = next(c for c in sim.status()["conditions"] if c["type"] == "Progressing")
    assert cond["reason"] == C.ROLLOUT_HELD and "missing" in cond["message"] and cond["status"] == "False"
    assert _workload(sim, f"{NAME}-decode")["spec"]["template"]["spec"]["containers"][0]["image"] != "rt:candidate"


def test_an_unreadable_canary_status_holds(sim: Sim) -> None:
    body = copy.deepcopy(sim.kube.objects[(L.KIND, NS, NAME)])
    body["status"]["canary"] = {"revision": "x", "phase": "Sideways"}
    sim.kube._store(body)
    sim.edit(_new_image("rt:candidate"))
    out = sim.tick(sync=False)
    assert out.result == "held" and not out.applied
    assert "unreadable" in next(c for c in sim.status()["conditions"] if c["type"] == "Progressing")["message"]


def test_a_status_write_conflict_changes_nothing_and_is_decided_again(sim: Sim) -> None:
    sim.edit(_new_image("rt:candidate"))
    sim.watch()
    stale = copy.deepcopy(sim.kube.objects[(L.KIND, NS, NAME)])
    sim.kube._store(copy.deepcopy(stale))  # someone else wrote: the watched copy's resourceVersion is old
    sim.kube.calls.clear()
    sim.op.reconcile()
    calls = sim.kube.calls
    assert "status-conflict" in calls
    assert not [c for c in calls[: calls.index("status-conflict")] if c.startswith(("apply", "delete"))]
    assert sim.phase() == "Parity"  # decided again from a fresh read


def test_the_sidecar_image_goes_through_the_gate(sim: Sim) -> None:
    old = sim.status()["stableRevision"]

    def sidecar(body: dict[str, Any]) -> None:
        body["spec"]["routing"]["sidecarImage"] = "ghcr.io/llm-d/llm-d-routing-sidecar:v9"
    sim.edit(sidecar)
    sim.tick()
    assert sim.phase() == "Parity" and sim.status()["canaryRevision"] != old
    decode = _workload(sim, f"{NAME}-decode")["spec"]["template"]["spec"]
    assert decode["initContainers"][0]["image"] != "ghcr.io/llm-d/llm-d-routing-sidecar:v9"  # stable untouched


def test_a_revert_mid_canary_supersedes_it_with_an_outcome(sim: Sim) -> None:
    superseded = _outcomes("superseded")
    old_image = _workload(sim, f"{NAME}-decode")["spec"]["template"]["spec"]["containers"][0]["image"]
    sim.edit(_new_image("rt:candidate"))
    sim.tick()
    sim.edit(_new_image(old_image))
    sim.until(lambda: sim.phase() == "Superseded" and "replicas" not in sim.status()["canary"])
    assert _outcomes("superseded") == superseded + 1 and not sim.violations
    assert not [n for (k, _, n) in sim.kube.objects if k != "Pod" and n.startswith(sim.fleet())]


def test_scaling_is_no_rollout_and_reaches_the_stable_fleet_during_a_canary(sim: Sim) -> None:
    stable_rev = sim.status()["stableRevision"]

    def scale(n: int) -> Any:
        def change(body: dict[str, Any]) -> None:
            body["spec"]["prefill"]["replicas"] = n
        return change
    sim.edit(scale(4))
    sim.tick()
    assert _workload(sim, f"{NAME}-prefill")["spec"]["replicas"] == 4 and sim.status()["stableRevision"] == stable_rev
    assert "canary" not in sim.status()
    sim.edit(_new_image("rt:candidate"))
    sim.tick()
    sim.edit(scale(5))
    sim.tick()
    assert sim.phase() == "Parity"
    assert _workload(sim, f"{sim.fleet()}-prefill")["spec"]["replicas"] == 1


def _outcomes(outcome: str) -> float:
    return REGISTRY.get_sample_value("hisparse_operator_canary_outcomes_total",
                                     {"namespace": NS, "name": NAME, "outcome": outcome}) or 0.0


def test_alerted_counters_exist_at_zero_before_their_first_event(sim: Sim) -> None:
    """The alerts take increase() of these counters: a series that first appears at 1 has no earlier
    sample, so its first failure would never fire them (and an operator restart starts from nothing)."""
    def parity(verdict: str) -> float | None:
        return REGISTRY.get_sample_value("hisparse_operator_parity_results_total",
                                         {"namespace": NS, "name": NAME, "verdict": verdict})

    from hisparse_operator.controller import metrics

    metrics.forget(NS, NAME)  # as a freshly started operator has them (the registry is per process)
    metrics.CANARY_OUTCOMES.clear()
    sim.tick()
    assert parity("failed") == 0.0 and parity("passed") is not None
    assert all(REGISTRY.get_sample_value("hisparse_operator_canary_outcomes_total",
                                         {"namespace": NS, "name": NAME, "outcome": o}) is not None
               for o in R.OUTCOMES.values())
    assert REGISTRY.get_sample_value("hisparse_operator_reconciles_total", {"result": "error"}) is not None
    before = parity("failed")
    sim.edit(_new_image("rt:other-tokens"))
    sim.until(lambda: sim.job() is not None)
    sim.finish_job(ok=False, summary=ParitySummary(ok=False, prompts=4, compared=4, end_to_end=True, diverged=1,
                                                   errors=0, first_divergence="prompt builtin-0000 at token 0"))
    sim.until(lambda: sim.phase() == "RolledBack")
    assert parity("failed") == before + 1


def test_a_snapshot_lost_mid_canary_holds_instead_of_rendering_the_stable_fleet_from_the_candidate(sim: Sim) -> None:
    stable_rev = sim.status()["stableRevision"]
    sim.edit(_new_image("rt:candidate"))
    sim.until(lambda: sim.job() is not None)
    sim.finish_job(summary=GOOD)
    sim.until(lambda: sim.phase() == "Shifting")
    key = ("ControllerRevision", NS, names.snapshot(NAME, stable_rev))
    del sim.kube.objects[key]
    sim.op.children.drop(*key)
    before = {k: copy.deepcopy(v["spec"]) for k, v in sim.kube.objects.items() if k[0] in ("Deployment", "HTTPRoute")}
    out = sim.tick(sync=False)
    assert out.result == "held" and not out.applied and not out.pruned
    assert {k: v["spec"] for k, v in sim.kube.objects.items() if k[0] in ("Deployment", "HTTPRoute")} == before
    assert sim.phase() == "Shifting"


def test_the_route_watcher_reports_a_weight_on_an_empty_pool_that_outlasts_the_stream_skew() -> None:
    from hisparse_devcluster.route_watch import RouteWatcher, route_violations

    route = {"kind": "HTTPRoute", "metadata": {"name": "r"}, "spec": {"rules": [{"backendRefs": [
        {"kind": "InferencePool", "name": "a", "weight": 50}, {"kind": "InferencePool", "name": "b", "weight": 50}]}]}}
    pools = {n: {"kind": "InferencePool", "metadata": {"name": n}, "spec": {"selector": {"matchLabels": {"x": n}}}}
             for n in ("a", "b")}
    ready = {"kind": "Pod", "metadata": {"name": "p", "labels": {"x": "a"}}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert route_violations(route, pools, []) == []  # nothing ready anywhere: nothing better to do
    assert len(route_violations(route, pools, [ready])) == 1
    terminating = {**ready, "metadata": {**ready["metadata"], "deletionTimestamp": "2026-12-01T00:00:00Z"}}
    assert route_violations(route, pools, [terminating]) == []
    w = RouteWatcher(None, "ns")
    w.objects = {("HTTPRoute", "r"): route, **{("InferencePool", n): p for n, p in pools.items()}, ("Pod", "p"): ready}
    w._check(0.0, "HTTPRoute")
    w._check(0.5, "")
    assert not w.violations  # within the skew of the watch streams
    w._check(1.5, "")
    w._check(3.0, "")
    assert len(w.violations) == 1 and w.weights == [(0.0, {"a": 50, "b": 50})]
    w.objects[("Deployment", "a-decode")] = {"kind": "Deployment", "metadata": {"name": "a-decode"}, "spec": {"replicas": 2}}
    w._check(4.0, "Deployment")
    w.objects[("Deployment", "a-decode")]["spec"]["replicas"] = 1
    w._check(5.0, "Deployment")
    w._check(6.0, "")
    assert w.replicas == [(0.0, {}), (4.0, {"a-decode": 2}), (5.0, {"a-decode": 1})]


def test_a_promote_sent_while_a_step_still_replaces_replicas_is_kept_until_the_step_is_reached() -> None:
    """The promote flag lives in status.canary between reconciles (an apiserver prunes what the CRD lacks:
    the conftest checks every canary status the planner writes against the API model)."""
    d = _deployment(image="rt:new", strategy="Canary",
                    steps=[{"weight": 50, "pauseSeconds": 36000}, {"weight": 100, "pauseSeconds": 0}])
    s = _step(d, None, T0)
    s = _step(d, s.canary_status, T0, cand=1)
    s = _step(d, s.canary_status, T0, cand=1, parity=_passed())
    assert s.canary_status["phase"] == "Shifting" and s.canary_status["step"] == 0
    # Mid-step: the step's candidate replicas are not ready yet; the promote is recorded, not acted on.
    mid = _step(d, s.canary_status, _at(1), cand=1, action="promote@x")
    assert mid.canary_status["step"] == 0 and mid.canary_status["promote"] is True
    assert CanaryStatus.model_validate(mid.canary_status).promote
    # Once step 1's replicas are ready the promote skips its ten-hour hold (the ticks add up to minutes).
    s, t = mid, 1.0
    while s.canary_status["step"] == 0 and t < 36000:
        reps = s.replicas or {}
        t += 31
        s = _step(d, s.canary_status, _at(t), cand={r: k for r, (_, k) in reps.items()},
                  stable={r: v for r, (v, _) in reps.items()})
    assert t < 3600 and s.canary_status["step"] == 1 and "promote" not in s.canary_status, (t, s.canary_status)


def test_a_pause_step_s_hold_reason_is_an_api_field() -> None:
    d = _deployment(image="rt:new", strategy="Canary", steps=[{"pause": {}}, {"weight": 100, "pauseSeconds": 0}])
    s = _step(d, None, T0)
    s = _step(d, s.canary_status, T0, cand=1)
    s = _step(d, s.canary_status, T0, cand=1, parity=_passed())
    assert "waits for a promote" in CanaryStatus.model_validate(s.canary_status).hold_reason


def test_pause_holds_a_promotion_where_it_is_and_resume_or_promote_continues_it() -> None:
    d = _deployment("deepseek-v32-single-node.yaml", image="rt:new", strategy="Canary",
                    steps=[{"weight": 100, "pauseSeconds": 0}])
    s = _step(d, None, T0)
    s = _step(d, s.canary_status, T0, cand=1)
    s = _step(d, s.canary_status, T0, cand=1, parity=_passed())
    t = 0.0
    for _ in range(50):
        if s.canary_status["phase"] == "Promoting":
            break
        reps = s.replicas or {}
        t += 31
        s = _step(d, s.canary_status, _at(t), cand={r: k for r, (_, k) in reps.items()},
                  stable={r: v for r, (v, _) in reps.items()})
    assert s.canary_status["phase"] == "Promoting"
    paused = _step(d, s.canary_status, _at(t + 1), cand={r: k for r, (_, k) in s.replicas.items()},
                   stable={r: v for r, (v, _) in s.replicas.items()}, action="pause@p")
    assert paused.canary_status["paused"] and paused.progressing[0] == C.CANARY_PAUSED
    held = paused
    for i in range(5):  # everything ready, time passing: nothing moves while paused
        held = _step(d, held.canary_status, _at(t + 100 * (i + 2)), cand={r: k for r, (_, k) in held.replicas.items()},
                     stable={r: v for r, (v, _) in held.replicas.items()})
        assert held.replicas == paused.replicas and held.canary_status["phase"] == "Promoting" and not held.promoted
    for control in ("resume@r", "promote@r"):
        on = _step(d, held.canary_status, _at(t + 1000), cand={r: k for r, (_, k) in held.replicas.items()},
                   stable={r: v for r, (v, _) in held.replicas.items()}, action=control)
        assert not on.canary_status.get("paused") and on.progressing[0] != C.CANARY_PAUSED, (control, on.progressing)


# --- fast failure: a candidate pod that definitely fails -----------------------------------------
# Pod status as the kubelet and the scheduler write it (kubectl get pod -o json), trimmed to the fields read.

IMAGE = "registry.example.com/hisparse-runtime:v0.9.1-typo"


def _pod(name: str, phase: str, *, conditions: list[dict[str, Any]] | None = None, containers: list[dict[str, Any]] | None = None,
         init: list[dict[str, Any]] | None = None, created: str = "2026-12-01T12:00:00Z") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": conditions if conditions is not None else [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": created},
        {"type": "Initialized", "status": "True", "lastTransitionTime": created},
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": created,
         "message": "containers with unready status: [vllm]"},
        {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": created,
         "message": "containers with unready status: [vllm]"},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": created}]}
    if containers is not None:
        status["containerStatuses"] = containers
    if init is not None:
        status["initContainerStatuses"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "inference", "creationTimestamp": created},
            "status": status}


def _vllm(state: dict[str, Any], *, restarts: int = 0, last: dict[str, Any] | None = None, ready: bool = False) -> dict[str, Any]:
    return {"name": "vllm", "image": IMAGE, "imageID": "", "ready": ready, "restartCount": restarts, "started": "running" in state,
            "state": state, "lastState": last or {}}


PULL_MESSAGE = (f'Back-off pulling image "{IMAGE}": ErrImagePull: failed to pull and unpack image "{IMAGE}": failed to '
                f'resolve reference "{IMAGE}": {IMAGE}: not found')
IMAGE_PULL_BACKOFF = _pod("glm52-canary-decode-0", "Pending", containers=[
    _vllm({"waiting": {"reason": "ImagePullBackOff", "message": PULL_MESSAGE}})])
ERR_IMAGE_PULL = _pod("glm52-canary-decode-0", "Pending", containers=[_vllm({"waiting": {
    "reason": "ErrImagePull", "message": f'failed to pull and unpack image "{IMAGE}": {IMAGE}: not found'}})])
EXITED = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-12-01T12:03:10Z",
                         "finishedAt": "2026-12-01T12:03:41Z", "containerID": "containerd://4f1c"}}
CRASH_LOOP = _pod("glm52-canary-decode-0", "Running", containers=[_vllm(
    {"waiting": {"reason": "CrashLoopBackOff",
                 "message": "back-off 40s restarting failed container=vllm pod=glm52-canary-decode-0_inference(8d1c)"}},
    restarts=3, last=EXITED)])
BETWEEN_CRASHES = _pod("glm52-canary-decode-0", "Running", containers=[_vllm(
    {"running": {"startedAt": "2026-12-01T12:04:21Z"}}, restarts=3, last=EXITED)])
LOADING = _pod("glm52-canary-decode-0", "Running", containers=[_vllm({"running": {"startedAt": "2026-12-01T12:00:05Z"}})])
CREATING = _pod("glm52-canary-decode-0", "Pending", containers=[_vllm({"waiting": {"reason": "ContainerCreating"}})])
UNSCHEDULABLE = _pod("glm52-canary-decode-0", "Pending", conditions=[
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
     "lastTransitionTime": "2026-12-01T12:00:00Z",
     "message": "0/12 nodes are available: 4 Insufficient nvidia.com/gpu, 8 node(s) didn't match Pod's node "
                "affinity/selector. preemption: 0/12 nodes are available: 12 Preemption is not helpful for scheduling."}])


def test_definite_failures_are_read_from_the_kubelet_s_and_the_scheduler_s_own_status() -> None:
    f = F.pod_failure(IMAGE_PULL_BACKOFF)
    assert (f.pod, f.container, f.reason) == ("glm52-canary-decode-0", "vllm", "ImagePullBackOff") and IMAGE in f.message
    assert F.pod_failure(ERR_IMAGE_PULL).reason == "ErrImagePull"
    assert F.pod_failure(CRASH_LOOP).reason == "CrashLoopBackOff"
    between = F.pod_failure(BETWEEN_CRASHES)  # running again, not ready, after its third non-zero exit
    assert between.reason == "RepeatedExits" and between.message.startswith("exit code 1 (Error), 3 times")
    assert F.pod_failure(UNSCHEDULABLE) == F.PodFailure("glm52-canary-decode-0", None, "Unschedulable",
                                                        UNSCHEDULABLE["status"]["conditions"][0]["message"])
    init = _pod("glm52-canary-prefill-0", "Pending", init=[{
        "name": "fetch-model", "ready": False, "restartCount": 2, "lastState": EXITED, "state": {"waiting": {
            "reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container=fetch-model"}}}],
        containers=[_vllm({"waiting": {"reason": "PodInitializing"}})])
    assert (F.pod_failure(init).container, F.pod_failure(init).reason) == ("fetch-model", "CrashLoopBackOff")
    config = _pod("p", "Pending", containers=[_vllm({"waiting": {"reason": "CreateContainerConfigError",
                                                                 "message": 'secret "hf-token" not found'}})])
    assert F.pod_failure(config).message == 'secret "hf-token" not found'
    # Never a failure: a model still loading, a container being created, a pod that recovered after
    # crashes (ready now), fewer exits than the rule's, a pod being deleted, a gated pod.
    recovered = _pod("p", "Running", containers=[_vllm({"running": {}}, restarts=5, last=EXITED, ready=True)])
    twice = _pod("p", "Running", containers=[_vllm({"running": {}}, restarts=1, last=EXITED)])
    clean = _pod("p", "Running", containers=[_vllm({"running": {}}, restarts=4, last={"terminated": {"exitCode": 0}})])
    deleting = {**CRASH_LOOP, "metadata": {**CRASH_LOOP["metadata"], "deletionTimestamp": "2026-12-01T12:09:00Z"}}
    gated = _pod("p", "Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}])
    for fine in (LOADING, CREATING, recovered, twice, clean, deleting, gated):
        assert F.pod_failure(fine) is None, fine
    # The oldest failing pod is named, so the evidence stays the same pod while it fails.
    newer = {**CRASH_LOOP, "metadata": {**CRASH_LOOP["metadata"], "name": "b", "creationTimestamp": "2026-12-01T12:30:00Z"}}
    assert F.first_failure([newer, LOADING, IMAGE_PULL_BACKOFF]).reason == "ImagePullBackOff"


def test_preflight_failures_are_counted_by_role_and_check_from_the_exit_code() -> None:
    """A failed preflight never starts vLLM or the plugin: the kubelet's record of the exit code is the only
    evidence, and the code names the check (the runtime's own table)."""
    def pod(role: str, code: int, **kw: Any) -> dict[str, Any]:
        p = _pod(f"{role}-{code}", "Running", containers=[_vllm(
            {"waiting": {"reason": "CrashLoopBackOff"}}, restarts=2,
            last={"terminated": {**EXITED["terminated"], "exitCode": code}}, **kw)])
        p["metadata"]["labels"] = {L.ROLE: role}
        return p

    pods = [pod("decode", 35), pod("decode", 35), pod("prefill", 42), pod("decode", 1), pod("decode", 35, ready=True),
            {**pod("decode", 36), "metadata": {**pod("decode", 36)["metadata"], "deletionTimestamp": "2026-12-01T12:09:00Z"}}]
    assert F.preflight_failures(pods) == {("decode", "host_memory"): 2, ("prefill", "decode_kernels"): 1}
    assert F.preflight_failures([LOADING, CRASH_LOOP]) == {}  # exit code 1 is not preflight's


def test_the_operator_exports_replicas_and_preflight_failures_per_deployment(sim: Sim) -> None:
    """The series HiSparseDecodeNotReady, HiSparseReplicasNotReady and HiSparsePreflightFailed read: the
    status' replica counts, and serving pods whose vLLM container last exited with a preflight code (read
    from the pods at every reconcile, the stable and the candidate fleet alike); they go back to 0."""
    def sample(family: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(family, {"namespace": NS, "name": NAME, **labels})

    assert sample("hisparse_operator_replicas", role="decode", state="ready") == \
        sample("hisparse_operator_replicas", role="decode", state="desired") > 0
    assert sample("hisparse_operator_preflight_failures", role="decode", check="host_memory") == 0  # before any
    decode = next(o for (k, _, _), o in sim.kube.objects.items()
                  if k == "Pod" and (o["metadata"].get("labels") or {}).get(L.ROLE) == "decode")
    key = ("Pod", NS, decode["metadata"]["name"])
    sim.kube.objects[key]["status"] = {"containerStatuses": [_vllm(
        {"waiting": {"reason": "CrashLoopBackOff"}}, restarts=3, last={"terminated": {**EXITED["terminated"], "exitCode": 35}})]}
    sim.tick(sync=False)
    assert sample("hisparse_operator_preflight_failures", role="decode", check="host_memory") == 1
    sim.kube.objects[key]["status"] = {"containerStatuses": [_vllm({"running": {}}, restarts=3, ready=True,
                                                                   last={"terminated": {**EXITED["terminated"], "exitCode": 35}})]}
    sim.tick(sync=False)
    assert sample("hisparse_operator_preflight_failures", role="decode", check="host_memory") == 0
    assert REGISTRY.get_sample_value("hisparse_operator_info", {"version": _operator_version()}) == 1


def _operator_version() -> str:
    from hisparse_operator.controller import metrics

    return metrics._version()


def _parity_started(d: Any) -> R.Decision:
    return _step(d, None, T0)


def test_an_unpullable_candidate_is_rolled_back_at_the_progress_deadline_not_before_naming_the_image() -> None:
    d = _deployment(image=IMAGE, **CANARY)  # progressDeadlineSeconds unset: 600
    assert d.spec.rollout.progress_deadline == 600
    s = _parity_started(d)
    first = _step(d, s.canary_status, _at(10), pods={"decode": [ERR_IMAGE_PULL]})
    st = first.canary_status
    assert st["phase"] == "Parity" and st["failingSince"] == R.rfc3339(_at(10))
    assert st["failure"] == {"role": "decode", "pod": "glm52-canary-decode-0", "container": "vllm", "reason": "ErrImagePull",
                             "message": ERR_IMAGE_PULL["status"]["containerStatuses"][0]["state"]["waiting"]["message"]}
    assert first.requeue_after <= 30 and "ErrImagePull" in first.progressing[1] and "rolled back in 600s" in first.progressing[1]
    s = first
    for t in range(40, 610, 30):  # the kubelet alternates ErrImagePull and ImagePullBackOff: one failure
        s = _step(d, s.canary_status, _at(t), pods={"decode": [IMAGE_PULL_BACKOFF if t % 60 else ERR_IMAGE_PULL]})
        assert s.canary_status["phase"] == "Parity", t
        assert s.requeue_after <= 600 + 10 - t
    assert s.canary_status["failure"]["reason"] == "ErrImagePull"  # the first evidence is kept
    back = _step(d, s.canary_status, _at(610), pods={"decode": [IMAGE_PULL_BACKOFF]})
    st = back.canary_status
    assert st["phase"] == "RolledBack" and back.weight == 0 and not back.stable_is_candidate
    for text in (st["message"], *(e[2] for e in back.events if e[0] == "Warning")):
        assert "glm52-canary-decode-0 (decode), container vllm: ErrImagePull" in text and IMAGE in text, text
        assert "600s" in text and "progressDeadlineSeconds" in text
    assert any(e[:2] == ("Warning", C.CANARY_ROLLED_BACK) for e in back.events)
    assert st["failure"]["pod"] == "glm52-canary-decode-0" and "failingSince" not in st
    assert CanaryStatus.model_validate(st).failure.reason == "ErrImagePull"
    # ... well before readyTimeoutSeconds.
    assert d.spec.rollout.ready_timeout_seconds == 4500


def test_a_loading_candidate_never_trips_the_progress_deadline_only_the_ready_timeout() -> None:
    d = _deployment(image="rt:new", **CANARY)
    s = _parity_started(d)
    for t in range(30, 4500, 30):
        s = _step(d, s.canary_status, _at(t), pods={"decode": [LOADING], "prefill": [CREATING if t < 120 else LOADING]})
        assert s.canary_status["phase"] == "Parity" and "failingSince" not in s.canary_status, t
        assert s.requeue_after <= 30  # still looked at while it loads
    late = _step(d, s.canary_status, _at(4500), pods={"decode": [LOADING]})
    assert late.canary_status["phase"] == "RolledBack" and "not ready within readyTimeoutSeconds" in late.canary_status["message"]


def test_a_failure_that_breaks_off_starts_the_clock_afresh() -> None:
    d = _deployment(image="rt:new", progressDeadlineSeconds=300, **CANARY)
    s = _parity_started(d)
    s = _step(d, s.canary_status, _at(0), pods={"decode": [CRASH_LOOP]})
    s = _step(d, s.canary_status, _at(290), pods={"decode": [CRASH_LOOP]})
    s = _step(d, s.canary_status, _at(295), pods={"decode": [LOADING]})  # a replacement pod loads
    assert "failingSince" not in s.canary_status and "failure" not in s.canary_status
    s = _step(d, s.canary_status, _at(300), pods={"decode": [CRASH_LOOP]})
    assert s.canary_status["phase"] == "Parity" and s.canary_status["failingSince"] == R.rfc3339(_at(300))
    assert _step(d, s.canary_status, _at(599), pods={"decode": [BETWEEN_CRASHES]}).canary_status["phase"] == "Parity"
    assert _step(d, s.canary_status, _at(600), pods={"decode": [BETWEEN_CRASHES]}).canary_status["phase"] == "RolledBack"


def test_a_candidate_ready_for_parity_that_then_crash_loops_is_rolled_back_at_the_deadline() -> None:
    d = _deployment(image="rt:new", progressDeadlineSeconds=120, **CANARY)
    s = _step(d, _parity_started(d).canary_status, _at(60), cand=1)
    assert s.run_parity
    s = _step(d, s.canary_status, _at(100), cand={"prefill": 1, "decode": 0}, pods={"decode": [CRASH_LOOP]})
    assert s.canary_status["phase"] == "Parity" and s.run_parity
    assert _step(d, s.canary_status, _at(219), pods={"decode": [CRASH_LOOP]}, cand={"prefill": 1}).canary_status["phase"] == "Parity"
    back = _step(d, s.canary_status, _at(220), pods={"decode": [CRASH_LOOP]}, cand={"prefill": 1})
    assert back.canary_status["phase"] == "RolledBack" and "CrashLoopBackOff" in back.canary_status["message"]


def test_an_unschedulable_candidate_replica_mid_shifting_is_rolled_back_at_the_deadline() -> None:
    d = _deployment(image="rt:new", strategy="Canary", progressDeadlineSeconds=300, parity={"enabled": False},
                    steps=[{"weight": 50, "pauseSeconds": 3600}])
    s = _step(d, None, T0, cand=1)
    assert s.canary_status["phase"] == "Shifting"
    for t in range(1, 100, 11):  # the step of 50 replaces stable prefill replicas (a surge of one)
        s = _step(d, s.canary_status, _at(t), cand=1, stable={r: v for r, (v, _) in s.replicas.items()})
    assert s.replicas["prefill"][1] > 1 and s.canary_status["phase"] == "Shifting"  # one more than is ready
    kw = dict(cand=1, stable={r: v for r, (v, _) in s.replicas.items()}, pods={"prefill": [UNSCHEDULABLE]})
    s = _step(d, s.canary_status, _at(110), **kw)
    assert s.canary_status["failure"]["reason"] == "Unschedulable" and "Unschedulable" in s.progressing[1]
    held = _step(d, s.canary_status, _at(409), **kw)
    assert held.canary_status["phase"] == "Shifting"
    back = _step(d, held.canary_status, _at(410), **kw)
    # The candidate's ready replica keeps its share until stable capacity is back (the traffic model):
    # its weight never rises on the way down.
    assert back.canary_status["phase"] == "RolledBack" and back.weight <= held.weight
    assert "0/12 nodes are available" in back.canary_status["message"]
    assert all(sr >= held.replicas[r][0] for r, (sr, _) in back.replicas.items())  # no stable replica taken


def test_a_failure_while_promoting_is_reported_as_stalled_with_its_evidence_and_rolls_nothing_back() -> None:
    d = _deployment("deepseek-v32-single-node.yaml", image="rt:new", strategy="Canary", progressDeadlineSeconds=120,
                    steps=[{"weight": 100, "pauseSeconds": 0}])
    s = _step(d, None, T0)
    s = _step(d, s.canary_status, T0, cand=1)
    s = _step(d, s.canary_status, T0, cand=1, parity=_passed())
    t = 0.0
    for _ in range(50):
        if s.canary_status["phase"] == "Promoting":
            break
        t += 31
        s = _step(d, s.canary_status, _at(t), cand={r: k for r, (_, k) in s.replicas.items()},
                  stable={r: v for r, (v, _) in s.replicas.items()})
    assert s.canary_status["phase"] == "Promoting"
    reps = s.replicas
    # The stable fleet, now of the candidate's revision, gets a replica that cannot pull its image.
    kw = dict(cand={r: k for r, (_, k) in reps.items()}, stable={r: 0 for r in reps}, stable_pods={"decode": [IMAGE_PULL_BACKOFF]})
    s = _step(d, s.canary_status, _at(t + 1), **kw)
    assert s.canary_status["failure"]["reason"] == "ImagePullBackOff" and s.degraded is None
    assert "reported as stalled in 120s" in s.progressing[1]
    stalled = _step(d, s.canary_status, _at(t + 121), **kw)
    assert stalled.canary_status["phase"] == "Promoting" and not stalled.promoted and stalled.canary
    assert stalled.degraded[0] == stalled.progressing[0] == C.CANARY_STALLED
    assert "glm52-canary-decode-0 (decode), container vllm: ImagePullBackOff" in stalled.degraded[1] and IMAGE in stalled.degraded[1]
    assert stalled.weight == s.weight  # traffic stays where ready capacity is


def test_progress_deadline_is_at_most_the_ready_timeout_and_the_suggested_fixes_are_accepted() -> None:
    doc = yaml.safe_load((EXAMPLES / "hisparse-deployment.yaml").read_text())
    doc["spec"]["rollout"] = {"strategy": "Canary", "readyTimeoutSeconds": 900, "progressDeadlineSeconds": 1200}
    d, errors = validate(doc, None)
    assert d is None and [e.path for e in errors] == ["spec.rollout.progressDeadlineSeconds"]
    assert "progressDeadlineSeconds is longer than readyTimeoutSeconds" in errors[0].message
    assert "set spec.rollout.progressDeadlineSeconds to at most readyTimeoutSeconds" in errors[0].message
    doc["spec"]["rollout"]["progressDeadlineSeconds"] = 900  # the fix it names
    d, errors = validate(doc, None)
    assert not errors and d.spec.rollout.progress_deadline == 900
    del doc["spec"]["rollout"]["progressDeadlineSeconds"]  # or unset: 600, within the ready timeout
    d, errors = validate(doc, None)
    assert not errors and d.spec.rollout.progress_deadline == 600
    doc["spec"]["rollout"]["readyTimeoutSeconds"] = 120  # unset with a shorter ready timeout: never refused
    d, errors = validate(doc, None)
    assert not errors and d.spec.rollout.progress_deadline == 120


def _candidate_pods(sim: Sim, role: str) -> list[tuple[str, str, str]]:
    return [k for k, o in sim.kube.objects.items() if k[0] == "Pod" and o["metadata"].get("owner") == f"{sim.fleet()}-{role}"]


def _set_pod_status(sim: Sim, key: tuple[str, str, str], shape: dict[str, Any]) -> None:
    """What the kubelet writes for ``shape`` (one of the pod shapes above), on the simulated pod."""
    pod = copy.deepcopy(sim.kube.objects[key])
    pod["status"] = copy.deepcopy(shape["status"])
    sim.kube._store(pod)


def test_reconciled_unpullable_candidate_is_rolled_back_within_the_progress_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = Sim(monkeypatch, _doc(progressDeadlineSeconds=120))
    sim.until(lambda: sim.status().get("stableRevision"))
    stable = copy.deepcopy(_workload(sim, f"{NAME}-decode")["spec"])
    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(sim.kube, "event", lambda body, type_, reason, message: events.append((type_, reason, message)))
    sim.edit(_new_image(IMAGE))
    sim.kube.unready |= {f"{sim.fleet_of(IMAGE)}-decode"}
    sim.tick()
    (pod,) = _candidate_pods(sim, "decode")
    _set_pod_status(sim, pod, IMAGE_PULL_BACKOFF)
    out = sim.tick(1)
    st = sim.status()["canary"]
    assert st["phase"] == "Parity" and st["failure"]["reason"] == "ImagePullBackOff" and st["failure"]["pod"] == pod[2]
    assert out.requeue_after is not None and out.requeue_after <= 120
    for _ in range(11):
        out = sim.tick(10)
        assert sim.phase() == "Parity" and out.requeue_after <= 30
    sim.tick(10)  # 121 s after the failure was first seen
    st = sim.status()["canary"]
    assert st["phase"] == "RolledBack" and IMAGE in st["message"] and f"pod {pod[2]} (decode), container vllm" in st["message"]
    assert any(t == "Warning" and r == C.CANARY_ROLLED_BACK and IMAGE in m for t, r, m in events), events
    sim.until(lambda: not [n for (k, _, n) in sim.kube.objects if k != "Pod" and n.startswith(sim.fleet())])
    assert _workload(sim, f"{NAME}-decode")["spec"] == stable and not sim.violations


def test_a_candidate_going_unready_mid_comparison_keeps_the_parity_job_and_its_clock(sim: Sim) -> None:
    sim.edit(_new_image("rt:flaps"))
    sim.until(lambda: sim.job() is not None)
    job = sim.job()["metadata"]["name"]
    ready_at = sim.status()["canary"]["readyAt"]
    for key in _candidate_pods(sim, "decode"):  # ready, then not: its readiness probe fails
        _set_pod_status(sim, key, LOADING)
    sim.kube.unready |= {f"{sim.fleet()}-decode"}
    for _ in range(5):
        sim.tick(10)
        st = sim.status()["canary"]
        assert sim.phase() == "Parity" and st["readyAt"] == ready_at and "waitingSince" not in st
        assert sim.job() is not None and sim.job()["metadata"]["name"] == job  # the comparison is not withdrawn
    # Flapping back and forth changes neither; the parity deadline still counts from the first readiness.
    sim.kube.unready.clear()
    sim.tick(10)
    assert sim.status()["canary"]["readyAt"] == ready_at and sim.job()["metadata"]["name"] == job
    timeout = 300  # _doc's parity.timeoutSeconds
    elapsed = (sim.t - R._time(ready_at, sim.t)).total_seconds()
    sim.tick(timeout - elapsed + 1)
    assert sim.phase() == "RolledBack" and sim.status()["parity"]["reason"] == "TimedOut"


class OldCrdKube(SimKube):
    """An apiserver whose CRD predates the fleet fields: it prunes them from every status write."""

    def patch_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        status = copy.deepcopy(status)
        status.pop("stableFleet", None)
        (status.get("canary") or {}).pop("fleet", None)
        return super().patch_status(body, status)


def test_an_older_crd_that_prunes_the_fleet_runs_the_rollout_as_an_earlier_operator_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a CRD that drops ``status.canary.fleet`` nothing is ever applied under a fleet name the status
    cannot keep: the operator says why (an Event) and the rollout runs as before fleets had names (the
    candidate in ``<name>-canary``, ``Promoting`` recreating the stable fleet), to the same end."""
    sim = Sim(monkeypatch, _doc(steps=[{"weight": 50, "pauseSeconds": 20}]), OldCrdKube())
    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(sim.kube, "event", lambda body, type_, reason, message: events.append((type_, reason, message)))
    sim.until(lambda: sim.status().get("stableRevision"))
    new_fleet = sim.fleet_of("rt:candidate")
    sim.edit(_new_image("rt:candidate"))
    names_seen: set[str] = set()
    phases: list[str | None] = []
    for _ in range(300):
        sim.tick(5)
        names_seen |= {n for (_, _, n) in sim.kube.objects}
        if sim.job() is not None and sim.phase() == "Parity" and "fleet" not in sim.status()["canary"]:
            sim.finish_job(summary=GOOD)
        phases.append(sim.phase())
        if sim.phase() == "Promoted":
            break
    assert sim.phase() == "Promoted" and "Promoting" in phases, phases
    assert not [n for n in names_seen if n.startswith(f"{new_fleet}-")], "an object under a fleet name the status cannot keep"
    assert f"{NAME}-canary-decode" in names_seen and "stableFleet" not in sim.status()
    assert _workload(sim, f"{NAME}-decode")["spec"]["template"]["spec"]["containers"][0]["image"] == "rt:candidate"
    assert any(r == C.ROLLOUT_HELD and "does not keep status.canary.fleet" in m for _, r, m in events), events
    assert not sim.violations, sim.violations


def test_a_promoted_fleet_s_render_is_cached_like_the_first_one_s(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a promotion the stable fleet has another name; a reconcile that changes nothing still renders
    nothing (the render cache keys on the fleet), and a spec change renders in the promoted fleet."""
    sim.edit(_new_image("rt:candidate"))
    sim.until(lambda: sim.job() is not None)
    sim.finish_job(summary=GOOD)
    sim.until(lambda: sim.phase() == "Promoted")
    fleet = sim.status()["stableFleet"]
    sim.tick()
    renders: list[str | None] = []
    real = RC.render_validated
    monkeypatch.setattr(RC, "render_validated", lambda d, *a, **k: renders.append(k.get("fleet")) or real(d, *a, **k))
    for _ in range(3):
        sim.tick()
    assert renders == [], renders
    sim.edit(lambda b: b["spec"]["decode"].update(replicas=3))  # not a revision: applied in the stable fleet
    sim.tick()
    assert renders == [fleet], renders
    assert _workload(sim, f"{fleet}-decode")["spec"]["replicas"] == 3


# --- operator upgrades that render pods otherwise -------------------------------------------------------


def _upgrade_operator(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new operator build whose pods differ (one more pod annotation): a fresh process, empty caches."""
    from hisparse_operator.render import shaping, workloads

    real = workloads.pod_template

    def template(*a: Any, **kw: Any) -> dict[str, Any]:
        out = real(*a, **kw)
        out["metadata"].setdefault("annotations", {})["example.com/rendered-by"] = "next-operator"
        return out
    monkeypatch.setattr(workloads, "pod_template", template)
    shaping._cache.clear()
    sim.op = Operator(sim.kube)


def _shaping_objects(sim: Sim, fleet: str) -> dict[tuple[str, str], Any]:
    return {(k, n): copy.deepcopy(o.get("spec") if k != "ConfigMap" else o.get("data"))
            for (k, _, n), o in sim.kube.objects.items()
            if (k, n) in {("Deployment", names.role(fleet, "prefill")), ("Deployment", names.role(fleet, "decode")),
                          ("ConfigMap", names.engine_config(fleet))}}


def _templates_rendered_by_next(sim: Sim, fleet: str) -> list[bool]:
    return [(o["spec"]["template"]["metadata"].get("annotations") or {}).get("example.com/rendered-by") == "next-operator"
            for (k, _, n), o in sim.kube.objects.items()
            if k == "Deployment" and n in (names.role(fleet, "prefill"), names.role(fleet, "decode"))]


@pytest.mark.parametrize("verdict", ["passed", "diverged"])
def test_an_operator_that_renders_pods_otherwise_keeps_the_stable_fleet_and_rolls_its_rendering_through_the_gate(
        sim: Sim, monkeypatch: pytest.MonkeyPatch, verdict: str) -> None:
    old_rev = sim.status()["stableRevision"]
    kept = _shaping_objects(sim, NAME)
    pods = sim.pods(NAME)
    assert len(kept) == 3 and pods
    _upgrade_operator(sim, monkeypatch)
    sim.tick()
    new_rev = sim.status()["canaryRevision"]
    assert sim.phase() == "Parity" and new_rev != old_rev and sim.status()["stableRevision"] == old_rev
    # The stable fleet is exactly as the earlier operator rendered it (replicas included), its pods untouched;
    # the candidate's fleet is this operator's rendering.
    assert _shaping_objects(sim, NAME) == kept and sim.pods(NAME) == pods
    assert _templates_rendered_by_next(sim, sim.fleet()) == [True, True]
    sim.until(lambda: sim.job() is not None)
    if verdict == "diverged":
        sim.finish_job(ok=False, summary=ParitySummary(ok=False, prompts=4, compared=4, end_to_end=True, diverged=1,
                                                       errors=0, first_divergence="prompt builtin-0000 at token 0"))
        sim.until(lambda: sim.phase() == "RolledBack" and "replicas" not in sim.status()["canary"])
        for _ in range(3):
            sim.tick(30)
        assert sim.status()["stableRevision"] == old_rev
        assert _shaping_objects(sim, NAME) == kept and sim.pods(NAME) == pods
    else:
        sim.finish_job(summary=GOOD)
        sim.until(lambda: sim.phase() == "Promoted")
        fleet = sim.status()["stableFleet"]
        assert sim.status()["stableRevision"] == new_rev and fleet == names.fleet(NAME, new_rev)
        assert _templates_rendered_by_next(sim, fleet) == [True, True]
        assert not _shaping_objects(sim, NAME), "the earlier rendering's fleet is pruned"
    assert not sim.violations


def test_an_upgrade_over_a_snapshot_that_kept_no_rendering_holds_and_changes_nothing(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot an earlier operator wrote (its spec only): the stable fleet cannot be kept as it runs."""
    old_rev = sim.status()["stableRevision"]
    key = ("ControllerRevision", NS, names.snapshot(NAME, old_rev))
    sim.kube.objects[key]["data"].pop(R.RENDERING_KEY)
    sim.op.children.put(copy.deepcopy(sim.kube.objects[key]))
    _upgrade_operator(sim, monkeypatch)
    sim.kube.calls.clear()
    out = sim.tick(sync=False)
    assert out.result == "held" and not out.applied and not out.pruned
    assert not [c for c in sim.kube.calls if c.startswith(("apply", "delete"))]
    cond = next(c for c in sim.status()["conditions"] if c["type"] == "Progressing")
    assert cond["reason"] == C.ROLLOUT_HELD and "kept no rendering" in cond["message"], cond
    assert _templates_rendered_by_next(sim, NAME) == [False, False]


def test_upgrade_canaries_beyond_the_limit_wait_with_the_stable_fleet_as_it_runs(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    """HISPARSE_UPGRADE_CANARIES=1 and another deployment's upgrade canary under way (as the watch shows
    it): this one keeps its stable fleet as it runs and starts no canary until that one has ended."""
    other = {"apiVersion": f"{L.GROUP}/v1alpha1", "kind": L.KIND,
             "metadata": {"name": "other", "namespace": NS, "uid": "uid-other", "resourceVersion": "1"},
             "status": {"canary": {"revision": "0123456789", "phase": "Shifting", "upgrade": True}}}
    kept = _shaping_objects(sim, NAME)
    _upgrade_operator(sim, monkeypatch)
    sim.op.deployments.put(copy.deepcopy(other))
    op = sim.op
    monkeypatch.setattr(op, "reconcile", lambda: RC.reconcile(
        sim.kube, NS, NAME, op.nodes.snapshot(), op.children, deployments=op.deployments, renders=op.renders,
        upgrade_canaries=1))
    for _ in range(3):
        out = sim.tick(30)
        assert out.requeue_after == R.UPGRADE_QUEUE_SECONDS
        assert sim.phase() is None and _shaping_objects(sim, NAME) == kept
        cond = next(c for c in sim.status()["conditions"] if c["type"] == "Progressing")
        assert cond["reason"] == C.UPGRADE_QUEUED and "1 upgrade canary at once" in cond["message"], cond
    other["status"]["canary"]["phase"] = "Promoted"
    other["metadata"]["resourceVersion"] = "2"
    sim.op.deployments.put(copy.deepcopy(other))
    sim.tick(30)
    assert sim.phase() == "Parity" and sim.status()["canary"]["upgrade"] is True
    assert _shaping_objects(sim, NAME) == kept and not sim.violations


def test_upgrade_slots_count_watched_upgrade_canaries_and_the_ones_just_started() -> None:
    from hisparse_operator.controller.cache import ChildCache

    cache = ChildCache()

    def hsd(name: str, rv: str, **canary: Any) -> dict[str, Any]:
        return {"kind": L.KIND, "metadata": {"name": name, "namespace": NS, "uid": f"u-{name}", "resourceVersion": rv},
                "status": {"canary": canary} if canary else {}}

    cache.put(hsd("a", "1", phase="Parity", upgrade=True))
    cache.put(hsd("b", "1", phase="Shifting"))  # a spec change's canary: not counted
    cache.put(hsd("c", "1", phase="RolledBack", upgrade=True, replicas={"decode": {"stable": 1, "candidate": 1}}))
    cache.put(hsd("d", "1", phase="Promoted", upgrade=True))
    RC._upgrade_started.clear()
    assert RC._upgrade_slots(cache, NS, "x", 3) == R.UpgradeSlots(1, 3)  # a and c (winding down)
    assert RC._upgrade_slots(cache, NS, "a", 3) == R.UpgradeSlots(2, 3)  # its own is not another's
    assert RC._upgrade_slots(cache, NS, "x", 0) == R.UpgradeSlots(None, 0)
    RC._upgrade_started[(NS, "e")] = time.monotonic()  # started here, not watched back yet
    assert RC._upgrade_slots(cache, NS, "x", 3) == R.UpgradeSlots(0, 3)
    RC._upgrade_started.clear()
