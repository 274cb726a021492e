"""The model cache gate (pure): is the spec's model revision where its serving pods load it, and if not,
why not, in words a user can act on.

Planning is pure, as in LeaderWorkerSet's planner: :func:`gate` reads the download Job and its pods as
observed and returns the ``ModelReady`` verdict; :func:`withheld` says which rendered serving workloads
must wait for a Job that has not completed. The reconciler observes and acts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hisparse_runtime.engine import FETCH_EXIT_CODES

from ..api import HiSparseDeployment, labels as L
from ..render.model import FETCH_BACKOFF_LIMIT, FETCH_CONTAINER, fetch_job_name, node_cache, pods_fetch, retained
from ..render.workloads import VLLM_CONTAINER
from . import conditions as C

POLL_SECONDS = 15.0
"""How soon the reconciler looks again while a download runs or waits for its Secret: pods are not watched,
and the Job's own status does not change when its pod cannot start."""
POLLED_REASONS = frozenset({C.MODEL_DOWNLOADING, C.CREDENTIALS_MISSING})

def _failure_reason(last_words: str | None) -> str:
    """``ModelReady``'s reason for a failed download: the fetcher's own (the first word of its termination
    message: ``CredentialsRefused``, ``ModelNotFound``, ``DownloadFailed``, ``CacheFull``), else
    ``DownloadFailed`` (a pod killed before it could say why)."""
    head = (last_words or "").split(":", 1)[0]
    return head if head in FETCH_EXIT_CODES else C.DOWNLOAD_FAILED


@dataclass(frozen=True)
class ModelGate:
    ready: bool
    reason: str
    message: str


def _condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def job_complete(job: dict[str, Any] | None) -> bool:
    return _condition(job, "Complete") is not None


def _fetch_status(pod: dict[str, Any], container: str = FETCH_CONTAINER) -> dict[str, Any]:
    """The status of ``container``, an app or an init container of ``pod`` ({} when it has none yet)."""
    st = pod.get("status") or {}
    statuses = [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]
    return next((s for s in statuses if s.get("name") == container), {})


def _missing_secret(pod: dict[str, Any], container: str) -> str | None:
    """The kubelet's message when ``container`` cannot start for a missing Secret or key."""
    waiting = (_fetch_status(pod, container).get("state") or {}).get("waiting") or {}
    message = waiting.get("message") or ""
    return message if waiting.get("reason") == "CreateContainerConfigError" and "secret" in message.lower() else None


def _credentials_missing(d: HiSparseDeployment, message: str, what: str) -> ModelGate:
    model = d.spec.model
    secret = model.credentials.secret_name if model.credentials else None
    return ModelGate(False, C.CREDENTIALS_MISSING, f"{what} cannot start: {message}. Create the Secret {secret} in "
                     f"namespace {d.namespace} with the key(s) spec.model.credentials documents; nothing is served "
                     "until it exists")


def _terminated_message(pod: dict[str, Any]) -> str | None:
    s = _fetch_status(pod)
    for state in (s.get("state") or {}, s.get("lastState") or {}):
        t = state.get("terminated")
        if t and t.get("exitCode", 0) != 0:
            return (t.get("message") or t.get("reason") or f"exit code {t.get('exitCode')}").strip().splitlines()[-1]
    return None


def _created(pod: dict[str, Any]) -> str:
    return str(pod.get("metadata", {}).get("creationTimestamp") or "")


def watches_serving_pods(d: HiSparseDeployment) -> bool:
    """Whether ``ModelReady`` reads the serving pods: they fetch the model themselves (``NodeCache``,
    ``PodEphemeral``) or read a Secret to stream it (``s3://``)."""
    model = d.spec.model
    return pods_fetch(d) or (model.scheme == "s3" and bool(model.credentials and model.credentials.secret_name))


