"""Model artifacts of an ``hf://`` source: the cache the serving pods load from, the download that fills
it, and the credentials it reads.

``SharedVolume`` (the default): one ReadWriteMany PersistentVolumeClaim per deployment and one download
Job per model revision (``hisparse-runtime fetch-model``), which writes the snapshot into
``/model-cache/hf/<org>/<name>/<revision>`` and a completion marker last. Each serving workload carries
the Job's name in an annotation; the reconciler creates (or changes) a workload only once that Job has
completed, and reports the download in the ``ModelReady`` condition. Serving pods mount the claim
read-only: vLLM loads a local directory and never reaches the hub.

``NodeCache``: the same fetcher runs as the first init container of every serving pod, into the node's
directory (``cache.nodePath``, a ``hostPath``) under ``<namespace>/<name>``, and fetches nothing when that
node holds the revision already; vLLM mounts only that subdirectory, read-only.

``PodEphemeral`` (earlier ``NodeLocal``): the same init container, into an emptyDir sized from
``model.sizeGiB`` that the pod requests as ``ephemeral-storage``.

``s3://`` sources stay streamed by vLLM's run:ai streamer (straight into GPU memory, no disk copy); they
get their credentials here too. ``pvc://`` sources are mounted as they are (``render/workloads.py``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from hisparse_runtime.engine import (
    FETCH_EXIT_CODES,
    FETCH_NO_RETRY,
    FETCH_SUBCOMMAND,
    MODEL_CACHE_PATH,
    POD_FETCH_MODES,
    SECRET_KEYS,
    ModelSettings,
)
from hisparse_runtime.engine.parity import RUNTIME_COMMAND
from hisparse_runtime.engine.versions import RUNTIME_UID

from .. import names
from ..api import HiSparseDeployment, labels as L
from ..api.kube import parse_quantity
from .common import RESTRICTED_CONTAINER, meta, obj, support_placement

CACHE_VOLUME: Final = "model-cache"
FETCH_CONTAINER: Final = "fetch-model"
FETCH_COMPONENT: Final = "model-fetch"
FETCH_TMP: Final = "/tmp"
FETCH_BACKOFF_LIMIT: Final = 3
"""Download attempts (pods) before the Job fails and ``ModelReady`` says ``DownloadFailed``; each attempt
resumes from the files already in the cache."""
OPTIONAL_SECRET_KEYS: Final[dict[str, tuple[str, ...]]] = {"s3": ("AWS_SESSION_TOKEN",)}
"""Keys read when the Secret has them (temporary S3 credentials)."""


def credential_env(model: ModelSettings) -> list[dict[str, Any]]:
    """Environment of the container that reads the source: each key of ``credentials.secretName`` by
    reference (the value never enters a manifest). A missing Secret or required key keeps the container
    from starting with ``CreateContainerConfigError``, which the reconciler reports as
    ``CredentialsMissing``."""
    secret = model.credentials.secret_name if model.credentials else None
    if not secret:
        return []
    out = [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
           for key in SECRET_KEYS.get(model.scheme, ())]
    out += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
            for key in OPTIONAL_SECRET_KEYS.get(model.scheme, ())]
    return out


def service_account(model: ModelSettings) -> str | None:
    return model.credentials.service_account_name if model.credentials else None


def fetch_argv(model: ModelSettings, under: str = "") -> list[str]:
    """The download's argv; ``under``: the deployment's subdirectory of a node cache."""
    assert model.cache_dir is not None and model.revision is not None
    return [RUNTIME_COMMAND, FETCH_SUBCOMMAND, "--source", model.source, "--revision", model.revision,
            "--dest", _under(model.cache_dir, under)]


def _under(path: str, sub: str) -> str:
    """``path`` (below the cache's mount) as the fetcher sees it when vLLM mounts only ``sub`` of the volume."""
    return path if not sub else f"{MODEL_CACHE_PATH}/{sub}{path.removeprefix(MODEL_CACHE_PATH)}"


def node_subdir(d: HiSparseDeployment) -> str:
    """The deployment's own directory in a node cache: deployments sharing a node path never share files."""
    return f"{d.namespace}/{d.owner_name}"


PRUNE_FLAG: Final = "--prune-under"
KEEP_FLAG: Final = "--keep"


def with_retention(job: dict[str, Any], keep: list[str]) -> dict[str, Any]:
    """``job`` (a download Job) also removing every other revision of the shared cache once it has filled its
    own, but ``keep``'s (the stable fleet's): the claim is sized for two revisions. Not part of the Job's name,
    which a candidate with the stable's model shares: a Job is created once and never changed."""
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return _with_args(job, [*args, PRUNE_FLAG, MODEL_CACHE_PATH, *(a for k in keep for a in (KEEP_FLAG, k))])


def _with_args(job: dict[str, Any], args: list[str]) -> dict[str, Any]:
    """``job`` (a copy) whose container runs with ``args``."""
    container = {**job["spec"]["template"]["spec"]["containers"][0], "args": args}
    spec = {**job["spec"]["template"]["spec"], "containers": [container]}
    return {**job, "spec": {**job["spec"], "template": {**job["spec"]["template"], "spec": spec}}}


def as_created(job: dict[str, Any], live: dict[str, Any] | None) -> dict[str, Any]:
    """A rendered download Job with the retention its live Job was created with: the fleet that created it
    decided that (a promoted candidate's Job is rendered again by the stable fleet, without it), and a Job's
    template cannot change. Any other object, or a Job not created yet, is returned as it is."""
    if live is None or job.get("kind") != "Job" or retained(job) == retained(live):
        return job
    live_args = live["spec"]["template"]["spec"]["containers"][0].get("args") or []
    own = job["spec"]["template"]["spec"]["containers"][0]["args"]
    base = own[:own.index(PRUNE_FLAG)] if PRUNE_FLAG in own else own
    return _with_args(job, [*base, *(live_args[live_args.index(PRUNE_FLAG):] if PRUNE_FLAG in live_args else [])])


def retained(job: dict[str, Any] | None) -> list[str] | None:
    """The revision directories a download Job keeps when it prunes (its own first), None when it does not."""
    containers = (((job or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    args = list(containers[0].get("args") or []) if containers else []
    if PRUNE_FLAG not in args:
        return None
    own = args[args.index("--dest") + 1] if "--dest" in args else None
    return [a for a in [own] if a] + [args[i + 1] for i, a in enumerate(args[:-1]) if a == KEEP_FLAG]


def fetch_container(d: HiSparseDeployment) -> dict[str, Any]:
    """The download, as the Job's container (``SharedVolume``) or a serving pod's init container
    (``NodeCache``, ``PodEphemeral``)."""
    model = d.spec.model
    argv = fetch_argv(model, node_subdir(d) if node_cache(d) else "")
    env = [
        # huggingface_hub keeps its own state (xet chunk cache, lock files) under HF_HOME: the writable /tmp.
        {"name": "HF_HOME", "value": f"{FETCH_TMP}/hf"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        # hf_xet's chunk cache (10 GB by default) would fill the small /tmp volume; files land in the cache anyway.
        {"name": "HF_XET_CHUNK_CACHE_SIZE_BYTES", "value": "0"},
        *([{"name": "HF_ENDPOINT", "value": model.endpoint}] if model.endpoint else []),
        *credential_env(model),
    ]
    return {
        "name": FETCH_CONTAINER,
        "image": d.spec.engine.image,
        "imagePullPolicy": d.spec.engine.image_pull_policy,
        "command": argv[:1],
        "args": argv[1:],
        "env": env,
        # The fetcher's last line (what failed and the fix) becomes the pod's termination message, which
        # the reconciler copies into ModelReady.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Network- and disk-bound: one core's request; the limit leaves room for hf_xet's buffers.
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": MODEL_CACHE_PATH},
                         {"name": "tmp", "mountPath": FETCH_TMP}],
        "securityContext": RESTRICTED_CONTAINER,
    }


def cache_kind(d: HiSparseDeployment) -> str | None:
    """The model cache's mode under its current name (None: no cache, the source is read where it is)."""
    m = d.spec.model
    return m.cache.kind if m.cached and m.cache is not None else None


def within(container: dict[str, Any], requests: dict[str, Any]) -> dict[str, Any]:
    """``container`` with each of its requests no larger than the same resource in ``requests``."""
    own = container["resources"]["requests"]
    capped = {k: (requests[k] if k in requests and parse_quantity(requests[k]) < parse_quantity(v) else v)
              for k, v in own.items()}
    return container if capped == own else {**container, "resources": {**container["resources"], "requests": capped}}


def shared_cache(d: HiSparseDeployment) -> bool:
    return cache_kind(d) == "SharedVolume"


def node_cache(d: HiSparseDeployment) -> bool:
    return cache_kind(d) == "NodeCache"


def pods_fetch(d: HiSparseDeployment) -> bool:
    """The serving pods download the model themselves, in an init container (``NodeCache``, ``PodEphemeral``)."""
    return cache_kind(d) in POD_FETCH_MODES


def fetch_job_name(d: HiSparseDeployment) -> str | None:
    """The Job filling ``d``'s model revision into the shared cache (None without one). Named from the
    resource itself and a hash of its pod, so a candidate with the stable's model shares the stable's Job
    and a new revision, image or credential gets a Job of its own (a Job's template cannot change)."""
    if not shared_cache(d):
        return None
    return names.model_fetch(d.owner_name, _digest(_fetch_pod(d)))


def _digest(pod: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(pod, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:10]


def _fetch_pod(d: HiSparseDeployment) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUNTIME_UID, "runAsGroup": RUNTIME_UID,
                            "fsGroup": RUNTIME_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [fetch_container(d)],
        "volumes": [
            {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": names.model_cache(d.owner_name)}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}},
        ],
        "enableServiceLinks": False,
        **support_placement(d),
    }
    sa = service_account(d.spec.model)
    if sa:
        pod["serviceAccountName"] = sa
    # No API token: the fetcher never talks to the apiserver, and identity webhooks (IRSA, workload
    # identity) project their own audience-bound token into pods of the annotated ServiceAccount.
    pod["automountServiceAccountToken"] = False
    return pod


def model_objects(d: HiSparseDeployment) -> list[dict[str, Any]]:
    """The cache claim and the download Job of ``d``'s model (``SharedVolume`` only)."""
    job_name = fetch_job_name(d)
    if job_name is None:
        return []
    model = d.spec.model
    owner = d.owner_name
    size = model.cache_size_gib
    assert model.cache is not None and size is not None
    claim: dict[str, Any] = {
        # The fetch Job writes, serving pods mount read-only; pods of a role spread over many nodes.
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": f"{size}Gi"}},
    }
    if model.cache.storage_class_name:
        claim["storageClassName"] = model.cache.storage_class_name
    pvc_meta = meta(d, names.model_cache(owner), CACHE_VOLUME)
    pod = _fetch_pod(d)
    job = obj("batch/v1", "Job", meta(d, job_name, FETCH_COMPONENT), spec={
        "backoffLimit": FETCH_BACKOFF_LIMIT,
        # Refused credentials or an unknown repository or revision fail the same way every time: no retry.
        "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
            "containerName": FETCH_CONTAINER, "operator": "In", "values": [FETCH_EXIT_CODES[r] for r in FETCH_NO_RETRY]}}]},
        # Kept after it completes: its Complete condition is what lets the serving workloads be created.
        # The resource's labels, not the fleet's: a candidate's Job is the stable fleet's once promoted (same
        # name, same pod), and a Job's template cannot change.
        "template": {"metadata": {"labels": {L.DEPLOYMENT: d.owner_name, L.APP_COMPONENT: FETCH_COMPONENT}}, "spec": pod},
    })
    return [obj("v1", "PersistentVolumeClaim", pvc_meta, spec=claim), job]


def pod_parts(d: HiSparseDeployment) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], int | None]:
    """What a serving pod needs for its model: (volumes, vLLM container mounts, init containers,
    ephemeral-storage GiB to request)."""
    model = d.spec.model
    if shared_cache(d):
        return ([{"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": names.model_cache(d.owner_name), "readOnly": True}}],
                [{"name": CACHE_VOLUME, "mountPath": MODEL_CACHE_PATH, "readOnly": True}], [], None)
    if node_cache(d):
        assert model.cache is not None
        # DirectoryOrCreate: a node without the directory gets a root-owned one, which the fetcher reports
        # as CacheNotWritable with the fix, instead of a pod stuck in ContainerCreating on a mount error.
        return ([{"name": CACHE_VOLUME, "hostPath": {"path": model.cache.node_dir, "type": "DirectoryOrCreate"}}],
                [{"name": CACHE_VOLUME, "mountPath": MODEL_CACHE_PATH, "readOnly": True, "subPath": node_subdir(d)}],
                [fetch_container(d)], None)
    if pods_fetch(d):
        size = model.cache_size_gib
        assert size is not None
        return ([{"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": f"{size}Gi"}}],
                [{"name": CACHE_VOLUME, "mountPath": MODEL_CACHE_PATH, "readOnly": True}], [fetch_container(d)], size)
    return [], [], [], None
