"""The served model, where its weights come from and are kept, and the DSA sparse-attention facts the
engine and preflight rely on."""

from __future__ import annotations

import math
import re
from typing import Annotated, Final, Literal

from pydantic import Field

from ._base import Settings
from .kube import checked

IndexerType = Literal["full", "shared"]

MODEL_MOUNT_PATH: Final = "/models"
"""Where a ``pvc://`` model volume is mounted in serving pods."""

MODEL_SOURCE_PATTERN: Final = (r"^(hf://[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?/[A-Za-z0-9_]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
                                r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[A-Za-z0-9._-]+)*/?"
                                r"|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9._-]+)*/?)$")
"""``hf://ORG/NAME``, ``pvc://CLAIM[/SUBPATH]`` or ``s3://BUCKET[/PREFIX]``, ASCII only (the CRD carries the
same pattern); :func:`source_problem` adds what a pattern cannot say."""

_SEGMENT: Final = re.compile(r"^[A-Za-z0-9._-]+$")
REVISION_PATTERN: Final = r"^[A-Za-z0-9._/+-]+$"
"""Characters of a revision: what git allows in a ref, less everything a shell would act on."""


def hf_repo_problem(repo_id: str) -> str | None:
    """Hugging Face's repo-id rule (huggingface_hub's ``validate_repo_id``) restricted to ASCII, as the CRD's
    pattern is: ``ORG/NAME`` of letters, digits, '_', '-' and '.', each part starting and ending with a letter,
    digit or '_', the name at most 96 characters, no '--' or '..', not ending in '.git'."""
    parts = repo_id.split("/")
    part = r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?"
    if len(parts) != 2 or not all(re.fullmatch(part, p) for p in parts) or len(parts[1]) > 96:
        return f"{repo_id!r} is not a Hugging Face repo id (ORG/NAME, ASCII letters, digits, '_', '-' and '.')"
    if "--" in repo_id or ".." in repo_id:
        return f"{repo_id!r} has '--' or '..', which Hugging Face repo ids cannot contain"
    if repo_id.endswith(".git"):
        return f"{repo_id!r} ends in '.git', which Hugging Face repo ids cannot"
    return None


def subpath_problem(subpath: str, scheme: str) -> str | None:
    """A path inside a claim (or bucket) that stays inside it: segments of safe characters, none '.', '..' or
    empty (a leading '/' or '//' is an empty segment); one trailing '/' is allowed."""
    segments = subpath.removesuffix("/").split("/") if subpath else []
    bad = [s for s in segments if s in (".", "..") or not _SEGMENT.match(s)]
    if not bad:
        return None
    kept = [s for s in segments if s not in (".", "..") and _SEGMENT.match(s)]
    where = "the claim" if scheme == "pvc" else "the bucket"
    return (f"the path {subpath!r} has the segment(s) {', '.join(repr(b) for b in bad)}: the model path must stay inside "
            f"{where} ('..', '.', empty segments and characters other than letters, digits, '.', '_' and '-' are refused, "
            f"so that vLLM is never pointed outside it)")


def source_problem(source: str) -> str | None:
    scheme, sep, location = source.partition("://")
    if not sep:
        return None  # the pattern reports it
    if scheme == "hf":
        problem = hf_repo_problem(location)
        return f"{problem}: use the repo id the hub shows, e.g. hf://deepseek-ai/DeepSeek-V3.2" if problem else None
    if scheme in ("pvc", "s3"):
        head, _, sub = location.partition("/")
        problem = subpath_problem(sub, scheme)
        if problem:
            kept = "/".join(s for s in sub.split("/") if s not in ("", ".", "..") and _SEGMENT.match(s))
            return f"{problem}: use {f'{scheme}://{head}/{kept}'.rstrip('/')!r} or the path you meant"
    return None


