"""Canary rollouts: the state machine (pure), the two-fleet render, and whole rollouts driven through the
reconciler against an in-memory apiserver (the real control plane runs them in e2e)."""

from __future__ import annotations

import argparse
import copy
import datetime as dt
from typing import Any

import pytest
import yaml
from hypothesis import given, settings, strategies as st
from prometheus_client import REGISTRY
from opsupport import EXAMPLES
from test_reconcile_caches import NAME, NS, Operator, _set_ready, op  # noqa: F401 (op: a fixture)
from test_reconcile_caches import R as RC

from hisparse_operator import names
from hisparse_operator.api import labels as L, validate
from hisparse_operator.api.status import CanaryStatus
from hisparse_operator.controller import conditions as C
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


# --- the state machine ---------------------------------------------------------------------------


def _step(d: Any, prev: dict[str, Any] | None, now: dt.datetime, **obs: Any) -> R.Decision:
    return R.decide(d, stable="stable0001", candidate=revision(d), has_snapshot=True, previous=prev,
                    observed=R.Observed(**obs), now=now)


def test_the_phases_the_operator_acts_on_are_the_api_model_s() -> None:
    assert set(R.RUNNING) | set(R.OUTCOMES) == set(CanaryStatus.model_fields["phase"].annotation.__args__)


def test_a_whole_canary_parity_then_steps_then_promotion() -> None:
    d = _deployment(image="rt:new", **CANARY)
    s = _step(d, None, T0)
    assert (s.canary, s.weight, s.run_parity, s.canary_status["phase"]) == (True, 0, False, "Parity")
    assert not s.stable_is_candidate and s.requeue_after == 600
    s = _step(d, s.canary_status, T0 + dt.timedelta(seconds=5), candidate_ready=True)
    assert s.run_parity and s.weight == 0  # no traffic before the verdict
    s = _step(d, s.canary_status, T0 + dt.timedelta(seconds=9), candidate_ready=True, parity="passed", parity_message="ok")
    assert (s.canary_status["phase"], s.weight, s.parity_status["passed"]) == ("Shifting", 10, True)
    assert s.requeue_after == 60 and not s.run_parity
    t1 = T0 + dt.timedelta(seconds=9)
    held = _step(d, s.canary_status, t1 + dt.timedelta(seconds=59), candidate_ready=True)
    assert held.weight == 10 and held.requeue_after == 1.0  # the pause is held to the second
    s = _step(d, s.canary_status, t1 + dt.timedelta(seconds=60), candidate_ready=True)
    assert (s.canary_status["step"], s.weight) == (1, 100) and not s.stable_is_candidate
    s = _step(d, s.canary_status, t1 + dt.timedelta(seconds=90), candidate_ready=True)
    assert s.canary_status["phase"] == "Promoting" and s.stable_is_candidate and s.canary and s.weight == 100
    s = _step(d, s.canary_status, t1 + dt.timedelta(seconds=95), candidate_ready=True, stable_ready=True)
    assert s.promoted and not s.canary and s.canary_status["phase"] == "Promoted" and s.snapshots == (revision(d),)


def test_divergent_tokens_roll_back_and_stay_rolled_back_until_the_spec_changes() -> None:
    d = _deployment(image="rt:bad", **CANARY)
    s = _step(d, None, T0)
    s = _step(d, s.canary_status, T0, candidate_ready=True, parity="failed", parity_message="prompt 3 at token 17")
    assert s.canary_status["phase"] == "RolledBack" and not s.canary and not s.stable_is_candidate
    assert s.parity_status["passed"] is False and "token 17" in s.degraded[1] and s.snapshots == ("stable0001",)
    later = _step(d, s.canary_status, T0 + dt.timedelta(days=1), candidate_ready=True, parity="passed")
    assert not later.canary and later.degraded and later.canary_status["phase"] == "RolledBack"
    fixed = _deployment(image="rt:fixed", **CANARY)
    again = _step(fixed, s.canary_status, T0 + dt.timedelta(days=1))
    assert again.canary and again.canary_status["phase"] == "Parity" and not again.degraded


def test_no_verdict_in_time_and_lost_replicas_roll_back() -> None:
    d = _deployment(image="rt:new", **CANARY)
    s = _step(d, None, T0)
    late = _step(d, s.canary_status, T0 + dt.timedelta(seconds=600))
    assert late.canary_status["phase"] == "RolledBack" and "never became ready" in late.canary_status["message"]
    s = _step(d, s.canary_status, T0, candidate_ready=True, parity="passed")
    lost = _step(d, s.canary_status, T0 + dt.timedelta(seconds=1), candidate_ready=False)
    assert lost.canary_status["phase"] == "RolledBack" and lost.weight == 0


