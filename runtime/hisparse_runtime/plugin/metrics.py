"""The Prometheus metrics HiSparse operators and dashboards read, defined once.

| name (exposition)                        | type    | labels              | meaning                                   |
|------------------------------------------|---------|---------------------|-------------------------------------------|
| ``hisparse_hot_buffer_hits_total``       | counter | model_name, engine  | top-k rows found in the GPU hot buffer    |
| ``hisparse_hot_buffer_misses_total``     | counter | model_name, engine  | top-k rows not in the hot buffer          |
| ``hisparse_swapped_in_rows_total``       | counter | model_name, engine  | KV rows copied host -> hot buffer         |
| ``hisparse_swapped_in_bytes_total``      | counter | model_name, engine  | bytes copied host -> hot buffer           |
| ``hisparse_host_pool_usage_ratio``       | gauge   | model_name, engine  | host pool occupancy, 0..1                 |
| ``hisparse_host_pool_size_bytes``        | gauge   | model_name, engine  | host pool size per data-parallel replica  |
| ``hisparse_pending_page_transfers``      | gauge   | model_name, engine  | host page write-backs/restores in flight  |
| ``hisparse_preflight_check_passed``      | gauge   | check               | 1 passed, 0 failed, per preflight check   |
| ``hisparse_build_info``                  | info*   | version, vllm_version, kernels_version | build identity (value 1) |
| ``hisparse_plugin_errors_total``         | counter | stage               | plugin steps that failed and were skipped |
| ``hisparse_decode_kernels_info``         | gauge   | requested, active   | which kernels serve decode's HiSparse ops (value 1) |

(*) an Info metric, which the Prometheus text format (0.0.4, what vLLM serves) types as a gauge.

``hisparse_decode_kernels_info`` has one series per process: ``requested`` is what
``HISPARSE_DECODE_KERNELS`` asked for (``vllm`` when unset), ``active`` what serves vLLM's op names
(``vllm`` or ``hisparse``). ``requested="hisparse",active="vllm"`` means the swap failed and vLLM's
own ops serve decode (the plugin logged why and counted an error for stage ``kernels``); alert on
``hisparse_decode_kernels_info{requested="hisparse",active="vllm"}``.

Hit rate for dashboards: ``rate(hisparse_hot_buffer_hits_total[5m]) / (rate(hisparse_hot_buffer_hits_total[5m])
+ rate(hisparse_hot_buffer_misses_total[5m]))``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Info

__all__ = ["ENGINE_LABELS", "METRIC_TYPES", "HiSparseMetrics", "metrics"]

ENGINE_LABELS = ("model_name", "engine")
"""The labels vLLM puts on its own per-engine metrics, so our series join with theirs."""

METRIC_TYPES: dict[str, str] = {
    "hisparse_hot_buffer_hits": "counter",
    "hisparse_hot_buffer_misses": "counter",
    "hisparse_swapped_in_rows": "counter",
    "hisparse_swapped_in_bytes": "counter",
    "hisparse_host_pool_usage_ratio": "gauge",
    "hisparse_host_pool_size_bytes": "gauge",
    "hisparse_pending_page_transfers": "gauge",
    "hisparse_preflight_check_passed": "gauge",
    "hisparse_build_info": "gauge",
    "hisparse_plugin_errors": "counter",
    "hisparse_decode_kernels_info": "gauge",
}
"""Family names and types as the Prometheus text-format parser reports them: the documented contract."""


@dataclass(frozen=True)
class HiSparseMetrics:
    hits: Counter
    misses: Counter
    rows_in: Counter
    bytes_in: Counter
    pool_usage: Gauge
    pool_size: Gauge
    pending_pages: Gauge
    preflight: Gauge
    build_info: Info | Gauge
    errors: Counter
    decode_kernels: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> HiSparseMetrics:
        # In prometheus_client's multiprocess mode (vLLM with several API servers) Info is not
        # supported and gauges need an aggregation mode; a labelled gauge of 1 exposes the same series.
        multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        build_labels = ["version", "vllm_version", "kernels_version"]
        return cls(
            hits=Counter("hisparse_hot_buffer_hits", "Top-k KV rows found in the GPU hot buffer.",
                         ENGINE_LABELS, registry=registry),
            misses=Counter("hisparse_hot_buffer_misses", "Top-k KV rows missing from the GPU hot buffer.",
                           ENGINE_LABELS, registry=registry),
            rows_in=Counter("hisparse_swapped_in_rows", "KV rows copied from the host pool into hot buffers.",
                            ENGINE_LABELS, registry=registry),
            bytes_in=Counter("hisparse_swapped_in_bytes", "Bytes copied from the host pool into hot buffers.",
                             ENGINE_LABELS, registry=registry),
            pool_usage=Gauge("hisparse_host_pool_usage_ratio",
                             "Host KV pool occupancy (0..1); evictable blocks count as free.",
                             ENGINE_LABELS, registry=registry, multiprocess_mode="mostrecent"),
            pool_size=Gauge("hisparse_host_pool_size_bytes", "Host KV pool size per data-parallel replica in bytes.",
                            ENGINE_LABELS, registry=registry, multiprocess_mode="mostrecent"),
            pending_pages=Gauge("hisparse_pending_page_transfers", "Host page write-backs and restores not yet completed.",
                                ENGINE_LABELS, registry=registry, multiprocess_mode="mostrecent"),
            preflight=Gauge("hisparse_preflight_check_passed", "1 if the pod's preflight check passed, 0 if it failed.",
                            ["check"], registry=registry, multiprocess_mode="mostrecent"),
            build_info=(
                Gauge("hisparse_build_info", "HiSparse runtime build identity (value 1).", build_labels,
                      registry=registry, multiprocess_mode="max")
                if multiprocess
                else Info("hisparse_build", "HiSparse runtime build identity.", registry=registry)
            ),
            errors=Counter("hisparse_plugin_errors", "Plugin steps that raised and were skipped; vLLM kept running.",
                           ["stage"], registry=registry),
            decode_kernels=Gauge("hisparse_decode_kernels_info",
                                 "Which kernels serve decode's HiSparse ops in this process (value 1): requested by "
                                 "HISPARSE_DECODE_KERNELS, active after the vLLM plugin's install.",
                                 ["requested", "active"], registry=registry, multiprocess_mode="max"),
        )  # fmt: skip

    def set_build_info(self, labels: dict[str, str]) -> None:
        if isinstance(self.build_info, Info):
            self.build_info.info(labels)
        else:
            self.build_info.labels(**labels).set(1)


    def set_decode_kernels(self, requested: str, active: str) -> None:
        """One series: the kernels asked for and the ones serving (a later call replaces it)."""
        self.decode_kernels.clear()
        self.decode_kernels.labels(requested=requested, active=active).set(1)


_lock = threading.Lock()
_default: HiSparseMetrics | None = None


def metrics() -> HiSparseMetrics:
    """The process-wide metrics on prometheus_client's default registry (which vLLM's /metrics serves).

    vLLM may load plugins more than once per process; the metrics are created only the first time.
    """
    global _default
    with _lock:
        if _default is None:
            _default = HiSparseMetrics.create(REGISTRY)
        return _default