def revision_problem(revision: str) -> str | None:
    """A 40-hex commit, or a ref name by ``git check-ref-format --allow-onelevel`` in shell-inert characters.
    (A leading '-' is left to the CRD's own rule, which says why.)"""
    if re.fullmatch(r"[0-9a-f]{40}", revision) or revision.startswith("-"):
        return None
    parts = revision.split("/")
    reason = None
    if not re.match(REVISION_PATTERN, revision):
        reason = "it has characters other than ASCII letters, digits, '.', '_', '-', '+' and '/' (nothing a shell acts on)"
    elif ".." in revision or "@{" in revision or revision == "@":
        reason = "git refs cannot contain '..' or '@{' (nor be '@')"
    elif any(not p or p.startswith(".") or p.endswith(".lock") for p in parts) or revision.endswith("."):
        reason = "git refs have no empty component (leading, trailing or double '/'), no component starting with '.' or ending with '.lock', and do not end with '.'"
    if reason is None:
        return None
    return (f"revision {revision!r} is not a commit sha or a git ref name: {reason}; the download Job and the model "
            "path are built from it: set spec.model.revision to the commit sha to serve (40 hex digits)")


MODEL_CACHE_PATH: Final = "/model-cache"
"""Where the model cache volume of an ``hf://`` source is mounted, in serving pods and in the fetch Job."""

MODEL_MARKER_FILE: Final = ".hisparse-model.json"
"""Written into a cached model's directory once every file is in place (source, requested revision, the
commit it resolved to, file count and bytes): its presence is what "the cache is filled" means, and
preflight compares it with the declared source and revision."""

FETCH_SUBCOMMAND: Final = "fetch-model"
"""The ``hisparse-runtime`` subcommand that fills the cache (the download Job's, and the serving pods' init
container with ``NodeCache`` or ``PodEphemeral``)."""

FETCH_EXIT_CODES: Final[dict[str, int]] = {
    "CredentialsRefused": 2, "ModelNotFound": 3, "DownloadFailed": 4, "CacheFull": 5, "CacheNotWritable": 6,
}
"""``hisparse-runtime fetch-model``'s failure reasons (the first word of its termination message) and exit
codes. The operator's download Job does not retry the first two: they fail the same way every time.
(``CacheNotWritable`` is retried: a Job's failure policy cannot change once created, and the reason is
mostly a node cache's, whose init container the kubelet retries.)"""
FETCH_NO_RETRY: Final = ("CredentialsRefused", "ModelNotFound")

CACHE_HEADROOM: Final = 1.1
"""Cache space per declared model GiB: the hub's metadata, partial files during a download, rounding."""

ModelCacheMode = Literal["SharedVolume", "NodeCache", "PodEphemeral", "NodeLocal"]
DEPRECATED_CACHE_MODES: Final[dict[str, str]] = {"NodeLocal": "PodEphemeral"}
"""Earlier names of a mode, still accepted (stored resources keep them), and the mode each means.
``NodeLocal`` was always a per-pod volume, never the node's: its name is ``PodEphemeral`` now."""
POD_FETCH_MODES: Final = ("NodeCache", "PodEphemeral")
"""Modes in which each serving pod downloads the model itself (an init container), not a Job."""
NODE_CACHE_PATH: Final = "/var/lib/hisparse/model-cache"
"""``NodeCache``'s directory on each node when ``cache.nodePath`` is unset."""
NODE_PATH_PATTERN: Final = r"^(/[A-Za-z0-9_-][A-Za-z0-9._-]*){2,}$"
"""An absolute path of two or more segments, none starting with a dot: no ``..``, no ``/`` or ``/var``."""

SECRET_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "hf": ("HF_TOKEN",),
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
}
"""Keys read from ``credentials.secretName`` per source scheme; each becomes the environment variable of
the same name (``huggingface_hub`` and vLLM's run:ai streamer read exactly these)."""


