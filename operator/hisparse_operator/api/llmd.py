"""What each supported llm-d release expects: the one table of version differences.

Every entry was read from that release's own source in the Go module cache
(``github.com/llm-d/llm-d-inference-scheduler@<version>``, and the Gateway API Inference Extension
(GIE) version its go.mod requires):

- the EndpointPickerConfig group: GIE's ``apix/config/v1alpha1`` (``GroupName``), decoded strictly
  by GIE's ``pkg/epp/config/loader`` (unknown fields and other groups are refused);
- plugin type names: ``pkg/plugins/register.go`` (llm-d's) and GIE's built-ins; the P/D profile
  handler's parameters: ``pkg/plugins/profile/pd_profile_handler.go``;
- the kinds the EPP watches (so its RBAC): GIE's ``pkg/epp/controller``;
- the sidecar's flags: ``cmd/pd-sidecar/main.go``; the InferencePool its SSRF guard watches:
  ``pkg/sidecar/proxy/allowlist.go``.

Versions newer than v0.5.1 (whose P/D handler is ``disagg-profile-handler`` with a
``prefix-based-pd-decider``, in an ``llm-d.ai`` config group) are not served by the Go module proxy
these builds use, so their loaders cannot be read or run here and they are not offered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

LlmdVersion = Literal["v0.4.0", "v0.5.1"]
"""llm-d inference-scheduler releases the toolkit renders for (keys of :data:`RELEASES`)."""

DEFAULT_EPP_VERSION: Final[LlmdVersion] = "v0.4.0"
"""The newest release whose EPP builds from the Go module proxy (v0.5.1's needs llm-d-kv-cache
v0.5.0, which the proxy does not serve), so the one proven end to end here."""

DEFAULT_SIDECAR_VERSION: Final[LlmdVersion] = "v0.5.1"
"""The first release whose sidecar watches InferencePool v1 (``-pool-group``), the pool rendered here."""

CHARS_PER_TOKEN: Final = 4
"""GIE's own estimate of prompt characters per token (``averageCharactersPerToken`` in its prefix
plugin): the P/D handlers of these releases count prompt *characters*, the API counts tokens."""


@dataclass(frozen=True)
class LlmdRelease:
    """One llm-d inference-scheduler release, as its EPP and sidecar read their inputs."""

    version: str
    gie_version: str
    """The Gateway API Inference Extension version its go.mod requires (the EPP is GIE's runner)."""
    epp_config_api: str
    """``apiVersion`` of the EndpointPickerConfig its config loader decodes."""
    pd_profile_handler: str
    """Type of the profile handler that runs decode, then prefill when the uncached prompt is long."""
    pd_handler_prefix_type_param: bool
    """The P/D handler takes ``prefixPluginType`` beside ``prefixPluginName`` (from v0.5.1)."""
    prefill_header_plugin: str
    """Pre-request plugin that writes the prefill pod into ``x-prefiller-host-port``."""
    epp_watched_x_resources: tuple[str, ...]
    """``inference.networking.x-k8s.io`` resources the EPP's controllers watch (its Role)."""
    epp_kv_cache_metric_default: str
    """The EPP's ``--kv-cache-usage-percentage-metric`` default (GIE's runner)."""
    sidecar_pool_group_flag: bool
    """The sidecar has ``-pool-group`` (its SSRF guard can watch InferencePool v1)."""
    sidecar_ssrf_pool_api: str
    """The InferencePool API the sidecar's SSRF guard watches by default."""
    sidecar_ssrf_reads_v1_pool: bool
    """The SSRF guard allows the pods of an InferencePool v1 (the pool rendered here)."""

    @property
    def epp_image(self) -> str:
        return f"ghcr.io/llm-d/llm-d-inference-scheduler:{self.version}"

    @property
    def sidecar_image(self) -> str:
        return f"ghcr.io/llm-d/llm-d-routing-sidecar:{self.version}"

    def pd_handler_parameters(self, threshold_tokens: int, prefix_plugin: str, hash_block_chars: int) -> dict[str, Any]:
        """The P/D handler's parameters: disaggregate when the prompt's uncached part is at least
        ``threshold_tokens`` (converted to the characters these releases count). ``hash_block_chars``
        must be the prefix-cache scorer's ``blockSize``: the handler turns its hits into characters."""
        out: dict[str, Any] = {
            "threshold": threshold_chars(threshold_tokens),
            "hashBlockSize": hash_block_chars,
            "prefixPluginName": prefix_plugin,
        }
        if self.pd_handler_prefix_type_param:
            out["prefixPluginType"] = prefix_plugin
        return out


def threshold_chars(threshold_tokens: int) -> int:
    """The P/D handler's ``threshold`` (prompt characters) for a threshold in tokens."""
    return threshold_tokens * CHARS_PER_TOKEN


VLLM_KV_CACHE_USAGE_METRIC: Final = "vllm:kv_cache_usage_perc"
"""The KV-cache usage gauge vLLM 0.33 exports (``vllm/v1/metrics/loggers.py``), which the EPP scores
and sheds load by."""

_X_GROUP_V1ALPHA1: Final = "inference.networking.x-k8s.io/v1alpha1"

RELEASES: Final[dict[str, LlmdRelease]] = {
    r.version: r
    for r in (
        LlmdRelease(
            version="v0.4.0",
            gie_version="v1.2.0",
            epp_config_api=_X_GROUP_V1ALPHA1,
            pd_profile_handler="pd-profile-handler",
            pd_handler_prefix_type_param=False,
            prefill_header_plugin="prefill-header-handler",
            epp_watched_x_resources=("inferenceobjectives",),
            # vLLM 0.33 exports vllm:kv_cache_usage_perc; this name is from older vLLM.
            epp_kv_cache_metric_default="vllm:gpu_cache_usage_perc",
            sidecar_pool_group_flag=False,
            # Only the alpha pool: a sidecar of this release cannot guard against our v1 pool.
            sidecar_ssrf_pool_api="inference.networking.x-k8s.io/v1alpha2",
            sidecar_ssrf_reads_v1_pool=False,
        ),
        LlmdRelease(
            version="v0.5.1",
            gie_version="v1.3.1",
            epp_config_api=_X_GROUP_V1ALPHA1,
            pd_profile_handler="pd-profile-handler",
            pd_handler_prefix_type_param=True,
            prefill_header_plugin="prefill-header-handler",
            epp_watched_x_resources=("inferenceobjectives", "inferencemodelrewrites"),
            epp_kv_cache_metric_default="vllm:kv_cache_usage_perc",
            sidecar_pool_group_flag=True,
            sidecar_ssrf_pool_api="inference.networking.k8s.io/v1",
            # It watches the v1 pool but reads spec.selector as a flat label map (the alpha shape;
            # allowlist.go), so a v1 selector ({matchLabels: ...}) yields an invalid pod selector, no
            # allowed pod, and a 403 for every prefiller (the e2e suite shows it).
            sidecar_ssrf_reads_v1_pool=False,
        ),
    )
}

# The API's choice of versions and this table are one list.
if set(RELEASES) != set(get_args(LlmdVersion)):  # pragma: no cover - import-time consistency check
    raise ImportError(f"llm-d releases {sorted(RELEASES)} != LlmdVersion {get_args(LlmdVersion)}")

SIDECARS_WITHOUT_V1_SSRF: Final = tuple(v for v, r in RELEASES.items() if not r.sidecar_ssrf_reads_v1_pool)
"""Sidecar releases whose SSRF guard cannot allow the pods of an InferencePool v1 (so would refuse
every prefiller)."""


def release(version: str) -> LlmdRelease:
    return RELEASES[version]
