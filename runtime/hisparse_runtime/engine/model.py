"""The served model and the DSA sparse-attention facts the engine and preflight rely on."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from ._base import Settings

IndexerType = Literal["full", "shared"]

MODEL_MOUNT_PATH: Final = "/models"
"""Where a ``pvc://`` model volume is mounted in serving pods."""

MODEL_SOURCE_PATTERN: Final = r"^(hf://[A-Za-z0-9][\w.\-]*/[\w.\-]+|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^\s]*)?|s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\s]*)?)$"
"""``hf://ORG/NAME``, ``pvc://CLAIM[/SUBPATH]`` or ``s3://BUCKET[/PREFIX]``."""


class ModelSettings(Settings):
    """What ``vllm serve`` loads and the sparse facts its ``config.json`` must agree with."""

    source: str = Field(pattern=MODEL_SOURCE_PATTERN, max_length=512)
    """Where the weights come from: ``hf://ORG/NAME`` (Hugging Face), ``pvc://CLAIM[/SUBPATH]``
    (a ReadOnlyMany PersistentVolumeClaim mounted at /models) or ``s3://BUCKET[/PREFIX]`` (streamed)."""

    revision: str | None = Field(default=None, max_length=128)
    """Hugging Face revision (commit sha, tag or branch). Pin a commit sha in production: it is part of
    the KV-compatibility hash. Only meaningful for ``hf://`` sources."""

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
    def vllm_model_arg(self) -> str:
        """The positional ``vllm serve`` argument for this source."""
        if self.scheme == "hf":
            return self.location
        if self.scheme == "pvc":
            sub = self.location.partition("/")[2]
            return f"{MODEL_MOUNT_PATH}/{sub}".rstrip("/")
        return self.source  # s3:// streams through vLLM's run:ai model streamer

    @property
    def pvc_claim(self) -> str | None:
        return self.location.partition("/")[0] if self.scheme == "pvc" else None