def test_in_place_without_a_stable_revision_with_recreate_and_without_its_spec() -> None:
    d = _deployment(image="rt:new", **CANARY)
    first = R.decide(d, stable=None, candidate=revision(d), has_snapshot=False, previous=None,
                     observed=R.Observed(), now=T0)
    lost = R.decide(d, stable="stable0001", candidate=revision(d), has_snapshot=False, previous=None,
                    observed=R.Observed(), now=T0)
    recreate = _deployment(image="rt:new", strategy="Recreate")
    rec = _step(recreate, None, T0)
    assert revision(recreate) == revision(d)  # the strategy does not shape pods
    for s in (first, lost, rec):
        assert not s.canary and s.stable_is_candidate and s.canary_status is None and s.snapshots == (revision(d),)


def test_no_steps_promote_right_after_parity_and_a_disabled_gate_skips_it() -> None:
    d = _deployment(image="rt:new", strategy="Canary", steps=[], parity={"enabled": False})
    s = _step(d, None, T0)
    s = _step(d, s.canary_status, T0, candidate_ready=True)
    assert not s.run_parity and s.canary_status["phase"] == "Promoting" and s.weight == 100


OBS = st.fixed_dictionaries({
    "candidate_ready": st.booleans(), "stable_ready": st.booleans(),
    "parity": st.sampled_from([None, None, "passed", "failed"]),
})  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(OBS, st.integers(0, 400)), min_size=1, max_size=25), st.booleans())
def test_traffic_never_reaches_a_candidate_that_has_not_passed_parity(script: list, gate: bool) -> None:
    """Whatever the cluster shows and however time passes: the candidate gets traffic only after a
    passed verdict (or with the gate off) while ready; a rollback never revives; weights stay 0-100."""
    d = _deployment(image="rt:new", strategy="Canary", steps=[{"weight": 20, "pauseSeconds": 100}, {"weight": 100, "pauseSeconds": 0}],
                    parity={"enabled": gate, "timeoutSeconds": 900})
    prev, now, passed, rolled_back = None, T0, not gate, False
    for obs, seconds in script:
        now += dt.timedelta(seconds=seconds)
        s = _step(d, prev, now, **obs)
        passed = passed or (s.parity_status or {}).get("passed", False)
        assert 0 <= s.weight <= 100
        if s.weight > 0 and s.canary_status["phase"] != "Promoting":
            assert passed and obs["candidate_ready"]
        if rolled_back:
            assert s.canary_status["phase"] == "RolledBack" and not s.canary and s.weight == 0
        rolled_back = s.canary_status is not None and s.canary_status["phase"] == "RolledBack"
        if s.promoted:
            assert obs["stable_ready"]
            break
        prev = s.canary_status


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
    canary = [o for o in both if (o["metadata"]["labels"]).get(L.TRACK) == L.CANARY_SUFFIX]
    stable_objs = [o for o in both if o not in canary]
    # The stable fleet is exactly what it was, but for the route's split.
    assert [o for o in stable_objs if o["kind"] != "HTTPRoute"] == [o for o in alone if o["kind"] != "HTTPRoute"]
    route = next(o for o in both if o["kind"] == "HTTPRoute")
    assert [(b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]] == [
        (names.inference_pool(stable.name), 75), (names.inference_pool(f"{stable.name}-canary"), 25)]
    # Every candidate object: its own name, owned by (and labelled for) the resource, so prune finds it.
    assert not {(o["kind"], o["metadata"]["name"]) for o in canary} & {(o["kind"], o["metadata"]["name"]) for o in alone}
    assert all(o["metadata"]["labels"][L.DEPLOYMENT] == stable.name for o in canary)
    assert all(len(o["metadata"]["name"]) <= 63 for o in both)
    # No selector of one fleet matches a pod of the other (pools, Services, PDBs, monitors, workloads).
    for sel in _selectors(stable_objs):
        assert not any(_matches(sel, pod) for pod in _pod_labels(canary)), sel
    for sel in _selectors(canary):
        assert not any(_matches(sel, pod) for pod in _pod_labels(stable_objs)), sel
    candidate_images = {c["image"] for o in canary for c in _containers(o) if c["name"] in ("vllm", "parity")}
    assert candidate_images == {"ghcr.io/example/hisparse-runtime:candidate"}
    assert {c["image"] for o in stable_objs for c in _containers(o) if c["name"] == "vllm"} == {stable.spec.engine.image}


def _containers(o: dict[str, Any]) -> list[dict[str, Any]]:
    spec = o.get("spec") or {}
    template = spec.get("template") or (spec.get("leaderWorkerTemplate") or {}).get("workerTemplate") or {}
    return (template.get("spec") or {}).get("containers") or []


