"""The served model, where its weights come from and are kept, and the DSA sparse-attention facts the
engine and preflight rely on."""

from __future__ import annotations

import math
from typing import Final, Literal

from pydantic import Field

from ._base import Settings

IndexerType = Literal["full", "shared"]

MODEL_MOUNT_PATH: Final = "/models"
"""Where a ``pvc://`` model volume is mounted in serving pods."""

MODEL_SOURCE_PATTERN: Final = r"^(hf://[A-Za-z0-9][\w.\-]*/[\w.\-]+|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^\s]*)?|s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\s]*)?)$"
"""``hf://ORG/NAME``, ``pvc://CLAIM[/SUBPATH]`` or ``s3://BUCKET[/PREFIX]``."""

MODEL_CACHE_PATH: Final = "/model-cache"
"""Where the model cache volume of an ``hf://`` source is mounted, in serving pods and in the fetch Job."""

MODEL_MARKER_FILE: Final = ".hisparse-model.json"
"""Written into a cached model's directory once every file is in place (source, requested revision, the
commit it resolved to, file count and bytes): its presence is what "the cache is filled" means, and
preflight compares it with the declared source and revision."""

FETCH_SUBCOMMAND: Final = "fetch-model"
"""The ``hisparse-runtime`` subcommand that fills the cache (the download Job's and NodeLocal init container's)."""

FETCH_EXIT_CODES: Final[dict[str, int]] = {
    "CredentialsRefused": 2, "ModelNotFound": 3, "DownloadFailed": 4, "CacheFull": 5,
}
"""``hisparse-runtime fetch-model``'s failure reasons (the first word of its termination message) and exit
codes. The operator's download Job does not retry the first two: they fail the same way every time."""
FETCH_NO_RETRY: Final = ("CredentialsRefused", "ModelNotFound")

CACHE_HEADROOM: Final = 1.1
"""Cache space per declared model GiB: the hub's metadata, partial files during a download, rounding."""

ModelCacheMode = Literal["SharedVolume", "NodeLocal"]

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
    ``NodeLocal``: no shared storage needed; each pod downloads into its own ephemeral volume in an init
    container before vLLM starts (the pod requests ``ephemeral-storage`` for it, so the scheduler places
    it on a node with the disk and the kubelet does not evict it); a container restart reuses it, a new
    pod downloads again."""

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
    ``hf://`` with ``NodeLocal``). No API token is mounted: identity webhooks project their own."""


class ModelSettings(Settings):
    """What ``vllm serve`` loads and the sparse facts its ``config.json`` must agree with."""

    source: str = Field(pattern=MODEL_SOURCE_PATTERN, max_length=512)
    """Where the weights come from: ``hf://ORG/NAME`` (Hugging Face), ``pvc://CLAIM[/SUBPATH]``
    (a ReadOnlyMany PersistentVolumeClaim mounted at /models) or ``s3://BUCKET[/PREFIX]`` (streamed)."""

    revision: str | None = Field(default=None, max_length=128)
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
    ``hf://``: it sizes the cache (``cache.sizeGiB``) and, with ``NodeLocal``, each pod's
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
        """GiB of cache space: the declared model size plus headroom (``NodeLocal``: per pod), or the
        claim's (``SharedVolume``)."""
        if not self.cached or self.size_gib is None or self.cache is None:
            return None
        if self.cache.mode == "SharedVolume":
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
