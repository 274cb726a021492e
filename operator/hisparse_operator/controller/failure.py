"""Definite failures of a pod, read from the status the kubelet and the scheduler write (pure).

A canary candidate that cannot pull its image, crash-loops or cannot be placed would otherwise wait out
``rollout.readyTimeoutSeconds`` (an hour and more, sized for model loading) before it is rolled back.
These are the states that no amount of waiting mends on its own; a pod that runs and is simply not
ready yet (a model still loading, CUDA graphs being captured) is none of them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from hisparse_runtime.engine import PREFLIGHT_CHECK_OF_EXIT_CODE

from ..api import labels as L
from ..render.workloads import VLLM_CONTAINER

FAILING_WAITING_REASONS: Final = frozenset({
    "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
    "CreateContainerError",
})
"""``state.waiting.reason`` values of a container that cannot start (the kubelet's own reasons; the
ordinary ``ContainerCreating`` and ``PodInitializing`` are not among them)."""

FAILED_EXITS: Final = 3
"""A container (init containers included) that has ended with a non-zero exit code this many times, and
is not ready now, is failing even while it happens to be running between two crashes."""

MESSAGE_CHARS: Final = 512


@dataclass(frozen=True)
class PodFailure:
    """The evidence of one failing pod: what a user needs to see to fix it."""

    pod: str
    container: str | None
    """None: the pod as a whole (it cannot be scheduled)."""
    reason: str
    message: str

    def describe(self) -> str:
        where = f"pod {self.pod}" + (f", container {self.container}" if self.container else "")
        return f"{where}: {self.reason}" + (f": {self.message}" if self.message else "")


def _exits(c: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """(times the container ended, its latest termination) when that termination was a non-zero exit."""
    state, last = c.get("state") or {}, c.get("lastState") or {}
    now_t, last_t = state.get("terminated"), last.get("terminated")
    latest = now_t or last_t
    if not latest or int(latest.get("exitCode") or 0) == 0:
        return None
    return int(c.get("restartCount") or 0) + (1 if now_t else 0), latest


def container_failure(pod_name: str, c: dict[str, Any]) -> PodFailure | None:
    waiting = (c.get("state") or {}).get("waiting") or {}
    reason = waiting.get("reason")
    if reason in FAILING_WAITING_REASONS:
        return PodFailure(pod_name, c.get("name"), str(reason), _clip(waiting.get("message") or ""))
    exits = _exits(c)
    if exits is not None and exits[0] >= FAILED_EXITS and not c.get("ready"):
        n, t = exits
        said = (t.get("message") or "").strip()
        text = f"exit code {t.get('exitCode')} ({t.get('reason') or 'Error'}), {n} times" + (f": {said}" if said else "")
        return PodFailure(pod_name, c.get("name"), "RepeatedExits", _clip(text))
    return None


def pod_failure(pod: dict[str, Any]) -> PodFailure | None:
    """The first definite failure of ``pod`` (None: none; a pod being deleted never has one)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return None
    name = str(meta.get("name") or "")
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return PodFailure(name, None, "Unschedulable", _clip(c.get("message") or ""))
    for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        found = container_failure(name, c)
        if found is not None:
            return found
    return None


def first_failure(pods: list[dict[str, Any]]) -> PodFailure | None:
    """The first failing pod of ``pods``, oldest first (so the same pod is named while it fails)."""
    for pod in sorted(pods, key=lambda p: (str((p.get("metadata") or {}).get("creationTimestamp") or ""),
                                           str((p.get("metadata") or {}).get("name") or ""))):
        found = pod_failure(pod)
        if found is not None:
            return found
    return None


def preflight_failures(pods: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """``(role, check) -> pods`` whose vLLM container is not ready and last ended with that preflight
    check's exit code (``hisparse-runtime serve`` exits before vLLM starts, so nothing in the pod reports it;
    the kubelet keeps the exit code in the container's state). Pods being deleted do not count."""
    out: Counter[tuple[str, str]] = Counter()
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        role = str((meta.get("labels") or {}).get(L.ROLE) or "")
        for c in (pod.get("status") or {}).get("containerStatuses") or []:
            if c.get("name") != VLLM_CONTAINER or c.get("ready"):
                continue
            state, last = c.get("state") or {}, c.get("lastState") or {}
            ended = state.get("terminated") or last.get("terminated")
            check = PREFLIGHT_CHECK_OF_EXIT_CODE.get(int((ended or {}).get("exitCode") or 0))
            if check is not None:
                out[(role, check)] += 1
    return dict(out)


def _clip(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."