class ModelCacheSettings(Settings):
    """Where an ``hf://`` model's weights are kept so pods share or reuse one download (not used by
    ``pvc://``, which is a volume already, nor ``s3://``, which vLLM's run:ai streamer reads straight into
    GPU memory)."""

    mode: ModelCacheMode = "SharedVolume"
    """``SharedVolume`` (default): one ReadWriteMany PersistentVolumeClaim ``<name>-model-cache`` per
    deployment, filled once per revision by a download Job; serving pods mount it read-only and are not
    created until the Job has filled it, so N pods cost one download and a restart costs none.
    ``NodeCache``: no shared storage needed; each node keeps the revisions its pods downloaded in a
    directory of its own disk (``nodePath``, a ``hostPath``), one subdirectory per deployment
    (``<namespace>/<name>``). A serving pod's init container downloads only what its node lacks, so a
    recreated pod (a rollout, an eviction, an LWS group recreated on a restart) loads from disk. The
    directory must be writable by the runtime's UID/GID 10001 (created by the node's setup or a DaemonSet)
    and the namespace must admit ``hostPath`` volumes; the download fails with ``CacheNotWritable`` otherwise.
    ``PodEphemeral`` (earlier name ``NodeLocal``, still accepted): each pod downloads into its own ephemeral
    volume in an init container before vLLM starts (the pod requests ``ephemeral-storage`` for it, so the
    scheduler places it on a node with the disk and the kubelet does not evict it); a container restart
    reuses it, a new pod downloads again."""

    # Left out of the serialized settings while unset (see ``ModelSettings.endpoint``).
    node_path: str | None = Field(default=None, max_length=256, pattern=NODE_PATH_PATTERN,
                                  exclude_if=lambda v: v is None)
    """``NodeCache``: the directory on each node (default ``/var/lib/hisparse/model-cache``), an absolute
    path of at least two segments. It is shared by every deployment that names it; each keeps its own
    subdirectory."""

    @property
    def kind(self) -> str:
        """The mode, under its current name (a deprecated one is read as the mode it means)."""
        return DEPRECATED_CACHE_MODES.get(self.mode, self.mode)

    @property
    def node_dir(self) -> str:
        """``NodeCache``'s directory on the node."""
        return self.node_path or NODE_CACHE_PATH

    storage_class_name: str | None = Field(default=None, max_length=253)
    """``SharedVolume``: StorageClass of the claim; it must offer ReadWriteMany (NFS, CephFS, Lustre,
    Filestore, EFS ...). Unset: the cluster's default class."""

    size_gib: int | None = Field(default=None, ge=1, le=1_000_000)
    """``SharedVolume``: capacity of the claim in GiB. Unset: twice ``model.sizeGiB`` plus 10% (the stable
    revision and a canary's side by side). Claims can grow, never shrink."""