def test_parity_job_compares_each_revision_through_its_own_prefill_and_is_parsed_by_the_runtime() -> None:
    from hisparse_runtime import parity

    stable = _deployment()
    candidate = _deployment(image="rt:candidate")
    job = next(o for o in render_validated(stable, Canary(candidate, 0, True)) if o["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    parser = argparse.ArgumentParser()
    parity.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(container["args"])
    ns = stable.namespace
    assert (args.stable, args.candidate) == (f"http://glm52-serving.{ns}.svc:8000", f"http://glm52-canary-serving.{ns}.svc:8000")
    assert (args.stable_prefiller, args.candidate_prefiller) == (f"glm52-prefill-nixl.{ns}.svc:8000",
                                                                 f"glm52-canary-prefill-nixl.{ns}.svc:8000")
    assert args.limit == stable.spec.rollout.parity.prompts and args.prompts == "builtin"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == stable.spec.rollout.parity.timeout_seconds
    assert job["metadata"]["labels"][L.REVISION] == revision(candidate)
    # Another parity setting is another Job (a Job's pod cannot change).
    other = _deployment(image="rt:candidate", **{"parity": {"maxTokens": 7}})
    job2 = next(o for o in render_validated(stable, Canary(other, 0, True)) if o["kind"] == "Job")
    assert job2["metadata"]["name"] != job["metadata"]["name"]


# --- whole rollouts through the reconciler ---------------------------------------------------------


def _ready_all(op: Operator, prefix: str) -> None:
    for (kind, _, name), _obj in list(op.kube.objects.items()):
        if kind == "Deployment" and name.startswith(prefix):
            _set_ready(op.kube, kind, name, 1)
    op.watch()


def _new_spec(op: Operator, image: str, generation: int, **rollout: Any) -> None:
    key = (L.KIND, NS, NAME)
    body = copy.deepcopy(op.kube.objects[key])
    body["spec"].setdefault("engine", {})["image"] = image
    body["spec"]["rollout"] = rollout or CANARY
    body["metadata"]["generation"] = generation
    op.kube._store(body)
    op.watch()


def _image(op: Operator, name: str) -> str:
    return op.kube.objects[("Deployment", NS, name)]["spec"]["template"]["spec"]["containers"][0]["image"]


@pytest.fixture
def serving(op: Operator) -> Operator:
    """The example applied and every replica ready: a stable revision serves."""
    op.reconcile()
    op.watch()
    _ready_all(op, NAME)
    op.reconcile()
    op.watch()
    return op


def _outcomes(outcome: str) -> float:
    return REGISTRY.get_sample_value("hisparse_operator_canary_outcomes_total", {"outcome": outcome}) or 0.0


def test_reconciled_canary_promotes_after_parity_and_prunes_the_candidate(serving: Operator) -> None:
    op = serving
    promoted = _outcomes("promoted")
    stable_rev = op.status()["stableRevision"]
    old_image = _image(op, f"{NAME}-decode")
    _new_spec(op, "rt:candidate", 2, strategy="Canary", steps=[{"weight": 50, "pauseSeconds": 0}, {"weight": 100, "pauseSeconds": 0}],
              parity={"timeoutSeconds": 600})
    op.reconcile()
    op.watch()
    assert _image(op, f"{NAME}-decode") == old_image and _image(op, f"{NAME}-canary-decode") == "rt:candidate"
    assert op.status()["canary"]["phase"] == "Parity" and op.status()["canaryRevision"] != stable_rev
    assert ("ControllerRevision", NS, names.snapshot(NAME, stable_rev)) in op.kube.objects
    _ready_all(op, f"{NAME}-canary")
    op.reconcile()
    op.watch()
    job = next(o for (k, _, _), o in op.kube.objects.items() if k == "Job")
    cond = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
    op.kube._store({**job, "status": cond})  # the Job controller's verdict
    op.watch()
    op.reconcile()
    op.watch()
    assert op.status()["canary"]["phase"] == "Shifting" and op.status()["parity"]["passed"] is True
    assert not any(k == "Job" for (k, _, _) in op.kube.objects)  # the gate's Job is pruned once decided
    route_weights = []
    for _ in range(2):  # each step's pause (0 s) is over: 100%, then promoting with the new spec
        op.reconcile()
        op.watch()
        route_weights.append(op.status()["canary"]["weight"])
    assert route_weights == [100, 100]
    assert REGISTRY.get_sample_value("hisparse_operator_canary_weight_percent", {"namespace": NS, "name": NAME}) == 100
    assert op.status()["canary"]["phase"] == "Promoting" and _image(op, f"{NAME}-decode") == "rt:candidate"
    _ready_all(op, NAME)
    for name in (f"{NAME}-prefill", f"{NAME}-decode"):
        w = op.kube.objects[("Deployment", NS, name)]
        assert w["metadata"]["labels"][L.REVISION] == op.status()["canaryRevision"]
    op.reconcile()
    op.watch()
    st = op.status()
    assert st["canary"]["phase"] == "Promoted" and st["stableRevision"] == st["canary"]["revision"]
    assert "canaryRevision" not in st and _outcomes("promoted") == promoted + 1
    assert not [n for (_, _, n) in op.kube.objects if n.startswith(f"{NAME}-canary")]
    assert ("ControllerRevision", NS, names.snapshot(NAME, stable_rev)) not in op.kube.objects
    op.kube.calls.clear()
    op.reconcile()  # settled: nothing to write
    assert not [c for c in op.kube.calls if not c.startswith("get")]


def test_reconciled_canary_rolls_back_on_divergence_and_leaves_the_stable_fleet_alone(serving: Operator) -> None:
    op = serving
    rolled_back = _outcomes("rolled_back")
    before = {k: copy.deepcopy(v["spec"]) for k, v in op.kube.objects.items() if k[0] in ("Deployment", "InferencePool")}
    _new_spec(op, "rt:diverges", 2)
    op.reconcile()
    op.watch()
    _ready_all(op, f"{NAME}-canary")
    op.reconcile()
    op.watch()
    job = next(o for (k, _, _), o in op.kube.objects.items() if k == "Job")
    op.kube._store({**job, "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}})
    summary = ParitySummary(ok=False, prompts=32, diverged=2, errors=0, first_divergence="prompt builtin-0007 at token 41")
    op.kube._store({"apiVersion": "v1", "kind": "Pod", "metadata": {  # what the Job's pod left (a kubelet's part)
        "name": f"{job['metadata']['name']}-x7k2p", "namespace": NS, "labels": {RC.JOB_NAME_LABEL: job["metadata"]["name"]}},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "parity", "state": {"terminated": {
            "exitCode": 1, "message": summary.model_dump_json()}}}]}})
    op.watch()
    op.reconcile()
    op.watch()
    st = op.status()
    assert st["canary"]["phase"] == "RolledBack" and st["parity"]["passed"] is False
    assert (st["parity"]["prompts"], st["parity"]["diverged"]) == (32, 2)
    assert st["parity"]["firstDivergence"] == "prompt builtin-0007 at token 41"
    assert "builtin-0007 at token 41" in st["canary"]["message"]
    op.reconcile()  # still rolled back: counted once
    assert _outcomes("rolled_back") == rolled_back + 1
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == C.CANARY_ROLLED_BACK
    # (The Job's pod goes with the Job, by the garbage collector.)
    assert not [n for (k, _, n) in op.kube.objects if k != "Pod" and (n.startswith(f"{NAME}-canary") or "-parity-" in n)]
    after = {k: v["spec"] for k, v in op.kube.objects.items() if k[0] in ("Deployment", "InferencePool")}
    assert after == before


def _scale_prefill(op: Operator, replicas: int, generation: int, image: str | None = None) -> None:
    key = (L.KIND, NS, NAME)
    body = copy.deepcopy(op.kube.objects[key])
    body["spec"]["prefill"]["replicas"] = replicas
    if image:
        body["spec"].setdefault("engine", {})["image"] = image
        body["spec"]["rollout"] = CANARY
    body["metadata"]["generation"] = generation
    op.kube._store(body)
    op.watch()


def test_scaling_is_no_rollout_and_reaches_the_stable_fleet_during_a_canary(serving: Operator) -> None:
    """The revision's snapshot is written once (its data is immutable): scaling must not rewrite it,
    and the stable fleet keeps following the resource's replica counts while a candidate runs."""
    op = serving
    stable_rev, old_image = op.status()["stableRevision"], _image(op, f"{NAME}-prefill")
    _scale_prefill(op, 2, 2)
    op.reconcile()  # FakeKube refuses a changed ControllerRevision, as the apiserver does
    op.watch()
    assert op.kube.objects[("Deployment", NS, f"{NAME}-prefill")]["spec"]["replicas"] == 2
    assert op.status()["stableRevision"] == stable_rev and "canary" not in op.status()
    _scale_prefill(op, 3, 3, image="rt:candidate")
    op.reconcile()
    op.watch()
    stable = op.kube.objects[("Deployment", NS, f"{NAME}-prefill")]["spec"]
    assert stable["replicas"] == 3 and stable["template"]["spec"]["containers"][0]["image"] == old_image
    assert op.kube.objects[("Deployment", NS, f"{NAME}-canary-prefill")]["spec"]["replicas"] == 3
    assert op.status()["canary"]["phase"] == "Parity"
