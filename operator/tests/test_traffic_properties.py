"""The canary's traffic model, as property tests of the planner driven tick by tick.

``_Cluster`` below is a small simulator, not a model of any real controller's internals: it does what the
executor and the workload controllers do with a :class:`rollout.Decision` as far as traffic is
concerned. Each role of each fleet is a list of pods; a Decision's replica counts add pods (each ready
after a delay the test draws, or never) or remove the newest at once; a promotion makes the candidate's
fleet, its pods as they are, the stable one; a fleet whose revision changes (the stable fleet taking the
candidate's spec in the ``Promoting`` of a rollout an earlier operator started, whose status names no
candidate fleet) loses its old pods; the parity Job
answers some seconds after the Decision asks for it. The planner then sees that as ``FleetObs``
(ready replicas of the workload's revision, pods that exist), exactly as ``reconcile._fleet_obs``
reports a workload.

After every tick, on what clients see until the next one (scale-downs done, new pods not ready yet):
the route's weight is at most the step's and at most the candidate's share of ready capacity in every
role; every entry point (the HTTPRoute's backends, the InferencePool ``<name>``, the Service
``<name>-serving``; routing off leaves only the Service) has a ready endpoint whenever a revision allowed
traffic has ready capacity, also the one the previous tick pointed it at (endpoints lag a selector
change); a rollback never takes stable replicas, never raises the candidate's weight, and never removes
candidate replicas before stable ones are ready in their place; a promotion creates and removes no pod.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import yaml
from hypothesis import example, given, settings, strategies as st
from opsupport import EXAMPLES

from hisparse_operator.api import labels as L, validate
from hisparse_operator.controller import rollout as R
from hisparse_operator.render import revision

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
STABLE = "stable0001"
NEVER = None
FLEET = "dsv32-7d4e5f"
"""The candidate fleet's name the executor passes (None: the status of a rollout an earlier operator started)."""


def _deployment(*, prefill: int, decode: int, canary: dict[str, int], steps: list[dict[str, Any]],
                delay: int, gate: bool = True) -> Any:
    doc = yaml.safe_load((EXAMPLES / "hisparse-deployment.yaml").read_text())
    doc["spec"]["engine"]["image"] = "rt:candidate"
    doc["spec"]["prefill"]["replicas"], doc["spec"]["decode"]["replicas"] = prefill, decode
    doc["spec"]["rollout"] = {"strategy": "Canary", "canary": canary, "steps": steps, "scaleDownDelaySeconds": delay,
                              "readyTimeoutSeconds": 900, "parity": {"enabled": gate, "timeoutSeconds": 600}}
    d, errors = validate(doc, None)
    assert not errors and d is not None, errors
    return d


@dataclass
class _Pod:
    revision: str
    ready_at: float | None
    """Seconds on the test's clock (None: never ready)."""


@dataclass
class _Cluster:
    """Pods per (fleet, role), the clock, and the readiness delays new pods take in turn."""

    roles: dict[str, int]
    candidate: str
    delays: list[float | None]
    t: float = 0.0
    pods: dict[tuple[str, str], list[_Pod]] = field(default_factory=dict)
    parity_at: float | None = None

    def __post_init__(self) -> None:
        for role, n in self.roles.items():
            self.pods[("stable", role)] = [_Pod(STABLE, 0.0) for _ in range(n)]
            self.pods[("candidate", role)] = []

    def _delay(self) -> float | None:
        return self.delays.pop(0) if self.delays else 30.0

    def apply(self, dec: R.Decision, spec: dict[str, int]) -> None:
        """The Decision's fleets: scale-downs at once (the scale-down delay is the planner's), new pods
        not ready."""
        stable_rev = self.candidate if dec.stable_is_candidate else STABLE
        if dec.promoted and (dec.canary_status or {}).get("fleet"):
            # The candidate's fleet is the stable one from now on, as it is.
            for role in self.roles:
                self.pods[("stable", role)], self.pods[("candidate", role)] = self.pods[("candidate", role)], []
        for role, n in self.roles.items():
            s, k = dec.replicas[role] if dec.replicas else (spec[role], 0)
            if not dec.canary:
                k = 0
            for fleet, want, rev in (("stable", s, stable_rev), ("candidate", k, self.candidate)):
                pods = [p for p in self.pods[(fleet, role)] if p.revision == rev]  # a new template replaces them
                # A scale-down removes pods that are not ready first, as a ReplicaSet does (its deletion
                # ranking), then the newest.
                pods.sort(key=lambda p: p.ready_at is None or p.ready_at > self.t)
                del pods[want:]
                while len(pods) < want:
                    delay = self._delay()
                    # (Ready at the next look at the earliest: never at the instant it was made.)
                    pods.append(_Pod(rev, None if delay is None else self.t + max(delay, 0.001)))
                self.pods[(fleet, role)] = pods
        if dec.run_parity and self.parity_at is None:
            self.parity_at = self.t + 20

    def ready(self, fleet: str, role: str) -> int:
        return sum(1 for p in self.pods[(fleet, role)] if p.ready_at is not None and p.ready_at <= self.t)

    def obs(self, fleet: str) -> dict[str, R.FleetObs]:
        out = {}
        for role in self.roles:
            pods = self.pods[(fleet, role)]
            rev = pods[0].revision if pods else (STABLE if fleet == "stable" else self.candidate)
            out[role] = R.FleetObs(revision=rev, ready=self.ready(fleet, role), pods=len(pods))
        return out

    def serves(self, fleet: str) -> bool:
        """The fleet's pool has a ready replica of every role (its EPP is always up here)."""
        return all(self.ready(fleet, r) > 0 for r in self.roles)


