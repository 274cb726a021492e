"""A canary's token-parity gate: the Job that runs ``hisparse-runtime parity`` against the stable and the
candidate revision, each through its decode sidecar with a prefill pod of its own revision (prefill ->
NIXL -> decode); and the ClusterIP Service it reaches each revision by.

The judge is not the defendant: the Job runs from the *stable* revision's runtime image (its engine image
and pull policy), or from one the operator pins (``HISPARSE_PARITY_IMAGE``, the chart's
``parity.image``), never from the candidate's. A candidate whose build breaks the comparison code (or
replaces it with one that always reports a match) is still judged by code that was already trusted."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final

from hisparse_runtime.engine import SERVICE_PORT
from hisparse_runtime.engine import parity as P

from .. import names
from ..api import HiSparseDeployment, labels as L, role_settings
from .common import RESTRICTED_CONTAINER, meta, obj, selector_labels, support_placement
from .workloads import component, has_sidecar

@dataclass(frozen=True)
class JudgeImage:
    """An image the operator pins for every parity Job (it must hold a ``hisparse-runtime`` that knows
    the flags this operator renders)."""

    image: str
    pull_policy: str = "IfNotPresent"


def judge_image(stable: HiSparseDeployment, pinned: JudgeImage | None = None) -> tuple[str, str]:
    """(image, pull policy) the parity Job runs: the pinned one, else the stable revision's."""
    if pinned is not None:
        return pinned.image, pinned.pull_policy
    return stable.spec.engine.image, stable.spec.engine.image_pull_policy


def rules(d: HiSparseDeployment) -> P.ParityRules:
    """What a summary must show to pass, from ``spec.rollout.parity`` (the Job's flags and the operator's
    verdict both use it, so the Job's own exit code agrees with the verdict)."""
    p = d.spec.rollout.parity
    return P.ParityRules(prompts=p.prompts, end_to_end=d.spec.prefill is not None,
                         max_near_tie_fraction=p.max_near_tie_fraction,
                         min_tokens=p.min_tokens if p.min_tokens is not None else P.default_min_tokens(p.prompts, p.max_tokens))


PROMPTS_DIR: Final = "/parity"
SUMMARY_PATH: Final = "/dev/termination-log"
"""The run's summary becomes the pod's termination message: the operator reads it into
``status.parity``; the full report the run prints (the pod's log) the operator keeps in a ConfigMap."""


def serving_service(d: HiSparseDeployment) -> dict[str, Any]:
    """Requests enter at decode: its llm-d sidecar when it has one (which prefills on the prefiller a
    request names), else vLLM itself."""
    s = role_settings(d, "decode")
    target = SERVICE_PORT if has_sidecar(d, s) else s.vllm_port
    return obj("v1", "Service", meta(d, names.serving(d.name), component("decode")), spec={
        "selector": selector_labels(d, component("decode")),
        "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": target, "protocol": "TCP"}],
    })


def _url(d: HiSparseDeployment) -> str:
    return f"http://{names.service_host(names.serving(d.name), d.namespace)}:{SERVICE_PORT}"


def _prefiller(d: HiSparseDeployment) -> str | None:
    s = role_settings(d, "decode")
    return f"{s.peer_host}:{SERVICE_PORT}" if has_sidecar(d, s) and s.peer_host else None


def parity_job(stable: HiSparseDeployment, candidate: HiSparseDeployment, revision: str, *, attempt: int = 1,
               judge: JudgeImage | None = None) -> dict[str, Any]:
    """``stable`` and ``candidate`` are the two fleets as rendered (:meth:`HiSparseDeployment.as_fleet`);
    ``attempt``: the rollout's attempt at ``revision`` (a retry runs a new Job); ``judge``: the image the
    operator pins (None: the stable revision's)."""
    p = candidate.spec.rollout.parity
    r = rules(candidate)
    image, pull_policy = judge_image(stable, judge)
    prompts = f"{PROMPTS_DIR}/{P.PROMPTS_FILE}" if p.prompts_config_map else P.BUILTIN_PROMPTS
    argv = P.parity_argv(
        _url(stable), _url(candidate), prompts=prompts, limit=p.prompts, max_tokens=p.max_tokens,
        stable_prefiller=_prefiller(stable), candidate_prefiller=_prefiller(candidate), summary=SUMMARY_PATH,
        top_logprobs=p.top_logprobs, near_tie_epsilon=p.near_tie_epsilon, concurrency=p.concurrency,
        max_near_tie_fraction=r.max_near_tie_fraction, min_tokens=r.min_tokens,
    )  # fmt: skip
    container: dict[str, Any] = {
        "name": "parity",
        # Never the candidate's image: its code does not get to judge itself.
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": argv[:1],
        "args": argv[1:],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": RESTRICTED_CONTAINER,
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        **support_placement(candidate),
    }
    if p.prompts_config_map:
        container["volumeMounts"] = [{"name": "prompts", "mountPath": PROMPTS_DIR, "readOnly": True}]
        pod["volumes"] = [{"name": "prompts", "configMap": {"name": p.prompts_config_map}}]
    # A Job's template cannot change: the name carries a hash of the pod, so new parity settings (or a
    # new candidate) make a new Job and the old one is pruned.
    digest = hashlib.sha256(json.dumps({"pod": pod, "revision": revision, "attempt": attempt},
                                       sort_keys=True).encode()).hexdigest()[:10]
    labels = {L.REVISION: revision}
    return obj("batch/v1", "Job", meta(candidate, names.parity_job(stable.owner_name, digest), "parity", extra_labels=labels), spec={
        # One attempt: a divergence is an answer, not a failure to retry. The deadline is the gate's.
        "backoffLimit": 0,
        "activeDeadlineSeconds": p.timeout_seconds,
        # The verdict is read from the finished Job and its pod: keep both until the operator prunes them.
        # The instance label lets every fleet's NetworkPolicy admit the Job's pod whatever fleet it runs for.
        "template": {"metadata": {"labels": {**selector_labels(candidate, "parity"), L.APP_INSTANCE: candidate.owner_name}},
                     "spec": pod},
    })
