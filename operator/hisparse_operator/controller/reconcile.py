"""One reconcile of a HiSparseDeployment, shaped like LeaderWorkerSet's ``Reconcile``:

get (gone is fine) -> skip if deleting -> observe (children, nodes) -> validate -> render (pure) ->
server-side apply only what differs, under one field manager -> prune what is no longer rendered ->
status (written only when it changed) -> one Event per condition transition.

Nothing of record is kept in memory between reconciles: a restarted operator reaches the same end state.
What the caches in :mod:`.cache` keep is rebuilt from watches or recomputed: the HiSparseDeployment and
its children as last watched (a miss is a GET), and the last validation and render, reused only while
the resource's spec and metadata and the node facts are unchanged (a child's status update, the usual
trigger, needs neither again). Drift is still found on every reconcile: each rendered object is compared
with its live copy.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import json
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hisparse_runtime.engine import kv_compat_hash
from kubernetes.dynamic.exceptions import ConflictError
from pydantic import ValidationError

from .. import names
from ..api import ClusterFacts, HiSparseDeployment, labels as L, role_settings, role_spec, validate
from ..api.status import CanaryStatus
from ..render import Canary, pinned, render_validated, revision
from ..render.model import as_created, fetch_job_name
from ..render.parity import JudgeImage, parity_job, rules as parity_rules
from . import analysis as A
from . import conditions as C
from . import failure as F
from . import metrics
from . import model as M
from . import parity_report as PR
from . import rollout as R
from . import status as S
from .cache import ChildCache, Rendered, RenderCache, fingerprint
from .diff import needs_apply
from .kube import CHILD_KINDS, Kube, now

log = logging.getLogger("hisparse.operator")
_locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)


@dataclass
class Outcome:
    applied: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    withheld: list[str] = field(default_factory=list)
    """Serving workloads not created or changed: their model revision is not cached yet (see ``ModelReady``)."""
    status_written: bool = False
    missing_kinds: list[str] = field(default_factory=list)
    result: str = "noop"
    requeue_after: float | None = None
    """Reconcile again after this many seconds even without an event (a canary's pause or deadline)."""


def child_selector(name: str) -> str:
    return f"{L.DEPLOYMENT}={name},{L.APP_MANAGED_BY}={L.FIELD_MANAGER}"


def reconcile(kube: Kube, namespace: str, name: str, facts: ClusterFacts | None = None,
              cache: ChildCache | None = None, *, deployments: ChildCache | None = None,
              renders: RenderCache | None = None, prometheus_url: str | None = None,
              judge: JudgeImage | None = None, upgrade_canaries: int = 0) -> Outcome:
    """``cache``: watched children; ``deployments``: watched HiSparseDeployments (a miss is a GET);
    ``renders``: the last validation and render per resource (``facts`` must then be a snapshot that is
    never changed in place, see :class:`.cache.NodeFactsCache`); ``judge``: the parity Jobs' pinned image;
    ``upgrade_canaries``: how many upgrade canaries (:func:`_upgrade_slots`) may run at once (0: any)."""
    with _locks[(namespace, name)]:
        start = time.perf_counter()
        try:
            for attempt in range(CONFLICT_ATTEMPTS):
                try:
                    out = _reconcile(kube, namespace, name, facts, cache, deployments, renders, prometheus_url, judge,
                                     upgrade_canaries)
                    break
                except ConflictError:
                    # Decided from a status someone else changed since: read it afresh and decide again.
                    metrics.STATUS_CONFLICTS.inc()
                    if deployments is not None:
                        deployments.drop(L.KIND, namespace, name)
                    if attempt == CONFLICT_ATTEMPTS - 1:
                        raise
            metrics.RECONCILES.labels(result=out.result).inc()
            return out
        except Exception:
            metrics.RECONCILES.labels(result="error").inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - start)


CONFLICT_ATTEMPTS = 3
"""Status writes that meet a newer resourceVersion are decided again from a fresh read this often."""