STEP = st.one_of(
    st.integers(1, 100).map(lambda w: {"weight": w, "pauseSeconds": 60}),
    st.sampled_from([{"pause": {}}, {"pause": {"seconds": 90}}]),
)


def _steps(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Weight steps strictly rising (the API refuses anything else), pauses where drawn."""
    out, last = [], 0
    for s in raw:
        if "weight" in s:
            if s["weight"] <= last:
                continue
            last = s["weight"]
        out.append(s)
    return out or [{"weight": 50, "pauseSeconds": 60}]


def _share(cand: dict[str, int], stable: dict[str, int]) -> int:
    return min(100 * cand[r] // (cand[r] + stable[r]) for r in cand)


@settings(max_examples=300, deadline=None)
@given(
    prefill=st.integers(1, 8), decode=st.integers(1, 4),
    canary_p=st.integers(1, 3), canary_d=st.integers(1, 2),
    raw_steps=st.lists(STEP, min_size=1, max_size=4),
    delays=st.lists(st.one_of(st.floats(0, 200), st.floats(0, 200), st.floats(0, 200), st.none()), max_size=40),
    ticks=st.lists(st.integers(5, 60), min_size=20, max_size=250),
    abort_at=st.one_of(st.none(), st.integers(0, 60)),
    verdict=st.sampled_from(["passed", "passed", "passed", "failed"]),
    promote_every=st.integers(3, 15),
    delay=st.sampled_from([0, 10, 30]),
    fleet=st.sampled_from([FLEET, FLEET, None]),
)
# Found by this test: a scale-down delay that began for an earlier, smaller shrink let the ramp remove the
# stable fleet's last replicas in the tick the route stopped counting them (the entry points still on them).
@example(prefill=5, decode=1, canary_p=2, canary_d=1, raw_steps=[{"weight": 1, "pauseSeconds": 60}],
         delays=[0.0, 0.0, 0.0, 0.0, 31.0], ticks=[5] * 15 + [10] + [5] * 4, abort_at=None, verdict="passed",
         promote_every=3, delay=0, fleet=FLEET)
# Found by this test: a wind-down's due scale-down with a candidate pod that never became ready (the
# simulated scale-down then removed ready pods first, which a ReplicaSet does not).
@example(prefill=6, decode=1, canary_p=2, canary_d=1, raw_steps=[{"weight": 1, "pauseSeconds": 60}],
         delays=[0.0, 0.0, 0.0, None], ticks=[5] * 25 + [54, 11] + [60] * 13 + [5, 5, 30, 5], abort_at=None,
         verdict="passed", promote_every=3, delay=0, fleet=FLEET)
def test_property_traffic_follows_the_step_and_capacity_and_every_entry_point_serves(
        prefill: int, decode: int, canary_p: int, canary_d: int, raw_steps: list[dict[str, Any]],
        delays: list[float | None], ticks: list[int], abort_at: int | None, verdict: str, promote_every: int,
        delay: int, fleet: str | None) -> None:
    steps = _steps(raw_steps)
    d = _deployment(prefill=prefill, decode=decode, canary={"prefill": canary_p, "decode": canary_d}, steps=steps,
                    delay=delay)
    spec = {"prefill": prefill, "decode": decode}
    size = {r: c for r, (_, c) in R.roles_of(d).items()}
    cand_rev = revision(d)
    cluster = _Cluster(dict(spec), cand_rev, list(delays))
    prev: dict[str, Any] | None = None
    last: R.Decision | None = None
    passed = False
    shifting = 0
    """Ticks since traffic began to move: an abort lands at a random one of them (the ramp included)."""
    for i, seconds in enumerate(ticks):
        cluster.t += seconds
        action = None
        shifting += (prev or {}).get("phase") == "Shifting"
        if abort_at is not None and shifting == abort_at + 1 and (prev or {}).get("phase") == "Shifting":
            action = f"abort@{i}"
        elif i % promote_every == promote_every - 1:
            action = f"promote@{i}"  # continues pauses that wait for one
        job = None
        if cluster.parity_at is not None and cluster.t >= cluster.parity_at and (prev or {}).get("phase") == "Parity":
            job = R.Verdict("passed", "Passed", "ok", {"compared": 32}) if verdict == "passed" else \
                R.Verdict("failed", "Diverged", "prompt 3 at token 0", {"compared": 32, "diverged": 1})
        before_stable = {r: cluster.ready("stable", r) for r in spec}
        before_cand = {r: len(cluster.pods[("candidate", r)]) for r in spec}
        cand_pods = {r: list(cluster.pods[("candidate", r)]) for r in spec}
        obs = R.Observed(stable=cluster.obs("stable"), candidate=cluster.obs("candidate"), parity=job, action=action)
        s = R.decide(d, stable=STABLE, candidate=cand_rev, has_snapshot=True, previous=prev, observed=obs,
                     now=T0 + dt.timedelta(seconds=cluster.t), fleet=fleet)
        st_ = s.canary_status or {}
        phase, prev_phase = st_.get("phase"), (prev or {}).get("phase")
        passed = passed or bool((s.parity_status or {}).get("passed"))
        cluster.apply(s, spec)

        # -- what clients see until the next tick
        # The candidate may carry traffic: parity passed, and not a wind-down of one that had none.
        allowed = passed and phase != "Parity" and not (phase in R.WINDING_DOWN and (last is None or (
            last.weight == 0 and last.serving == "stable")))
        ready_s = {r: cluster.ready("stable", r) for r in spec}
        ready_c = {r: cluster.ready("candidate", r) for r in spec}
        if not s.canary:
            assert s.weight == 0 and s.serving == "stable"
        else:
            assert s.replicas is not None
            for r in spec:
                assert sum(s.replicas[r]) <= spec[r] + size[r], ("surge", r, s.replicas)
            # (1) the ceiling: the step's weight (0 in Parity, 100 for the ramp and Promoting); a wind-down's
            # is the weight it started from, which only falls.
            if phase == "Parity":
                ceiling = 0
            elif phase == "Shifting":
                ceiling = R.step_weight(d.spec.rollout.steps, int(st_["step"]))
            elif phase == "Promoting":
                ceiling = 100
            else:
                ceiling = last.weight if last is not None else 0
            if cluster.serves("candidate") and cluster.serves("stable"):
                assert s.weight <= ceiling, ("weight above the step's", s.weight, ceiling, phase, st_.get("step"))
                if not st_.get("shrinkSince"):
                    # Nothing planned to leave: the share is of the replicas that are there.
                    assert s.weight <= _share(ready_c, ready_s), ("weight above a role's share", s.weight, ready_c, ready_s)
            if s.weight > 0:
                assert passed, "traffic before a passed verdict"
            # (2) the route never points at a pool with no ready endpoint while the other has one; the pool
            # <name> is an alias of the candidate's while the entry points select it.
            own = "candidate" if s.serving == "candidate" else "stable"
            if s.weight > 0 and not cluster.serves("candidate"):
                assert not cluster.serves(own), ("weight on an empty candidate pool", s.weight, ready_c, ready_s)
            if s.weight < 100 and not cluster.serves(own):
                assert not (allowed and cluster.serves("candidate")), ("weight on an empty stable pool", s.weight, own,
                                                                       ready_c, ready_s)
        # (3) every entry point (<name>-serving, the InferencePool <name>) has a ready endpoint whenever a
        # revision allowed traffic can serve: this tick's target, and the last tick's (endpoints lag).
        anything = cluster.serves("stable") or (allowed and cluster.serves("candidate"))
        if anything:
            targets = {s.serving} | ({last.serving} if last is not None and last.canary else set())
            if s.promoted and fleet is not None:
                targets = {"stable"}  # the fleet the last tick called the candidate's is the stable one now
            for target in targets:
                assert cluster.serves(target), ("an entry point without a ready endpoint", target, ready_s, ready_c, phase)
        # (4) a rollback: stable replicas never shrink, the weight never rises, the candidate keeps what
        # the stable fleet cannot serve yet.
        if phase in R.WINDING_DOWN and prev_phase == phase and last is not None and last.canary:
            assert s.weight <= last.weight, ("a wind-down raised the candidate's weight", last.weight, s.weight)
            if s.canary:
                assert all(s.replicas[r][0] >= last.replicas[r][0] for r in spec), "a rollback took stable replicas"
                carried = last.weight > 0 or last.serving == "candidate"
                stable_pool = all(before_stable[r] > 0 for r in spec)
                for r in spec:
                    if carried:
                        need = spec[r] - (before_stable[r] if stable_pool else 0)
                        assert s.replicas[r][1] >= min(before_cand[r], need), \
                            ("candidate replicas left before stable ones were ready", r, s.replicas, before_stable)
        # (5) a promotion creates no pod: the candidate's pods, every replica of each role, ready, are the
        # stable fleet's as they were (in the Promoting an earlier operator started, they moved one by one).
        if s.promoted and fleet is not None:
            assert prev_phase == "Shifting", prev_phase
            for r in spec:
                pods = cluster.pods[("stable", r)]
                assert len(pods) == spec[r] == len(cand_pods[r]) and all(a is b for a, b in zip(pods, cand_pods[r])), r
                assert cluster.ready("stable", r) == spec[r], ("promoted with a replica not ready", r)
        prev, last = s.canary_status, s
        if s.promoted or (phase in R.OUTCOMES and not s.canary):
            break


def _drive(d: Any, *, ticks: int = 400, dt_s: float = 10.0) -> list[R.Decision]:
    """Every pod ready 5 s after it is asked for, parity passes: the decisions of a whole rollout."""
    spec = {r: n for r, (n, _) in R.roles_of(d).items()}
    cluster = _Cluster(dict(spec), revision(d), [5.0] * 10_000)
    prev, out = None, []
    for i in range(ticks):
        cluster.t += dt_s
        job = R.Verdict("passed", "Passed", "ok", {"compared": 32}) \
            if cluster.parity_at is not None and cluster.t >= cluster.parity_at else None
        obs = R.Observed(stable=cluster.obs("stable"), candidate=cluster.obs("candidate"), parity=job,
                         action=f"promote@{i}" if i % 7 == 6 else None)
        s = R.decide(d, stable=STABLE, candidate=revision(d), has_snapshot=True, previous=prev, observed=obs,
                     now=T0 + dt.timedelta(seconds=cluster.t), fleet=FLEET)
        cluster.apply(s, spec)
        out.append(s)
        prev = s.canary_status
        if s.promoted:
            return out
    raise AssertionError(f"not promoted: {prev}")


def test_eight_prefill_one_decode_at_a_step_of_10_routes_at_most_10_percent() -> None:
    """The example's shape (8 prefill, 1 decode): the old rule routed 50% at a weight-10 step (decode's
    share), to a candidate holding 1 of 8 prefill replicas."""
    d = _deployment(prefill=8, decode=1, canary={"prefill": 1, "decode": 1},
                    steps=[{"weight": 10, "pauseSeconds": 600}, {"weight": 50, "pauseSeconds": 60}], delay=10)
    decisions = _drive(d)
    at_10 = [s.weight for s in decisions if (s.canary_status or {}).get("phase") == "Shifting" and s.canary_status["step"] == 0]
    assert at_10 and max(at_10) == 10, at_10
    at_50 = [s.weight for s in decisions if (s.canary_status or {}).get("phase") == "Shifting" and s.canary_status["step"] == 1]
    assert max(at_50) == 50, at_50  # 4 of 8 prefill, 1 of 2 decode: 50 in both roles
    # Ramp and promotion never leave an entry point empty: decode's last stable replica stays until the
    # stable prefill has gone too, then the entry points follow the candidate until the stable fleet is back.
    serving = [s.serving for s in decisions]
    assert "candidate" in serving and serving[-1] == "stable", serving


def test_a_first_pause_step_routes_nothing() -> None:
    d = _deployment(prefill=8, decode=1, canary={"prefill": 1, "decode": 1},
                    steps=[{"pause": {}}, {"weight": 20, "pauseSeconds": 60}], delay=10)
    decisions = _drive(d)
    paused = [s.weight for s in decisions if (s.canary_status or {}).get("phase") == "Shifting" and s.canary_status["step"] == 0]
    assert paused and set(paused) == {0}, paused
    at_20 = [s.weight for s in decisions if (s.canary_status or {}).get("phase") == "Shifting" and s.canary_status["step"] == 1]
    assert 12 in at_20 and max(at_20) == 20, at_20  # 1 of 8 prefill first (12%), then 2 of 8 (25%): capped at 20


def test_a_rollback_during_the_ramp_gives_traffic_back_only_as_stable_capacity_returns() -> None:
    """Aborted once the ramp has emptied the stable fleet (the entry points on the candidate): the stable
    fleet grows back, the candidate keeps its replicas and a falling share until stable ones are ready in
    their place, and the entry points come back once the stable fleet has caught up. The old rule dropped
    the candidate as soon as one stable replica was ready, handing it everything."""
    d = _deployment(prefill=4, decode=2, canary={"prefill": 1, "decode": 1},
                    steps=[{"weight": 50, "pauseSeconds": 30}], delay=10)
    spec = {r: n for r, (n, _) in R.roles_of(d).items()}
    cluster = _Cluster(dict(spec), revision(d), [60.0] * 10_000)
    prev, aborted, seen = None, False, []
    for i in range(600):
        cluster.t += 10
        job = R.Verdict("passed", "Passed", "ok", {"compared": 32}) \
            if cluster.parity_at is not None and cluster.t >= cluster.parity_at else None
        ramp = (prev or {}).get("phase") == "Shifting" and (prev or {}).get("servingFleet") == "candidate"
        obs = R.Observed(stable=cluster.obs("stable"), candidate=cluster.obs("candidate"), parity=job,
                         action=f"abort@{i}" if ramp and not aborted else None)
        aborted = aborted or ramp
        s = R.decide(d, stable=STABLE, candidate=revision(d), has_snapshot=True, previous=prev, observed=obs,
                     now=T0 + dt.timedelta(seconds=cluster.t), fleet=FLEET)
        cluster.apply(s, spec)
        if aborted:
            seen.append((s.weight, s.serving, dict(s.replicas or {}), {r: cluster.ready("stable", r) for r in spec}))
        prev = s.canary_status
        if aborted and not s.canary:
            break
    assert aborted and prev["phase"] == "RolledBack", prev
    weights = [w for w, *_ in seen]
    # At once to the share of what is ready (the stable replicas the ramp was about to remove stay), then
    # down in steps as stable replicas become ready; the entry points stay on the candidate meanwhile.
    assert weights == sorted(weights, reverse=True) and 0 < weights[0] < 100 and weights[-1] == 0, weights
    assert len(set(weights)) >= 3 and seen[0][1] == "candidate", seen
    for w, serving, reps, ready in seen:
        if serving == "candidate":
            assert any(ready[r] < reps[r][1] for r in spec) or not all(ready.values()), (serving, reps, ready)
    stable_reps = [reps[r][0] for _, _, reps, _ in seen if reps for r in spec]
    assert stable_reps, seen


def test_the_entry_points_are_rendered_as_aliases_of_the_candidate_s_while_it_serves_them() -> None:
    """``Canary(serving="candidate")``: the Service ``<name>-serving`` and the InferencePool ``<name>``
    take the candidate's selector, port and endpoint picker (so routes users attached themselves, and
    direct clients, reach the candidate's pods); nothing else of the stable fleet changes."""
    from hisparse_operator import names
    from hisparse_operator.render import Canary, render_validated

    stable = _deployment(prefill=2, decode=1, canary={"prefill": 1, "decode": 1}, steps=[{"weight": 50}], delay=10)
    doc = stable.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["spec"]["engine"]["image"] = "rt:other"
    candidate, errors = validate(doc, None)
    assert not errors and candidate is not None
    plain = render_validated(stable, Canary(candidate, 100, False))
    aliased = render_validated(stable, Canary(candidate, 100, False, serving="candidate"))
    by = lambda objs: {(o["kind"], o["metadata"]["name"]): o for o in objs}  # noqa: E731
    p, a = by(plain), by(aliased)
    fleet = names.fleet(stable.name, revision(candidate))
    entry = {("Service", names.serving(stable.name)): ("Service", names.serving(fleet)),
             ("InferencePool", names.inference_pool(stable.name)): ("InferencePool", names.inference_pool(fleet))}
    assert set(p) == set(a)
    for key in p:
        if key in entry:
            assert a[key]["spec"] == p[entry[key]]["spec"] != p[key]["spec"], key
            assert a[key]["metadata"] == p[key]["metadata"]  # still the stable object, owned as before
        else:
            assert a[key] == p[key], key
    pods = [o["spec"].get("template") or o["spec"]["leaderWorkerTemplate"]["workerTemplate"]
            for k, o in a.items() if k[0] in ("Deployment", "LeaderWorkerSet") and "decode" in k[1]]
    selector = a[("Service", names.serving(stable.name))]["spec"]["selector"]
    matched = [t["metadata"]["labels"][L.DEPLOYMENT] for t in pods
               if all(t["metadata"]["labels"].get(k) == v for k, v in selector.items())]
    assert matched == [fleet], matched
