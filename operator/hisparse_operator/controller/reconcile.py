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

import datetime as dt
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hisparse_runtime.engine import kv_compat_hash

from .. import names
from ..api import ClusterFacts, HiSparseDeployment, labels as L, role_settings, validate
from ..render import Canary, render_validated, revision
from ..render.parity import parity_job
from . import conditions as C
from . import metrics
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
    status_written: bool = False
    missing_kinds: list[str] = field(default_factory=list)
    result: str = "noop"
    requeue_after: float | None = None
    """Reconcile again after this many seconds even without an event (a canary's pause or deadline)."""


def child_selector(name: str) -> str:
    return f"{L.DEPLOYMENT}={name},{L.APP_MANAGED_BY}={L.FIELD_MANAGER}"


def reconcile(kube: Kube, namespace: str, name: str, facts: ClusterFacts | None = None,
              cache: ChildCache | None = None, *, deployments: ChildCache | None = None,
              renders: RenderCache | None = None) -> Outcome:
    """``cache``: watched children; ``deployments``: watched HiSparseDeployments (a miss is a GET);
    ``renders``: the last validation and render per resource (``facts`` must then be a snapshot that is
    never changed in place, see :class:`.cache.NodeFactsCache`)."""
    with _locks[(namespace, name)]:
        start = time.perf_counter()
        try:
            out = _reconcile(kube, namespace, name, facts, cache, deployments, renders)
            metrics.RECONCILES.labels(result=out.result).inc()
            return out
        except Exception:
            metrics.RECONCILES.labels(result="error").inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - start)


