"""Analysis steps in the rollout planner (pure): ``count`` measurements ``intervalSeconds`` apart, with
Argo Rollouts' ``failureLimit``, ``inconclusiveLimit`` and ``consecutiveErrorLimit``; the counters live in
``status.canary.analysis``, so a restarted operator continues the same analysis."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from hypothesis import given, settings, strategies as st
from opsupport import EXAMPLES
from test_rollout import T0, _at, _deployment, _passed, _settle, _step

from hisparse_operator.api import validate
from hisparse_operator.api.status import CanaryStatus
from hisparse_operator.controller import conditions as C
from hisparse_operator.controller import rollout as R

PROM = "http://prometheus.monitoring.svc:9090"
DELAY = 60


def _doc(*queries: dict[str, Any]) -> Any:
    qs = [{"name": "errors", "query": "x", "max": 0.01, **q} for q in queries] if queries else [
        {"name": "errors", "query": "x", "max": 0.01}]
    return _deployment(image="rt:new", strategy="Canary", steps=[
        {"weight": 10, "pauseSeconds": 0},
        {"analysis": {"prometheusUrl": PROM, "queries": qs, "delaySeconds": DELAY}},
        {"weight": 50, "pauseSeconds": 600}])


def _obs(s: R.Decision) -> dict[str, Any]:
    reps = s.replicas or {}
    return {"cand": {r: k for r, (_, k) in reps.items()}, "stable": {r: v for r, (v, _) in reps.items()}}


def _at_analysis(d: Any) -> tuple[R.Decision, float]:
    """The rollout at its analysis step (index 1), replicas in place, and the time (s after T0)."""
    s = _step(d, None, T0)
    s = _step(d, s.canary_status, T0, cand=1)
    s = _step(d, s.canary_status, T0, cand=1, parity=_passed())
    s, t = _settle(d, s, 0)
    assert s.canary_status["step"] == 1 and s.progressing[0] == C.CANARY_ANALYSIS, s.progressing
    return s, t


def _elapsed(text: str) -> float:
    return (R._time(text, T0) - T0).total_seconds()


class Run:
    """Feeds the planner one measurement per due query, each at the moment it asks for it."""

    def __init__(self, d: Any) -> None:
        self.d = d
        self.s, self.t = _at_analysis(d)
        self.started = _elapsed(self.s.canary_status["stepStartedAt"])
        self.attempts: list[float] = []

    def status(self) -> dict[str, Any]:
        return self.s.canary_status or {}

    def counters(self, name: str = "errors") -> dict[str, Any]:
        return self.status()["analysis"]["queries"][name]

    def measure(self, **kinds: str) -> R.Decision:
        """Wait as long as the planner asked, then give each due query its kind of measurement."""
        assert self.s.requeue_after is not None and self.s.requeue_after > 0
        early = self.t + self.s.requeue_after - 0.5
        assert R.analysis_due(self.d, self.status(), _at(early)) is None, "due before the planner asked"
        self.t += self.s.requeue_after
        due = R.analysis_due(self.d, self.status(), _at(self.t))
        assert due is not None and due.step == 1
        got = {q.name: R.Measurement(kinds[q.name], f"{q.name}: {kinds[q.name]}") for q in due.queries if q.name in kinds}
        self.attempts.append(self.t)
        self.s = _step(self.d, self.status(), _at(self.t), analysis=got, **_obs(self.s))
        return self.s

    def series(self, *kinds: str, name: str = "errors") -> R.Decision:
        for k in kinds:
            self.measure(**{name: k})
        return self.s

    def phase(self) -> tuple[str, int]:
        return self.status()["phase"], self.status()["step"]


def test_the_first_measurement_waits_the_delay_then_they_come_at_the_interval() -> None:
    r = Run(_doc({"count": 3, "intervalSeconds": 30}))
    assert r.s.requeue_after == DELAY
    r.series("passed", "passed")
    assert r.attempts == [r.started + DELAY, r.started + DELAY + 30]
    assert r.counters()["measured"] == 2 and r.phase() == ("Shifting", 1) and r.s.requeue_after == 30
    assert "errors 2/3 measured" in r.s.progressing[1]
    r.series("passed")
    assert r.phase() == ("Shifting", 2) and "analysis" not in r.status()
    assert any(e[1] == C.CANARY_ANALYSIS and "passed" in e[2] and "3 of 3" in e[2] for e in r.s.events)


def test_a_blip_of_errors_within_consecutive_error_limit_is_retried_then_passes() -> None:
    r = Run(_doc({"count": 3, "intervalSeconds": 20, "consecutiveErrorLimit": 2}))
    r.series("error", "error")
    c = r.counters()
    assert r.phase() == ("Shifting", 1) and c["errors"] == 2 and c["consecutiveErrors"] == 2 and c["measured"] == 0
    assert r.s.requeue_after == 20  # retried at the interval
    assert any(e[0] == "Warning" and "error 2 in a row of 2 tolerated" in e[2] for e in r.s.events)
    r.series("passed", "error", "error", "passed")  # the run of errors restarts after a measurement
    assert r.counters()["consecutiveErrors"] == 0 and r.counters()["errors"] == 4 and r.phase() == ("Shifting", 1)
    r.series("passed")
    assert r.phase() == ("Shifting", 2)
    assert [b - a for a, b in zip(r.attempts, r.attempts[1:])] == [20] * 6


def test_errors_beyond_consecutive_error_limit_roll_back() -> None:
    r = Run(_doc({"count": 3, "intervalSeconds": 20, "consecutiveErrorLimit": 2}))
    r.series("error", "error", "error")
    st = r.status()
    assert st["phase"] == "RolledBack", st
    assert "3 errors in a row, consecutiveErrorLimit 2" in st["message"] and "errors: error" in st["message"]
    assert st["analysis"]["queries"]["errors"]["phase"] == "Failed"  # kept: what rolled it back
    # Argo's default: 4 errors in a row are tolerated, the fifth fails.
    r = Run(_doc({"count": 2, "intervalSeconds": 10}))
    r.series("error", "error", "error", "error")
    assert r.phase() == ("Shifting", 1)
    r.series("error")
    assert r.status()["phase"] == "RolledBack"


def test_failures_within_failure_limit_pass_and_one_more_rolls_back_at_once() -> None:
    r = Run(_doc({"count": 4, "intervalSeconds": 15, "failureLimit": 1}))
    r.series("failed", "passed", "passed", "passed")
    assert r.phase() == ("Shifting", 2)
    r = Run(_doc({"count": 4, "intervalSeconds": 15, "failureLimit": 1}))
    r.series("failed", "passed", "failed")  # before count is reached
    st = r.status()
    assert st["phase"] == "RolledBack" and "2 of 3 measurements failed, failureLimit 1" in st["message"]
    # failureLimit 0 (the default): the first failure.
    r = Run(_doc({"count": 5, "intervalSeconds": 15}))
    r.series("passed", "failed")
    assert r.status()["phase"] == "RolledBack"


def test_inconclusive_beyond_its_limit_holds_and_resume_measures_again_or_promote_goes_on() -> None:
    r = Run(_doc({"count": 3, "intervalSeconds": 15, "inconclusiveLimit": 1}))
    r.series("inconclusive", "passed")
    assert r.phase() == ("Shifting", 1) and not r.status().get("paused")
    r.series("inconclusive")
    st = r.status()
    assert st["paused"] and "2 of 3 measurements inconclusive, inconclusiveLimit 1" in st["holdReason"]
    assert r.s.progressing[0] == C.CANARY_PAUSED and r.s.requeue_after is None
    held = r.s
    t = r.t + 3600
    assert R.analysis_due(r.d, st, _at(t)) is None  # held: nothing measured while paused
    still = _step(r.d, st, _at(t), **_obs(held))
    assert still.canary_status["paused"] and still.canary_status["step"] == 1
    # resume: a new analysis, from zero
    resumed = _step(r.d, st, _at(t), action="resume", **_obs(held))
    assert not resumed.canary_status.get("paused") and resumed.canary_status["analysis"]["queries"] == {}
    due = R.analysis_due(r.d, resumed.canary_status, _at(t + resumed.requeue_after))
    assert due is not None and [q.name for q in due.queries] == ["errors"]
    # promote: past the analysis
    on = _step(r.d, st, _at(t), action="promote", **_obs(held))
    assert on.canary_status["step"] == 2 and "analysis" not in on.canary_status


def test_an_empty_result_is_never_a_pass() -> None:
    """``count: 1`` (the default) with a measurement that found no data: inconclusive, held."""
    r = Run(_doc())
    r.series("inconclusive")
    assert r.status()["paused"] and r.phase() == ("Shifting", 1)


def test_a_restarted_operator_continues_the_same_analysis() -> None:
    """The planner keeps nothing but ``status.canary``: written through the API model (what the apiserver
    keeps) and read back by a new planner, the counts and the interval go on where they were."""
    r = Run(_doc({"count": 3, "intervalSeconds": 40, "failureLimit": 1}))
    r.series("failed", "passed")
    kept = CanaryStatus.model_validate(r.status()).model_dump(mode="json", by_alias=True, exclude_none=True)
    assert kept["analysis"] == r.status()["analysis"]
    restart = r.t + 5  # the operator comes back 5 s after the last measurement
    s = _step(r.d, kept, _at(restart), **_obs(r.s))
    assert R.analysis_due(r.d, s.canary_status, _at(restart)) is None  # no measurement before its interval
    assert s.requeue_after == 35 and s.canary_status["analysis"]["queries"]["errors"]["measured"] == 2
    r.s, r.t = s, restart
    r.series("failed")  # the second failure: over failureLimit 1, counted with the one before the restart
    assert r.status()["phase"] == "RolledBack" and "2 of 3 measurements failed" in r.status()["message"]


def test_queries_run_on_their_own_intervals_a_failure_ends_the_step_and_inconclusive_waits_for_the_rest() -> None:
    d = _doc({"name": "errors", "count": 2, "intervalSeconds": 10},
             {"name": "latency", "count": 2, "intervalSeconds": 25, "maxRatioToStable": 1.2})
    r = Run(d)
    r.measure(errors="passed", latency="passed")
    r.measure(errors="passed")  # 10 s later: only errors was due
    assert r.counters("errors")["phase"] == "Passed" and r.counters("latency")["measured"] == 1
    assert r.phase() == ("Shifting", 1) and r.s.requeue_after == 15
    r.measure(latency="passed")
    assert r.phase() == ("Shifting", 2)
    r = Run(d)
    r.measure(errors="inconclusive", latency="passed")
    assert r.counters("errors")["phase"] == "Inconclusive" and not r.status().get("paused")  # latency still runs
    r.measure(latency="failed")
    assert r.status()["phase"] == "RolledBack" and "latency: 1 of 2 measurements failed" in r.status()["message"]


def test_a_measurement_the_planner_did_not_ask_for_counts_nothing() -> None:
    r = Run(_doc({"count": 3, "intervalSeconds": 30}))
    r.measure(errors="passed")
    early = _step(r.d, r.status(), _at(r.t + 1), analysis={"errors": R.Measurement("failed", "errors: failed")}, **_obs(r.s))
    assert early.canary_status["analysis"] == r.status()["analysis"] and early.canary_status["phase"] == "Shifting"


@settings(max_examples=60, deadline=None)
@given(kinds=st.lists(st.sampled_from(["passed", "failed", "inconclusive", "error"]), min_size=1, max_size=14),
       count=st.integers(1, 5), failure_limit=st.integers(0, 2), inconclusive_limit=st.integers(0, 2),
       error_limit=st.integers(0, 3), interval=st.integers(1, 120))
def test_property_the_outcome_is_argo_s_and_measurements_keep_their_interval(
    kinds: list[str], count: int, failure_limit: int, inconclusive_limit: int, error_limit: int, interval: int,
) -> None:
    count = max(count, failure_limit + inconclusive_limit + 1)  # what admission requires
    r = Run(_doc({"count": count, "intervalSeconds": interval, "failureLimit": failure_limit,
                  "inconclusiveLimit": inconclusive_limit, "consecutiveErrorLimit": error_limit}))
    n = {"passed": 0, "failed": 0, "inconclusive": 0}
    run = expected = 0
    for k in kinds:
        r.measure(errors=k)
        run = run + 1 if k == "error" else 0
        if k != "error":
            n[k] += 1
        if n["failed"] > failure_limit or run > error_limit:
            expected = "RolledBack"
        elif n["inconclusive"] > inconclusive_limit or (sum(n.values()) >= count and not n["passed"]):
            expected = "held"
        elif sum(n.values()) >= count:
            expected = "passed"
        st_ = r.status()
        if expected:
            break
        assert st_["phase"] == "Shifting" and st_["step"] == 1 and not st_.get("paused")
    st_ = r.status()
    if expected == "RolledBack":
        assert st_["phase"] == "RolledBack"
    elif expected == "held":
        assert st_["phase"] == "Shifting" and st_["paused"] and st_["step"] == 1
    elif expected == "passed":
        assert st_["phase"] == "Shifting" and st_["step"] == 2 and n["passed"] >= 1
    assert all(b - a == interval for a, b in zip(r.attempts, r.attempts[1:]))
    assert r.attempts[0] == r.started + DELAY


# --- admission ------------------------------------------------------------------------------------

def _manifest(**query: Any) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / "hisparse-deployment.yaml").read_text())
    doc["spec"]["rollout"] = {"strategy": "Canary", "steps": [{"weight": 10}, {"analysis": {
        "prometheusUrl": PROM, "queries": [{"name": "errors", "query": "x", "max": 0.01, **query}]}}]}
    return doc


@pytest.mark.parametrize(("query", "field", "words"), [
    ({"count": 0}, "count", "must be at least 1"),
    ({"intervalSeconds": 0}, "intervalSeconds", "must be at least 1"),
    ({"intervalSeconds": -5}, "intervalSeconds", "must be at least 1"),
    ({"failureLimit": -1}, "failureLimit", "must be at least 0"),
    ({"inconclusiveLimit": -1}, "inconclusiveLimit", "must be at least 0"),
    ({"consecutiveErrorLimit": -1}, "consecutiveErrorLimit", "must be at least 0"),
    ({"count": 2, "failureLimit": 2}, "failureLimit", "failureLimit (2) + inconclusiveLimit (0) must be below count (2)"),
    ({"count": 3, "failureLimit": 1, "inconclusiveLimit": 2}, "failureLimit", "set count to 4 or more"),
    ({"emptyResult": "Passed"}, "emptyResult", "must be one of"),
])
def test_bad_analysis_settings_are_refused_at_their_field(query: dict[str, Any], field: str, words: str) -> None:
    _, errors = validate(_manifest(**query))
    path = f"spec.rollout.steps[1].analysis.queries[0].{field}"
    assert [e.path for e in errors] == [path] and words in errors[0].message, [str(e) for e in errors]


def test_the_fixes_the_messages_suggest_are_accepted() -> None:
    _, errors = validate(_manifest(count=3, failureLimit=1, inconclusiveLimit=2))
    assert "set count to 4 or more" in errors[0].message
    assert validate(_manifest(count=4, failureLimit=1, inconclusiveLimit=2))[1] == []
    assert validate(_manifest(count=1000, failureLimit=100, inconclusiveLimit=100))[1] == []  # always reachable


def test_an_analysis_step_needs_a_prometheus_its_own_or_the_operator_s() -> None:
    doc = _manifest()
    del doc["spec"]["rollout"]["steps"][1]["analysis"]["prometheusUrl"]
    _, errors = validate(doc)  # the operator without HISPARSE_PROMETHEUS_URL (the chart's default)
    assert [e.path for e in errors] == ["spec.rollout.steps[1].analysis.prometheusUrl"]
    assert "HISPARSE_PROMETHEUS_URL" in errors[0].message and "rolled back" in errors[0].message
    assert validate(doc, prometheus_url=PROM)[1] == []  # the operator's default is enough
    fixed = copy.deepcopy(doc)
    fixed["spec"]["rollout"]["steps"][1]["analysis"]["prometheusUrl"] = "http://prometheus-operated.monitoring.svc:9090"
    assert validate(fixed)[1] == []  # the message's own example


def test_the_webhook_judges_with_the_operator_s_prometheus(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf

    from hisparse_operator.controller import handlers

    doc = _manifest()
    del doc["spec"]["rollout"]["steps"][1]["analysis"]["prometheusUrl"]
    monkeypatch.setattr(handlers, "_admission_facts", lambda: None)
    monkeypatch.setattr(handlers, "_prometheus_url", None)
    with pytest.raises(kopf.AdmissionError, match=r"steps\[1\]\.analysis\.prometheusUrl"):
        handlers.admit(doc)
    monkeypatch.setattr(handlers, "_prometheus_url", PROM)
    handlers.admit(doc)
