"""``/metrics`` of the CPU engine: vLLM 0.33's metric names (``vllm/v1/metrics/loggers.py``, labels
``model_name`` and ``engine``), the NIXL connector's, and the project plugin's ``hisparse_*`` metrics
fed through the same code path vLLM's stat-logger plugin uses (``plugin.connector_stats.observe``).

Only the families this engine can fill with real values are served; each is named and typed as vLLM
names and types it, so dashboards and the EPP's scrapes read it unchanged.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from hisparse_runtime.plugin import connector_stats
from hisparse_runtime.plugin import metrics as plugin_metrics
from hisparse_runtime.plugin import register as register_plugin
from hisparse_runtime.plugin.metrics import HiSparseMetrics

__all__ = ["EngineMetrics"]

LABELS = ["model_name", "engine"]

# vLLM 0.33's default buckets (vllm/v1/metrics/buckets.py, distributed/.../nixl/stats.py).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]  # fmt: skip
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
NIXL_TIME_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
NIXL_BYTES_BUCKETS = [2 ** (10 + i) for i in range(1, 25, 2)]


def _vllm_buckets(family: str, fallback: list[float]) -> list[float]:
    try:  # the installed vLLM's own defaults, where its module is importable
        from vllm.v1.metrics.buckets import histogram_buckets

        return [float(b) for b in histogram_buckets(family)]  # type: ignore[arg-type]
    except Exception:
        return fallback


class EngineMetrics:
    """The metric families of one engine (``engine="0"``), on ``registry`` (default: the process's, where
    the plugin's are too; another registry gets its own plugin metrics)."""

    def __init__(self, model_name: str, *, registry: CollectorRegistry = REGISTRY, kv_row_bytes: int = 0,
                 host_pool_bytes: int | None = None) -> None:  # fmt: skip
        self.labels = (model_name, "0")
        self.kv_row_bytes = kv_row_bytes
        lv = self.labels

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=registry, multiprocess_mode="mostrecent")

        def counter(name: str, doc: str, extra: list[str] | None = None) -> Counter:
            return Counter(name, doc, LABELS + (extra or []), registry=registry)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=registry)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.").labels(*lv)
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.").labels(*lv)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.").labels(*lv)
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.").labels(*lv)
        self.prefix_hits = counter("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached tokens.").labels(*lv)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(*lv)
        by_source = counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ["source"])
        self.prompt_by_source = {s: by_source.labels(*lv, s)
                                 for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.").labels(*lv)
        success = counter("vllm:request_success", "Count of successfully processed requests.", ["finished_reason"])
        self.success = {r: success.labels(*lv, r) for r in ("stop", "length", "abort", "error", "repetition")}
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              _vllm_buckets("time_to_first_token", TTFT_BUCKETS)).labels(*lv)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             _vllm_buckets("inter_token_latency", ITL_BUCKETS)).labels(*lv)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             _vllm_buckets("request_latency", LATENCY_BUCKETS)).labels(*lv)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.",
                                    _vllm_buckets("request_latency", LATENCY_BUCKETS)).labels(*lv)
        # Never incremented: this engine reserves a request's whole KV before admitting it (as vLLM's
        # --scheduler-reserve-full-isl), so it queues instead of preempting. Exported so that the series
        # HiSparsePreemptions watches exists, at the value this engine's behaviour gives it.
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.").labels(*lv)
        self.nixl_xfer_time = histogram("vllm:nixl_xfer_time_seconds",
                                        "Histogram of transfer duration for NIXL KV Cache transfers.",
                                        NIXL_TIME_BUCKETS).labels(*lv)
        self.nixl_bytes = histogram("vllm:nixl_bytes_transferred",
                                    "Histogram of bytes transferred per NIXL KV Cache transfers.",
                                    NIXL_BYTES_BUCKETS).labels(*lv)
        self.nixl_failed = counter("vllm:nixl_num_failed_transfers",
                                   "Number of failed NIXL KV Cache transfers.").labels(*lv)  # fmt: skip
        if registry is REGISTRY:
            # The project plugin's metrics, on the default registry as under vLLM.
            register_plugin()
            self.plugin = plugin_metrics()
        else:  # all families on the registry asked for, so a test can read this engine's exposition alone
            self.plugin = HiSparseMetrics.create(registry)
        if host_pool_bytes is not None:
            self.plugin.pool_size.labels(*lv).set(host_pool_bytes)
        self._hits = 0
        self._misses = 0

    def scheduler(self, running: int, waiting: int, blocks_used: int, blocks_total: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(blocks_used / blocks_total if blocks_total else 0.0)

    def hot_buffer(self, hits: int, misses: int, pool_usage: float) -> None:
        """Cumulative hot-buffer counters -> the HiSparse connector stats payload vLLM would publish."""
        dh, dm = hits - self._hits, misses - self._misses
        self._hits, self._misses = hits, misses
        payload = {connector_stats.CONNECTOR_NAME: {
            "cache_hits": [dh], "cache_misses": [dm], "host_to_device_bytes": [dm * self.kv_row_bytes],
            "host_cache_usage_perc": [pool_usage], "pending_page_transfers": [0],
        }}  # fmt: skip
        connector_stats.observe(self.plugin, self.labels, payload)