def _serving_pods_gate(d: HiSparseDeployment, pods: list[dict[str, Any]]) -> ModelGate:
    model = d.spec.model
    container = FETCH_CONTAINER if pods_fetch(d) else VLLM_CONTAINER
    for pod in sorted(pods, key=_created, reverse=True):
        message = _missing_secret(pod, container)
        if message is not None:
            return _credentials_missing(d, message, f"serving pod {pod['metadata'].get('name')}")
    if not pods_fetch(d):
        return ModelGate(True, C.MODEL_READ_IN_PLACE, f"{model.source} is streamed by vLLM with the Secret's keys")
    what = f"{model.source} at revision {model.revision}"
    for pod in sorted(pods, key=_created, reverse=True):
        last_words = _terminated_message(pod)
        if last_words is not None:
            reason = _failure_reason(last_words)
            return ModelGate(False, reason, f"serving pod {pod['metadata'].get('name')} failed to download {what}: "
                             f"{last_words} (the kubelet retries its init container with backoff)")
    where = (f"their node's cache ({d.spec.model.cache.node_dir})" if node_cache(d) and d.spec.model.cache
             else "their ephemeral volume")
    running = [p for p in pods if "running" in (_fetch_status(p).get("state") or {})]
    if running:
        return ModelGate(False, C.MODEL_DOWNLOADING, f"{len(running)} of {len(pods)} serving pods are downloading {what} "
                         f"into {where} before vLLM starts")
    unless = ", unless its node holds it already," if node_cache(d) else ""
    return ModelGate(True, C.MODEL_FETCHED_BY_PODS, f"each serving pod downloads {what} into {where}{unless} "
                     "(init container fetch-model) before vLLM starts; none is downloading now")


def gate(d: HiSparseDeployment, job: dict[str, Any] | None, pods: list[dict[str, Any]],
         serving_pods: list[dict[str, Any]] | None = None) -> ModelGate:
    """``ModelReady`` of ``d``'s model given its download Job (None: not created yet) and that Job's pods,
    or (see :func:`watches_serving_pods`) its serving pods."""
    model = d.spec.model
    what = f"{model.source} at revision {model.revision}"
    name = fetch_job_name(d)
    if name is None:
        if watches_serving_pods(d):
            return _serving_pods_gate(d, serving_pods or [])
        return ModelGate(True, C.MODEL_READ_IN_PLACE, f"{model.source} is read where it is (no cache to fill)")
    if job_complete(job):
        kept = retained(job)
        pruned = "" if kept is None else f"; it removed every other revision but {' and '.join(kept)}"
        return ModelGate(True, C.MODEL_CACHED, f"{what} is in the model cache (Job {name} completed{pruned})")
    newest = sorted(pods, key=_created)
    failed = _condition(job, "Failed")
    last_words = next((m for m in (_terminated_message(p) for p in reversed(newest)) if m), None)
    if failed is not None:
        reason = _failure_reason(last_words)
        return ModelGate(False, reason, f"the download Job {name} of {what} failed ({failed.get('reason') or 'Failed'}): "
                         f"{last_words or failed.get('message') or 'no message'}. No serving pod of this revision is "
                         "started; fix the cause, then delete the Job to try again")
    for pod in reversed(newest):
        message = _missing_secret(pod, FETCH_CONTAINER)
        if message is not None:
            return _credentials_missing(d, message, f"the download of {what}")
    if job is None:
        return ModelGate(False, C.MODEL_DOWNLOADING, f"creating the download Job {name} for {what}")
    attempts = len(newest)
    retry = f" (attempt {attempts} of {FETCH_BACKOFF_LIMIT + 1}; the last one failed: {last_words})" if last_words and attempts > 1 else ""
    pending = next((p for p in reversed(newest) if (p.get("status") or {}).get("phase") == "Pending"), None)
    if pending is not None:
        unscheduled = next((c for c in (pending.get("status") or {}).get("conditions") or []
                            if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
        if unscheduled is not None:
            return ModelGate(False, C.MODEL_DOWNLOADING, f"the download Job {name} of {what} waits for its pod to be "
                             f"scheduled: {unscheduled.get('message') or unscheduled.get('reason')} (the cache claim "
                             f"needs a ReadWriteMany StorageClass){retry}")
    return ModelGate(False, C.MODEL_DOWNLOADING, f"the download Job {name} is filling the model cache with {what}; "
                     f"serving pods start once it completes{retry}")


def withheld(obj: dict[str, Any], jobs: dict[str, dict[str, Any] | None]) -> bool:
    """A rendered serving workload whose model cache Job (its ``MODEL_FETCH`` annotation) has not completed:
    it is neither created nor changed (an existing one keeps running what it runs)."""
    job = ((obj.get("metadata") or {}).get("annotations") or {}).get(L.MODEL_FETCH)
    return job is not None and not job_complete(jobs.get(job))
