"""A canary's token-parity gate: the Job that runs ``hisparse-runtime parity`` (in the candidate's image)
against the stable and the candidate revision, each through its decode sidecar with a prefill pod of its
own revision (prefill -> NIXL -> decode); and the ClusterIP Service it reaches each revision by."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from hisparse_runtime.engine import SERVICE_PORT
from hisparse_runtime.engine import parity as P

from .. import names
from ..api import HiSparseDeployment, labels as L, role_settings
from .common import RESTRICTED_CONTAINER, meta, obj, selector_labels, support_placement
from .workloads import component, has_sidecar

PROMPTS_DIR: Final = "/parity"
SUMMARY_PATH: Final = "/dev/termination-log"
"""The run's summary becomes the pod's termination message: the operator reads it into
``status.parity``, and ``kubectl describe`` shows it (the full report is in the pod's log)."""


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


def parity_job(stable: HiSparseDeployment, candidate: HiSparseDeployment, revision: str, *, attempt: int = 1) -> dict[str, Any]:
    """``candidate`` is the candidate as rendered beside the stable one (:meth:`HiSparseDeployment.canary`);
    ``attempt``: the rollout's attempt at ``revision`` (a retry runs a new Job)."""
    p = candidate.spec.rollout.parity
    prompts = f"{PROMPTS_DIR}/{P.PROMPTS_FILE}" if p.prompts_config_map else P.BUILTIN_PROMPTS
    argv = P.parity_argv(
        _url(stable), _url(candidate), prompts=prompts, limit=p.prompts, max_tokens=p.max_tokens,
        stable_prefiller=_prefiller(stable), candidate_prefiller=_prefiller(candidate), summary=SUMMARY_PATH,
        top_logprobs=p.top_logprobs, near_tie_epsilon=p.near_tie_epsilon, concurrency=p.concurrency,
    )  # fmt: skip
    container: dict[str, Any] = {
        "name": "parity",
        "image": candidate.spec.engine.image,
        "imagePullPolicy": candidate.spec.engine.image_pull_policy,
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
    return obj("batch/v1", "Job", meta(candidate, names.parity_job(stable.name, digest), "parity", extra_labels=labels), spec={
        # One attempt: a divergence is an answer, not a failure to retry. The deadline is the gate's.
        "backoffLimit": 0,
        "activeDeadlineSeconds": p.timeout_seconds,
        # The verdict is read from the finished Job and its pod: keep both until the operator prunes them.
        "template": {"metadata": {"labels": {**selector_labels(candidate, "parity")}}, "spec": pod},
    })