def _reconcile(kube: Kube, namespace: str, name: str, facts: ClusterFacts | None, cache: ChildCache | None,
               deployments: ChildCache | None, renders: RenderCache | None, prometheus_url: str | None = None,
               judge: JudgeImage | None = None, upgrade_canaries: int = 0) -> Outcome:
    out = Outcome()
    body = deployments.get(L.KIND, namespace, name) if deployments is not None else None
    if body is None:
        body = kube.get(L.API_VERSION, L.KIND, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return out  # ownerReferences let the garbage collector remove the children
    previous = dict(body.get("status") or {})
    manifest = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    # Rendered in the stable fleet the status names: a promoted fleet's render is cached like the first one's.
    r = _validate_and_render(namespace, name, manifest, facts, renders, prometheus_url,
                             fleet=str(previous.get("stableFleet") or name))
    if r.errors or r.deployment is None:
        new_status = S.compute(HiSparseDeployment.model_construct(metadata=_meta(body)), {}, previous,
                               config_errors=[str(e) for e in r.errors], kv_hash=None, now=now())
        _write_status(kube, body, previous, new_status, out, deployments)
        out.result = "invalid"
        return out

    d = r.deployment
    before = previous
    base, desired, decision, kept_revision = _plan_rollout(kube, cache, body, manifest, previous, d, r.desired,
                                                           prometheus_url, judge, deployments, upgrade_canaries)
    if decision.hold is not None:
        # Nothing is applied or pruned: only the condition says what is wrong.
        held = C.set_condition(previous.get("conditions") or [], "Progressing", False, *decision.hold,
                               generation=d.metadata.generation, now=now())
        _write_status(kube, body, previous, {**previous, "conditions": held}, out, deployments)
        out.result = "held"
        return out
    if (decision.canary_status or None) != (previous.get("canary") or None):
        # The rollout's step is recorded before anything is changed for it, against the resourceVersion
        # it was decided from: a conflict (another writer, a stale cache) changes nothing and retries.
        step_status = S.with_rollout(previous, decision, candidate=_running_revision(decision, d),
                                     generation=d.metadata.generation, now=now())
        body = _write_status(kube, body, previous, step_status, out, deployments, events=False)
        previous = dict(body.get("status") or {})
        fleet = (decision.canary_status or {}).get("fleet")
        if fleet and (previous.get("canary") or {}).get("fleet") != fleet:
            # The installed CRD is older than this operator and pruned the field: nothing is applied for a
            # fleet the status cannot name. Read back without it, the rollout runs as the earlier operator
            # ran it (the candidate in <name>-canary, promotion recreating the stable fleet).
            message = (f"the installed CRD does not keep status.canary.fleet (it is older than the operator): revision "
                       f"{decision.canary_status.get('revision')} rolls out as an earlier operator rolled it out, its "  # type: ignore[union-attr]
                       "promotion recreating the stable fleet's pods; upgrade the CRD (helm upgrade) to promote without restarts")
            log.warning("%s/%s: %s", namespace, name, message)
            kube.event(body, "Warning", C.ROLLOUT_HELD, message)
            out.result, out.requeue_after = "changed", 1.0
            return out
    # No status yet: no reconcile got this far for this resource, so a child the cache lacks was never
    # written (or by a reconcile that died before its status write): apply it without a GET first. The
    # apply is idempotent; the GET only spares writes of what is there already.
    first = not previous
    observed: dict[tuple[str, str], dict[str, Any]] = {}
    present: set[tuple[str, str]] = set()
    for obj in desired:
        kind_key = (obj["apiVersion"], obj["kind"])
        if not kube.has_kind(*kind_key):
            out.missing_kinds.append(f"{obj['kind']} ({obj['apiVersion']})")
            continue
        ref = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        # Model cache Jobs come first in ``desired``, so each is observed before the workloads that wait on it.
        if M.withheld(obj, {job: o for (kind, job), o in observed.items() if kind == "Job"}):
            # Not created or changed until its model revision is cached; an existing one keeps serving.
            out.withheld.append(f"{obj['kind']}/{obj['metadata']['name']}")
            present.add((obj["kind"], obj["metadata"]["name"]))
            live = cache.get(*ref) if cache else kube.get(obj["apiVersion"], obj["kind"], ref[1], ref[2])
            if live is not None:
                observed[(obj["kind"], obj["metadata"]["name"])] = live
            continue
        live = cache.get(*ref) if cache else None
        if (live is not None or not first) and needs_apply(as_created(obj, live), live):
            live = kube.get(obj["apiVersion"], obj["kind"], ref[1], ref[2])  # the cache may lag: confirm
        obj = as_created(obj, live)
        if needs_apply(obj, live):
            live = kube.apply(obj)
            out.applied.append(f"{obj['kind']}/{obj['metadata']['name']}")
        if cache is not None and live is not None:
            cache.put(live)
        if live is not None:
            observed[(obj["kind"], obj["metadata"]["name"])] = live
        present.add((obj["kind"], obj["metadata"]["name"]))

    versions = dict((k, v) for v, k in CHILD_KINDS)
    if cache is not None:
        stale = [(kind, child) for kind, _, child in cache.owned_by(namespace, name) if (kind, child) not in present]
    else:
        stale = [(kind, c["metadata"]["name"]) for api_version, kind in CHILD_KINDS if kube.has_kind(api_version, kind)
                 for c in kube.list(api_version, kind, namespace, child_selector(name))
                 if (kind, c["metadata"]["name"]) not in present]
    if ("ConfigMap", PR.name(name)) in stale:
        # The parity report is written, not rendered: it stays until a rollout of another revision starts.
        report = (cache.get("ConfigMap", namespace, PR.name(name)) if cache is not None else None) \
            or kube.get("v1", "ConfigMap", namespace, PR.name(name))
        if report is None or PR.keep(report, decision.canary_status):
            stale.remove(("ConfigMap", PR.name(name)))
    for kind, child in stale:
        kube.delete(versions[kind], kind, namespace, child)
        if cache is not None:
            cache.drop(kind, namespace, child)
        out.pruned.append(f"{kind}/{child}")

    kv_hash = r.kv_hash if base is d else kv_compat_hash(role_settings(base, "decode"))
    serving = _serving_pods(kube, d)
    model_gate = _model_gate(kube, d, observed, serving, fleet=base.name)
    metrics.set_preflight_failures(namespace, name, [r for r in R.ROLES if role_spec(d, r) is not None],  # type: ignore[arg-type]
                                   F.preflight_failures(serving))
    new_status = S.compute(base, observed, previous, config_errors=[], kv_hash=kv_hash, now=now(),
                           settle=not decision.canary, model=model_gate, model_revision=revision(d),
                           base_revision=kept_revision)
    new_status = S.with_rollout(new_status, decision, candidate=_running_revision(decision, d),
                                generation=d.metadata.generation, now=now())
    if f"ConfigMap/{PR.name(name)}" in out.pruned and (new_status.get("parity") or {}).get("report"):
        new_status["parity"] = {k: v for k, v in new_status["parity"].items() if k != "report"}
    out.requeue_after = decision.requeue_after
    if model_gate.reason in M.POLLED_REASONS:
        # Pods are not watched: a download's progress (or a Secret created since) is looked at again soon.
        out.requeue_after = min(out.requeue_after or M.POLL_SECONDS, M.POLL_SECONDS)
    _write_status(kube, body, previous, new_status, out, deployments, events=False)
    if out.status_written:
        _announce(kube, body, before, new_status)
    for type_, reason, message in decision.events:
        kube.event(body, type_, reason, message)
    for missing in out.missing_kinds:
        log.warning("%s/%s: %s is not installed in this cluster; skipped", namespace, name, missing)
    if out.applied or out.pruned or out.status_written:
        out.result = "changed"
    return out


def _keep_report(kube: Kube, lookup: Any, d: HiSparseDeployment, job: str, pods: list[dict[str, Any]],
                 verdict: R.Verdict, *, revision: str, attempt: int) -> None:
    """Copy what the finished parity Job's pod left into the report ConfigMap, once per Job, before the
    verdict is recorded (so ``status.parity.report`` never names a report not yet written)."""
    if PR.written_for(lookup("v1", "ConfigMap", PR.name(d)), job):
        return
    report, source = PR.read_log(kube, d.namespace, pods)
    kube.apply(PR.report_object(d, revision=revision, attempt=attempt, job=job, summary=verdict.summary, report=report,
                                source=source, verdict={"result": verdict.result, "reason": verdict.reason,
                                                        "message": verdict.message}))


def _serving_pods(kube: Kube, d: HiSparseDeployment) -> list[dict[str, Any]]:
    """The prefill and decode pods of both fleets (stable and canary candidate), in one LIST. Pods are not
    watched: this is read once per reconcile (every resync at the latest)."""
    pods = kube.list("v1", "Pod", d.namespace, f"{L.APP_NAME}={L.APP_NAME_VALUE},{L.APP_INSTANCE}={d.name}")
    return [p for p in pods if (p["metadata"].get("labels") or {}).get(L.ROLE) in R.ROLES]


def _model_gate(kube: Kube, d: HiSparseDeployment, observed: dict[tuple[str, str], dict[str, Any]],
                serving: list[dict[str, Any]], *, fleet: str) -> M.ModelGate:
    """``ModelReady`` of the spec's model: its download Job as applied, and that Job's pods while it runs
    (their container states say why a download cannot start or failed); or the stable fleet's serving pods,
    where they fetch the model themselves or read its Secret."""
    name = fetch_job_name(d)
    job = observed.get(("Job", name)) if name else None
    pods = [] if name is None or M.job_complete(job) else kube.list("v1", "Pod", d.namespace, f"{JOB_NAME_LABEL}={name}")
    own = [p for p in serving if (p["metadata"].get("labels") or {}).get(L.DEPLOYMENT) == fleet]
    return M.gate(d, job, pods, own if M.watches_serving_pods(d) else [])


def _plan_rollout(kube: Kube, cache: ChildCache | None, body: dict[str, Any], manifest: dict[str, Any],
                  previous: dict[str, Any], d: HiSparseDeployment, rendered: list[dict[str, Any]],
                  prometheus_url: str | None = None, judge: JudgeImage | None = None,
                  deployments: ChildCache | None = None, upgrade_canaries: int = 0,
                  ) -> tuple[HiSparseDeployment, list[dict[str, Any]], R.Decision, str | None]:
    """(the stable fleet's resource, as named, after this step; every desired object; the rollout's decision;
    the revision the stable fleet keeps when its pods are an earlier operator's rendering, else None).

    Without a canary under way this is the render of the spec in the stable fleet (the cached one while
    that fleet is ``<name>``) plus its revision's snapshot."""
    namespace, name = d.namespace, d.name
    stable_rev, candidate = previous.get("stableRevision"), revision(d)
    stable_fleet = previous.get("stableFleet") or name
    prev = previous.get("canary")
    now_t = dt.datetime.now(dt.timezone.utc)

    def lookup(api_version: str, kind: str, child: str) -> dict[str, Any] | None:
        live = cache.get(kind, namespace, child) if cache is not None else None
        return live if live is not None else kube.get(api_version, kind, namespace, child)

    rendered_fleet = stable_fleet  # the fleet ``rendered`` (the spec's, cached) was rendered in

    def snapshot(rev_d: HiSparseDeployment, rev: str) -> dict[str, Any]:
        # Written once (create-only): one the watch has delivered needs no rendering (a full render) made.
        known = cache is not None and cache.has("ControllerRevision", namespace, names.snapshot(name, rev))
        return R.snapshot(rev_d, rev, rendering=not known)

    def in_stable_fleet(spec_d: HiSparseDeployment, spec_rendered: list[dict[str, Any]] | None = None,
                        ) -> tuple[HiSparseDeployment, list[dict[str, Any]]]:
        fleet_d = spec_d.as_fleet(stable_fleet)
        if spec_rendered is not None and stable_fleet == rendered_fleet:
            return fleet_d, list(spec_rendered)
        return fleet_d, render_validated(spec_d, fleet=stable_fleet)

    hold: tuple[str, str] | None = None
    if prev is not None:
        try:
            CanaryStatus.model_validate(prev)
        except ValidationError as e:
            hold = (C.ROLLOUT_HELD, f"status.canary is unreadable ({e.errors()[0]['msg']}); nothing was changed. "
                    "Remove status.canary (kubectl edit --subresource=status) to let the operator start over.")
            prev = None
    phase = (prev or {}).get("phase")
    running = phase in R.RUNNING or (phase in R.WINDING_DOWN and bool((prev or {}).get("replicas")))
    canary_wanted = bool(stable_rev) and (running or (stable_rev != candidate and d.spec.rollout.strategy == "Canary"))
    cand_fleet = (str((prev or {}).get("fleet") or names.legacy_candidate_fleet(name)) if running
                  else names.fleet(name, candidate, besides=stable_fleet))
    if hold or not canary_wanted:
        decision = R.decide(d, stable=stable_rev, candidate=candidate, has_snapshot=False, previous=prev,
                            observed=R.Observed(), now=now_t, hold=hold, fleet=cand_fleet)
        base, desired = in_stable_fleet(d, rendered)
        return base, desired + ([snapshot(d, candidate)] if candidate in decision.snapshots and not hold else []), decision, None
    assert stable_rev is not None
    stable_d = _from_snapshot(lookup, manifest, d, stable_rev, prometheus_url=prometheus_url)
    kept: list[dict[str, Any]] | None = None
    if stable_d is None:
        # Rendered otherwise by this operator: the stable fleet is kept as its snapshot's operator rendered
        # it, and this operator's rendering of the same spec is a new revision through the gate.
        stable_d, kept, why = _kept_rendering(lookup, manifest, d, stable_rev, stable_fleet, prometheus_url=prometheus_url)
        if why:
            decision = R.decide(d, stable=stable_rev, candidate=candidate, has_snapshot=False, previous=prev,
                                observed=R.Observed(), now=now_t, fleet=cand_fleet, hold=(
                                    C.ROLLOUT_HELD, f"the stable revision {stable_rev} cannot be kept as it runs: {why}; "
                                    "nothing was changed. Set spec.rollout.strategy: Recreate to roll this operator's "
                                    "rendering in place, or run the operator version that wrote it."))
            return d.as_fleet(stable_fleet), [], decision, None
    if stable_d is None:
        # Without the stable revision's spec the stable fleet cannot be rendered: never fall back to the
        # candidate's (that would apply it in place, ungated).
        decision = R.decide(d, stable=stable_rev, candidate=candidate, has_snapshot=False, previous=prev,
                            observed=R.Observed(), now=now_t, fleet=cand_fleet, hold=None if not running else (
                                C.ROLLOUT_HELD, f"the snapshot of the stable revision {stable_rev} (ControllerRevision "
                                f"{names.snapshot(name, stable_rev)}) is missing or no longer renders that revision; "
                                "nothing was changed. Restore it, or set spec.rollout.strategy: Recreate."))
        return d.as_fleet(stable_fleet), [], decision, None
    active = str(prev["revision"]) if running and prev else candidate
    active_d = d if active == candidate else _from_snapshot(lookup, manifest, d, active, exact=True, prometheus_url=prometheus_url)
    if active_d is None:
        decision = R.decide(d, stable=stable_rev, candidate=candidate, has_snapshot=False, previous=prev, observed=R.Observed(),
                            now=now_t, fleet=cand_fleet, hold=(C.ROLLOUT_HELD, f"the running canary's revision {active} has no "
                                                               f"readable snapshot (ControllerRevision {names.snapshot(name, active)}); "
                                                               "nothing was changed"))
        return d.as_fleet(stable_fleet), [], decision, None
    candidate_d = active_d.as_fleet(cand_fleet, candidate=True)
    stable_fleet_d = stable_d.as_fleet(stable_fleet)
    stable_obs = {role: _fleet_obs(kube, namespace, stable_fleet, role, lookup) for role in R.ROLES if role_spec(d, role)}  # type: ignore[arg-type]
    candidate_obs = {role: _fleet_obs(kube, namespace, cand_fleet, role, lookup) for role in stable_obs}
    verdict = unscheduled = None
    if prev and prev.get("readyAt") and phase == "Parity":
        attempt = int(prev.get("attempt") or 1)
        job_name = parity_job(stable_fleet_d, candidate_d, active, attempt=attempt, judge=judge)["metadata"]["name"]
        job = lookup("batch/v1", "Job", job_name)
        finished = job is not None and any(c.get("status") == "True" and c.get("type") in ("Complete", "Failed")
                                           for c in (job.get("status") or {}).get("conditions") or [])
        pods = kube.list("v1", "Pod", namespace, f"{JOB_NAME_LABEL}={job_name}") if job is not None else []
        summary = R.pod_summary(pods) if finished else None
        unscheduled = None if finished else R.unscheduled(pods)
        rules = parity_rules(active_d)
        verdict = R.job_verdict(job, summary, required=rules.prompts, end_to_end=rules.end_to_end,
                                max_near_tie_fraction=rules.max_near_tie_fraction, min_tokens=rules.min_tokens,
                                report=PR.name(name))
        if verdict is not None and job is not None:
            _keep_report(kube, lookup, d, job_name, pods, verdict, revision=active, attempt=attempt)
            verdict = dataclasses.replace(verdict, report=PR.name(name))
    analysis = None
    due = R.analysis_due(d, prev, now_t)
    if due is not None:
        analysis = A.measure(due.analysis, due.queries, prometheus_url, A.fleet(namespace, cand_fleet, active, name),
                             A.fleet(namespace, stable_fleet, stable_rev, name))
    observed = R.Observed(
        stable=stable_obs, candidate=candidate_obs,
        stable_router=_router_ready(d, stable_fleet, lookup), candidate_router=_router_ready(d, cand_fleet, lookup),
        parity=verdict, parity_unscheduled=unscheduled, analysis=analysis,
        action=(body["metadata"].get("annotations") or {}).get(L.ROLLOUT_ACTION),
    )  # fmt: skip
    if kept is None or running:
        decision = R.decide(d, stable=stable_rev, candidate=candidate, has_snapshot=stable_d is not None,
                            previous=prev, observed=observed, now=now_t, fleet=cand_fleet)
    else:
        with _upgrade_lock:
            decision = R.decide(d, stable=stable_rev, candidate=candidate, has_snapshot=stable_d is not None,
                                previous=prev, observed=observed, now=now_t, fleet=cand_fleet,
                                upgrade=_upgrade_slots(deployments, namespace, name, upgrade_canaries))
            if (decision.canary_status or {}).get("upgrade") and decision.canary:
                _upgrade_started[(namespace, name)] = time.monotonic()
    if decision.hold:
        return stable_fleet_d, [], decision, None
    spec_d = active_d if decision.stable_is_candidate else stable_d
    if decision.promoted and (decision.canary_status or {}).get("fleet"):
        # The candidate's fleet is the stable one from now on, as it is (see R.promote).
        stable_fleet = str(decision.canary_status["fleet"])  # type: ignore[index]
    reps = decision.replicas or {}
    stable_base = _with_replicas(spec_d, {r: s for r, (s, _) in reps.items()})
    if decision.canary:
        cand = _with_replicas(active_d, {r: k for r, (_, k) in reps.items()})
        desired = render_validated(stable_base, Canary(cand, decision.weight, decision.run_parity,
                                                       attempt=int((decision.canary_status or {}).get("attempt") or 1),
                                                       serving=decision.serving, judge=judge, fleet=cand_fleet),
                                   fleet=stable_fleet)
        stable_base = stable_base.as_fleet(stable_fleet)
    else:
        stable_base, desired = in_stable_fleet(stable_base, rendered if stable_base is d else None)
    pinned_rev = stable_rev if kept is not None and spec_d is stable_d else None
    if pinned_rev is not None:
        desired = pinned.pin(desired, kept, fleet=stable_fleet, revision=pinned_rev)  # type: ignore[arg-type]
    by_rev = {active: active_d, candidate: d, **({stable_rev: stable_d} if stable_d is not None else {})}
    desired += [snapshot(by_rev[rev], rev) for rev in decision.snapshots if rev in by_rev]
    return stable_base, desired, decision, pinned_rev


_upgrade_lock = threading.Lock()
_upgrade_started: dict[tuple[str, str], float] = {}
"""Upgrade canaries this process started whose status the watch may not have delivered yet, and when."""
UPGRADE_START_SECONDS = 120.0


def _upgrade_slots(deployments: ChildCache | None, namespace: str, name: str, limit: int) -> R.UpgradeSlots:
    """How many more upgrade canaries may start (the caller holds ``_upgrade_lock`` until it has recorded
    the one it starts): ``limit`` less those the watched statuses show under way and those this process
    started in the last ``UPGRADE_START_SECONDS`` (their status may not be watched back yet)."""
    if not limit or deployments is None:
        return R.UpgradeSlots(None, limit)
    busy = set()
    for kind, ns, other in deployments.keys(L.KIND):
        c = ((deployments.get(kind, ns, other) or {}).get("status") or {}).get("canary") or {}
        phase = c.get("phase")
        if c.get("upgrade") and (phase in R.RUNNING or (phase in R.WINDING_DOWN and c.get("replicas"))):
            busy.add((ns, other))
    now_t = time.monotonic()
    for key, started in list(_upgrade_started.items()):
        if key in busy or now_t - started > UPGRADE_START_SECONDS:
            del _upgrade_started[key]
    busy |= set(_upgrade_started)
    busy.discard((namespace, name))
    return R.UpgradeSlots(max(0, limit - len(busy)), limit)


def _running_revision(decision: R.Decision, d: HiSparseDeployment) -> str:
    """The revision the rollout is about (a superseded canary's, until it has wound down)."""
    return str((decision.canary_status or {}).get("revision") or revision(d))


def _with_replicas(d: HiSparseDeployment, replicas: dict[str, int]) -> HiSparseDeployment:
    """``d`` with some roles' replica counts replaced (not a new revision: replicas are not pod-shaping)."""
    if not replicas:
        return d
    update = {}
    for role, n in replicas.items():
        spec = role_spec(d, role)  # type: ignore[arg-type]
        if spec is not None and spec.replicas != n:
            update[role] = spec.model_copy(update={"replicas": n})
    if not update:
        return d
    out = d.model_copy(update={"spec": d.spec.model_copy(update=update)})
    out._owner, out._candidate = d._owner, d._candidate
    return out


def _kept_rendering(lookup: Any, manifest: dict[str, Any], d: HiSparseDeployment, rev: str, fleet: str, *,
                    prometheus_url: str | None = None) -> tuple[HiSparseDeployment | None, list[dict[str, Any]] | None, str]:
    """For a snapshot whose spec this operator renders as another revision: (that spec, with the current
    spec's sections that leave this operator's revision of it unchanged; the pods the snapshot keeps;
    "") when those can stand in for this operator's in fleet ``fleet`` (:func:`..render.pinned.pin`),
    else (None, None, why); (None, None, "") when there is no snapshot to keep."""
    snap = lookup("apps/v1", "ControllerRevision", names.snapshot(d.name, rev))
    kept_spec, kept = R.spec_of(snap), R.rendering_of(snap)
    if kept_spec is None:
        return None, None, ""
    if kept is None:
        return None, None, (f"its snapshot (ControllerRevision {names.snapshot(d.name, rev)}) was written by an operator "
                            "that kept no rendering, and this operator renders its spec as another revision")
    then, errors = validate({**manifest, "spec": kept_spec}, None, prometheus_url=prometheus_url)
    if errors or then is None:
        return None, None, f"its snapshot's spec no longer validates: {'; '.join(map(str, errors))}"
    out, errors = validate({**manifest, "spec": _stable_spec(kept_spec, d, revision(then))}, None, prometheus_url=prometheus_url)
    if errors or out is None:
        out = then
    try:
        pinned.pin(render_validated(out, fleet=fleet), kept, fleet=fleet, revision=rev)
    except pinned.PinError as e:
        return None, None, str(e)
    return out, kept, ""


def _from_snapshot(lookup: Any, manifest: dict[str, Any], d: HiSparseDeployment, rev: str, *,
                   exact: bool = False, prometheus_url: str | None = None) -> HiSparseDeployment | None:
    """The resource as revision ``rev`` (its ControllerRevision), or None when the snapshot is missing,
    no longer validates, or no longer renders ``rev``. Unless ``exact``, sections of the current spec
    that leave the revision unchanged (routing, monitoring, rollout settings, replica counts) are taken
    from the resource, so they reach the stable fleet during a canary too."""
    kept = R.spec_of(lookup("apps/v1", "ControllerRevision", names.snapshot(d.name, rev)))
    if kept is None:
        return None
    spec = kept if exact else _stable_spec(kept, d, rev)
    out, errors = validate({**manifest, "spec": spec}, None, prometheus_url=prometheus_url)
    if errors or out is None:
        log.warning("%s/%s: the snapshot of revision %s no longer validates: %s", d.namespace, d.name, rev,
                    "; ".join(map(str, errors)))
        return None
    if revision(out) != rev:
        # (After an operator upgrade that renders pods otherwise, at every reconcile: the stable fleet is then
        # kept from the snapshot's rendering, or the rollout holds with a condition saying why.)
        log.info("%s/%s: the snapshot of revision %s renders revision %s", d.namespace, d.name, rev, revision(out))
        return None
    return out


_stable_specs: dict[str, dict[str, Any]] = {}


def _stable_spec(kept: dict[str, Any], d: HiSparseDeployment, rev: str) -> dict[str, Any]:
    """The snapshot with every top-level section (and role replica count) of the current spec that does
    not change the revision: derived by trying each, not from a list of fields."""
    now_spec = d.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    key = json.dumps([kept, now_spec, rev], sort_keys=True)
    hit = _stable_specs.get(key)
    if hit is not None:
        return copy.deepcopy(hit)
    out = copy.deepcopy(kept)
    for role in ("prefill", "decode"):
        if isinstance(out.get(role), dict) and isinstance(now_spec.get(role), dict) and "replicas" in now_spec[role]:
            out[role] = {**out[role], "replicas": now_spec[role]["replicas"]}
    for section in sorted(set(now_spec) | set(out)):
        if section in ("prefill", "decode") or now_spec.get(section) == out.get(section):
            continue
        trial = {k: v for k, v in out.items() if k != section}
        if section in now_spec:
            trial[section] = now_spec[section]
        try:
            t = HiSparseDeployment.model_validate({"metadata": d.metadata.model_dump(mode="json"), "spec": trial})
        except ValidationError:
            continue
        if revision(t) == rev:
            out = trial
    if len(_stable_specs) > 64:
        _stable_specs.clear()
    _stable_specs[key] = copy.deepcopy(out)
    return out


def _fleet_obs(kube: Kube, namespace: str, base: str, role: str, lookup: Any) -> R.FleetObs:
    """One role's workload of the fleet named ``base``: its revision, whether its status is current, and
    from its pods (never from stale status) how many replicas of that revision are ready."""
    w = lookup("apps/v1", "Deployment", names.role(base, role)) or lookup(LWS_API, "LeaderWorkerSet", names.role(base, role))
    if w is None:
        return R.FleetObs()
    rev = (w["metadata"].get("labels") or {}).get(L.REVISION)
    st = w.get("status") or {}
    current = (st.get("observedGeneration") or 0) >= (w["metadata"].get("generation") or 0)
    pods = kube.list("v1", "Pod", namespace, f"{L.DEPLOYMENT}={base},{L.APP_COMPONENT}={role}")
    size = int(((w.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size") or 1)
    groups: dict[str, list[bool]] = defaultdict(list)
    for i, p in enumerate(pods):
        labels = p["metadata"].get("labels") or {}
        group = labels.get(LWS_GROUP_INDEX, str(i)) if size > 1 else str(i)
        ok = labels.get(L.REVISION) == rev and not p["metadata"].get("deletionTimestamp") and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or [])
        groups[group].append(ok)
    ready = sum(1 for g in groups.values() if len(g) >= size and all(g))
    want = int((w.get("spec") or {}).get("replicas") or 0)
    failure = F.first_failure([p for p in pods if (p["metadata"].get("labels") or {}).get(L.REVISION) == rev])
    return R.FleetObs(revision=rev, ready=min(ready, want), pods=max(len(groups), int(st.get("replicas") or 0)),
                      current=current, failure=failure)


def _router_ready(d: HiSparseDeployment, base: str, lookup: Any) -> bool:
    if not d.spec.routing.enabled:
        return True
    epp = lookup("apps/v1", "Deployment", names.epp(base))
    return bool(epp and ((epp.get("status") or {}).get("availableReplicas") or 0) >= 1)


JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""The Job controller's label on a Job's pods."""
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"


def _validate_and_render(namespace: str, name: str, manifest: dict[str, Any], facts: ClusterFacts | None,
                         renders: RenderCache | None, prometheus_url: str | None = None, *,
                         fleet: str | None = None) -> Rendered:
    """Validation, render (in the fleet named ``fleet``; None: ``name``) and KV hash of ``manifest``
    against ``facts``: pure, so reused from ``renders`` while the manifest's fingerprint, the fleet and
    the facts snapshot are the same."""
    fleet = None if fleet == name else fleet
    fp = fingerprint(manifest) + (f"\nfleet={fleet}" if fleet else "")
    if renders is not None and (hit := renders.get(namespace, name, fp, facts)) is not None:
        return hit
    d, errors = validate(manifest, facts, prometheus_url=prometheus_url)
    if errors or d is None:
        r = Rendered(fp, facts, None, errors)
    else:
        r = Rendered.of(fp, facts, d, render_validated(d, fleet=fleet), kv_compat_hash(role_settings(d, "decode")))
    if renders is not None:
        renders.put(namespace, name, r)
    return r


def _meta(body: dict[str, Any]) -> Any:
    from ..api import ObjectMeta

    m = body["metadata"]
    return ObjectMeta.model_construct(name=m["name"], namespace=m.get("namespace"), uid=m.get("uid"), generation=m.get("generation"))


def _write_status(kube: Kube, body: dict[str, Any], previous: dict[str, Any], new: dict[str, Any], out: Outcome,
                  deployments: ChildCache | None = None, *, events: bool = True) -> dict[str, Any]:
    """Write ``new`` over ``previous`` (``body``'s status) when it differs, carrying ``body``'s
    resourceVersion (a conflict raises :class:`ConflictError`); returns the resource as stored."""
    meta = body["metadata"]
    # Counters the alerts take increase() of exist at 0 before their first event (also after a restart):
    # a series born at 1 has no earlier sample, so increase() would miss that first failure.
    for verdict in ("passed", "failed"):
        metrics.PARITY_RESULTS.labels(meta["namespace"], meta["name"], verdict)
    for outcome in R.OUTCOMES.values():
        metrics.CANARY_OUTCOMES.labels(meta["namespace"], meta["name"], outcome)
    for role in R.ROLES:
        counts = new.get(role) or {}
        if "replicas" in counts:
            metrics.REPLICAS.labels(meta["namespace"], meta["name"], role, "desired").set(counts["replicas"])
            metrics.REPLICAS.labels(meta["namespace"], meta["name"], role, "ready").set(counts.get("readyReplicas") or 0)
    for c in new.get("conditions") or []:
        metrics.CONDITIONS.labels(meta["namespace"], meta["name"], c["type"], "True").set(1 if c["status"] == "True" else 0)
    canary = new.get("canary") or {}
    running = canary.get("phase") in R.RUNNING
    metrics.CANARY_WEIGHT.labels(meta["namespace"], meta["name"]).set(canary.get("weight", 0) if running else 0)
    if canary.get("phase"):
        for phase in (*R.RUNNING, *R.OUTCOMES):
            metrics.CANARY_PHASE.labels(meta["namespace"], meta["name"], phase).set(1 if phase == canary["phase"] else 0)
    if S.strip_volatile(previous) == S.strip_volatile(new):
        return body
    stored = kube.patch_status(body, new)
    parity = new.get("parity") or {}
    if parity and parity != (previous.get("parity") or {}) and "passed" in parity:
        metrics.PARITY_RESULTS.labels(meta["namespace"], meta["name"], "passed" if parity["passed"] else "failed").inc()
    ended = R.OUTCOMES.get(canary.get("phase", ""))
    if ended and (previous.get("canary") or {}).get("phase") != canary.get("phase"):
        metrics.CANARY_OUTCOMES.labels(meta["namespace"], meta["name"], ended).inc()
    if deployments is not None:
        # The next reconcile may come before the watch delivers this write: it must not compare against
        # the status it replaced (and write and announce the same transitions again).
        deployments.put(stored)
    out.status_written = True
    if events:
        _announce(kube, body, previous, new)
    return stored


def _announce(kube: Kube, body: dict[str, Any], previous: dict[str, Any], new: dict[str, Any]) -> None:
    """One Event per condition that changed status or reason."""
    for c in C.transitions(previous.get("conditions") or [], new.get("conditions") or []):
        healthy = (c["status"] == "True") != (c["type"] in ("Degraded", "Progressing"))
        kube.event(body, "Normal" if healthy else "Warning", c["reason"], f"{c['type']}={c['status']}: {c['message']}")