class ModelCredentials(Settings):
    """How pods authenticate to the model source. Secrets are referenced, never written into a manifest."""

    secret_name: str | None = Field(default=None, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """Secret in the deployment's namespace. ``hf://``: key ``HF_TOKEN`` (gated or private repositories).
    ``s3://``: keys ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY``. Each key reaches only the
    container that downloads, as an environment variable from a ``secretKeyRef``; a missing Secret shows
    as ``ModelReady`` False with reason ``CredentialsMissing``."""

    service_account_name: str | None = Field(default=None, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """ServiceAccount the downloading pods run as, for identity-based access (IRSA, GKE or Azure workload
    identity): the fetch Job's pods (``hf://`` with ``SharedVolume``) or the serving pods (``s3://``,
    ``hf://`` with ``NodeCache`` or ``PodEphemeral``). No API token is mounted: identity webhooks project their own."""


class ModelSettings(Settings):
    """What ``vllm serve`` loads and the sparse facts its ``config.json`` must agree with."""

    source: Annotated[str, Field(pattern=MODEL_SOURCE_PATTERN, max_length=512), checked(source_problem)]
    """Where the weights come from: ``hf://ORG/NAME`` (Hugging Face), ``pvc://CLAIM[/SUBPATH]``
    (a ReadOnlyMany PersistentVolumeClaim mounted at /models) or ``s3://BUCKET[/PREFIX]`` (streamed)."""

    revision: Annotated[str, Field(json_schema_extra={"pattern": REVISION_PATTERN}), checked(revision_problem)] | None = Field(
        default=None, max_length=128)
    """Hugging Face revision (commit sha, tag or branch). Required for ``hf://``: the cache is filled at
    this revision and its marker records the commit it resolved to, so every pod loads the same bytes;
    pin a commit sha in production (a branch is resolved once, when the cache is filled). Part of the
    KV-compatibility hash and of the pod revision."""

    # Left out of the serialized settings while unset, so that the revision and KV-compatibility hashes of
    # deployments written before the field existed do not change (an operator upgrade would roll them).
    endpoint: str | None = Field(default=None, max_length=512, pattern=r"^https?://[^/?#\s]+(/[^?#\s]*)?$",
                                 exclude_if=lambda v: v is None)
    """Hub endpoint of an ``hf://`` source (``huggingface_hub``'s ``HF_ENDPOINT``): a mirror or caching
    proxy of the Hugging Face hub inside the cluster's network, for clusters with no route to
    huggingface.co. The download reads it; vLLM never does (it loads the cache). Unset: huggingface.co."""

    size_gib: int | None = Field(default=None, ge=1, le=1_000_000)
    """Size of the checkpoint's files in GiB (the hub lists them; GLM-5.2-FP8 is about 760). Required for
    ``hf://``: it sizes the cache (``cache.sizeGiB``) and, with ``PodEphemeral``, each pod's
    ``ephemeral-storage`` request (this plus 10%)."""

    cache: ModelCacheSettings | None = None
    """Model cache of an ``hf://`` source (see ``ModelCacheSettings``). The HiSparseDeployment API always
    sets one (``SharedVolume`` by default); unset only in engine settings built by hand, where vLLM
    downloads the model itself at ``--revision``."""

    credentials: ModelCredentials | None = None
    """Secret and/or ServiceAccount for the source. Unset: anonymous (public repositories, or node roles)."""

    served_model_name: str = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._\-]*[A-Za-z0-9])?$")
    """Name clients request and llm-d routes on (``--served-model-name``, label ``llm-d.ai/model``)."""

    trust_remote_code: bool = False
    """Pass ``--trust-remote-code`` (some DSA checkpoints ship custom config classes)."""

    architecture: str | None = Field(default=None, max_length=128, pattern=r"^[A-Za-z][A-Za-z0-9_]*$")
    """The checkpoint's architecture (``architectures[0]`` in config.json, e.g. ``GlmMoeDsaForCausalLM``).
    Decides MoE kernel safety on Blackwell; preflight re-checks it against the downloaded config.json."""

    index_topk: int | None = Field(default=None, gt=0, le=65536)
    """DSA indexer top-k (``index_topk`` in config.json; 2048 for DeepSeek-V3.2 and GLM-5.x).
    Required for HiSparse: vLLM refuses a model without it and the hot buffer is sized from it.
    Preflight re-checks it against the downloaded config.json."""

    index_topk_freq: int = Field(default=1, ge=1, le=64)
    """Layers per indexer run (``index_topk_freq``; GLM-5.2: 4). 1 means every layer runs its indexer."""

    indexer_types: list[IndexerType] | None = Field(default=None, max_length=512)
    """Per-layer ``full``/``shared`` indexer kinds when the model declares ``indexer_types``."""

    @property
    def scheme(self) -> str:
        return self.source.split("://", 1)[0]

    @property
    def location(self) -> str:
        return self.source.split("://", 1)[1]

    @property
    def read_by_serving_pods(self) -> bool:
        """The serving pods reach the source themselves: vLLM streams ``s3://``, and an ``hf://`` cache in a
        pod-fetch mode is filled by each pod (``pvc://`` is a volume; ``SharedVolume`` has a Job)."""
        return self.scheme == "s3" or (self.cached and self.cache is not None and self.cache.kind in POD_FETCH_MODES)

    @property
    def cached(self) -> bool:
        """The weights are downloaded into a cache before vLLM starts (and vLLM loads them from there)."""
        return self.scheme == "hf" and self.cache is not None

    @property
    def cache_dir(self) -> str | None:
        """The cached model's directory in pods: one per source and revision, so revisions sit side by side."""
        if not self.cached:
            return None
        return f"{MODEL_CACHE_PATH}/{self.scheme}/{self.location}/{self.revision or 'main'}"

    @property
    def cache_size_gib(self) -> int | None:
        """GiB of cache space: the declared model size plus headroom (``PodEphemeral``: per pod;
        ``NodeCache``: per revision on a node), or the claim's (``SharedVolume``)."""
        if not self.cached or self.size_gib is None or self.cache is None:
            return None
        if self.cache.kind == "SharedVolume":
            return self.cache.size_gib or math.ceil(2 * self.size_gib * CACHE_HEADROOM)
        return math.ceil(self.size_gib * CACHE_HEADROOM)

    @property
    def vllm_model_arg(self) -> str:
        """The positional ``vllm serve`` argument for this source."""
        if self.scheme == "hf":
            return self.cache_dir or self.location
        if self.scheme == "pvc":
            sub = self.location.partition("/")[2]
            return f"{MODEL_MOUNT_PATH}/{sub}".rstrip("/")
        return self.source  # s3:// streams through vLLM's run:ai model streamer

    @property
    def pvc_claim(self) -> str | None:
        return self.location.partition("/")[0] if self.scheme == "pvc" else None