def _reconcile(kube: Kube, namespace: str, name: str, facts: ClusterFacts | None, cache: ChildCache | None,
               deployments: ChildCache | None, renders: RenderCache | None) -> Outcome:
    out = Outcome()
    body = deployments.get(L.KIND, namespace, name) if deployments is not None else None
    if body is None:
        body = kube.get(L.API_VERSION, L.KIND, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return out  # ownerReferences let the garbage collector remove the children
    previous = dict(body.get("status") or {})
    manifest = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    r = _validate_and_render(namespace, name, manifest, facts, renders)
    if r.errors or r.deployment is None:
        new_status = S.compute(HiSparseDeployment.model_construct(metadata=_meta(body)), {}, previous,
                               config_errors=[str(e) for e in r.errors], kv_hash=None, now=now())
        _write_status(kube, body, previous, new_status, out, deployments)
        out.result = "invalid"
        return out

    d = r.deployment
    base, desired, decision = _plan_rollout(kube, cache, body, manifest, previous, d, r.desired)
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
        live = cache.get(*ref) if cache else None
        if (live is not None or not first) and needs_apply(obj, live):
            live = kube.get(obj["apiVersion"], obj["kind"], ref[1], ref[2])  # the cache may lag: confirm
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
    for kind, child in stale:
        kube.delete(versions[kind], kind, namespace, child)
        if cache is not None:
            cache.drop(kind, namespace, child)
        out.pruned.append(f"{kind}/{child}")

    kv_hash = r.kv_hash if base is d else kv_compat_hash(role_settings(base, "decode"))
    new_status = S.compute(base, observed, previous, config_errors=[], kv_hash=kv_hash, now=now())
    new_status = S.with_rollout(new_status, decision, candidate=revision(d), generation=d.metadata.generation, now=now())
    out.requeue_after = decision.requeue_after
    _write_status(kube, body, previous, new_status, out, deployments)
    for missing in out.missing_kinds:
        log.warning("%s/%s: %s is not installed in this cluster; skipped", namespace, name, missing)
    if out.applied or out.pruned or out.status_written:
        out.result = "changed"
    return out


def _plan_rollout(kube: Kube, cache: ChildCache | None, body: dict[str, Any], manifest: dict[str, Any],
                  previous: dict[str, Any], d: HiSparseDeployment, rendered: list[dict[str, Any]],
                  ) -> tuple[HiSparseDeployment, list[dict[str, Any]], R.Decision]:
    """(the resource the stable fleet is rendered from, every desired object, the rollout's decision).

    Without a canary under way this is the cached render of the spec plus its revision's snapshot."""
    namespace, name = d.namespace, d.name
    stable_rev, candidate = previous.get("stableRevision"), revision(d)
    stable_d: HiSparseDeployment | None = None
    observed = R.Observed()
    if stable_rev and stable_rev != candidate and d.spec.rollout.strategy == "Canary":
        def lookup(api_version: str, kind: str, child: str) -> dict[str, Any] | None:
            live = cache.get(kind, namespace, child) if cache is not None else None
            return live if live is not None else kube.get(api_version, kind, namespace, child)

        spec = R.spec_of(lookup("apps/v1", "ControllerRevision", names.snapshot(name, stable_rev)))
        if spec is not None:
            stable_d, errors = validate({**manifest, "spec": R.stable_spec(spec, d)}, None)
            if errors:
                log.warning("%s/%s: the stable revision %s no longer validates (%s); rolling out in place",
                            namespace, name, stable_rev, "; ".join(map(str, errors)))
                stable_d = None
        candidate_d = d.canary()
        job = None if stable_d is None else parity_job(stable_d, candidate_d, candidate)["metadata"]["name"]
        verdict, message = R.job_verdict(lookup("batch/v1", "Job", job)) if job else (None, "")
        summary = R.pod_summary(kube.list("v1", "Pod", namespace, f"{JOB_NAME_LABEL}={job}")) if verdict else None
        observed = R.Observed(
            candidate_ready=S.fleet_ready(candidate_d, candidate, lambda kind, n: lookup(_API[kind], kind, n)),
            parity=verdict, parity_message=message, parity_summary=summary,
            stable_ready=S.fleet_ready(d, candidate, lambda kind, n: lookup(_API[kind], kind, n)),
        )  # fmt: skip
    decision = R.decide(d, stable=stable_rev, candidate=candidate, has_snapshot=stable_d is not None,
                        previous=previous.get("canary"), observed=observed,
                        now=dt.datetime.now(dt.timezone.utc))
    base = d if decision.stable_is_candidate or stable_d is None else stable_d
    if decision.canary:
        desired = render_validated(base, Canary(d, decision.weight, decision.run_parity))
    elif base is not d:
        desired = render_validated(base)
    else:
        desired = list(rendered)
    by_rev = {candidate: d, **({stable_rev: stable_d} if stable_d is not None and stable_rev else {})}
    desired += [R.snapshot(by_rev[rev], rev) for rev in decision.snapshots if rev in by_rev]
    return base, desired, decision


_API: dict[str, str] = {kind: api_version for api_version, kind in CHILD_KINDS}
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""The Job controller's label on a Job's pods."""


def _validate_and_render(namespace: str, name: str, manifest: dict[str, Any], facts: ClusterFacts | None,
                         renders: RenderCache | None) -> Rendered:
    """Validation, render and KV hash of ``manifest`` against ``facts``: pure, so reused from
    ``renders`` while the manifest's fingerprint and the facts snapshot are the same."""
    fp = fingerprint(manifest)
    if renders is not None and (hit := renders.get(namespace, name, fp, facts)) is not None:
        return hit
    d, errors = validate(manifest, facts)
    if errors or d is None:
        r = Rendered(fp, facts, None, errors)
    else:
        r = Rendered.of(fp, facts, d, render_validated(d), kv_compat_hash(role_settings(d, "decode")))
    if renders is not None:
        renders.put(namespace, name, r)
    return r


def _meta(body: dict[str, Any]) -> Any:
    from ..api import ObjectMeta

    m = body["metadata"]
    return ObjectMeta.model_construct(name=m["name"], namespace=m.get("namespace"), uid=m.get("uid"), generation=m.get("generation"))


def _write_status(kube: Kube, body: dict[str, Any], previous: dict[str, Any], new: dict[str, Any], out: Outcome,
                  deployments: ChildCache | None = None) -> None:
    meta = body["metadata"]
    for c in new.get("conditions") or []:
        metrics.CONDITIONS.labels(meta["namespace"], meta["name"], c["type"], "True").set(1 if c["status"] == "True" else 0)
    canary = new.get("canary") or {}
    running = canary.get("phase") in R.RUNNING
    metrics.CANARY_WEIGHT.labels(meta["namespace"], meta["name"]).set(canary.get("weight", 0) if running else 0)
    if canary.get("phase"):
        for phase in (*R.RUNNING, *R.OUTCOMES):
            metrics.CANARY_PHASE.labels(meta["namespace"], meta["name"], phase).set(1 if phase == canary["phase"] else 0)
    if S.strip_volatile(previous) == S.strip_volatile(new):
        return
    stored = kube.patch_status(body, new)
    parity = new.get("parity") or {}
    if parity and parity != (previous.get("parity") or {}) and "passed" in parity:
        metrics.PARITY_RESULTS.labels(meta["namespace"], meta["name"], "passed" if parity["passed"] else "failed").inc()
    ended = R.OUTCOMES.get(canary.get("phase", ""))
    if ended and (previous.get("canary") or {}).get("phase") != canary.get("phase"):
        metrics.CANARY_OUTCOMES.labels(outcome=ended).inc()
    if deployments is not None:
        # The next reconcile may come before the watch delivers this write: it must not compare against
        # the status it replaced (and write and announce the same transitions again).
        deployments.put(stored)
    out.status_written = True
    for c in C.transitions(previous.get("conditions") or [], new.get("conditions") or []):
        healthy = (c["status"] == "True") != (c["type"] in ("Degraded", "Progressing"))
        kube.event(body, "Normal" if healthy else "Warning", c["reason"], f"{c['type']}={c['status']}: {c['message']}")
