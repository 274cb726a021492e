"""Turning vLLM 0.33's HiSparse connector stats into our metrics.

vLLM's scheduler publishes ``SchedulerStats.kv_connector_stats`` as the connector's ``to_dict()``:

- HiSparseConnector alone: ``HiSparseKVConnectorStats.data``, lists keyed ``cache_hits``,
  ``cache_misses``, ``host_to_device_bytes`` (deltas per device snapshot), ``host_cache_usage_perc``
  and ``pending_page_transfers`` (levels: the last value counts), plus eviction histograms;
- under MultiConnector: ``{"HiSparseConnector": <that dict>, "NixlConnector": {...}, ...}``.

Each HiSparse miss swaps one KV row in (the worker records ``bytes = misses * row_bytes``), so rows
swapped in are the misses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hisparse_runtime.plugin.metrics import HiSparseMetrics

__all__ = ["CONNECTOR_NAME", "hisparse_payload", "observe"]

CONNECTOR_NAME = "HiSparseConnector"
_MARKERS = ("cache_hits", "cache_misses", "host_to_device_bytes")


def hisparse_payload(kv_connector_stats: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The HiSparse part of a connector stats payload, or None when HiSparse reported nothing."""
    if not kv_connector_stats:
        return None
    nested = kv_connector_stats.get(CONNECTOR_NAME)
    if isinstance(nested, Mapping):
        return nested
    if any(key in kv_connector_stats for key in _MARKERS):
        return kv_connector_stats
    return None


def observe(metrics: HiSparseMetrics, labels: tuple[str, str], kv_connector_stats: Mapping[str, Any] | None) -> bool:
    """Add one stats payload to the metrics; returns whether it held HiSparse data."""
    data = hisparse_payload(kv_connector_stats)
    if data is None:
        return False
    hits = _total(data, "cache_hits")
    misses = _total(data, "cache_misses")
    moved = _total(data, "host_to_device_bytes")
    if hits:
        metrics.hits.labels(*labels).inc(hits)
    if misses:
        metrics.misses.labels(*labels).inc(misses)
        metrics.rows_in.labels(*labels).inc(misses)
    if moved:
        metrics.bytes_in.labels(*labels).inc(moved)
    usage = _last(data, "host_cache_usage_perc")
    if usage is not None:
        metrics.pool_usage.labels(*labels).set(usage)
    pending = _last(data, "pending_page_transfers")
    if pending is not None:
        metrics.pending_pages.labels(*labels).set(pending)
    return True


def _total(data: Mapping[str, Any], key: str) -> float:
    values = data.get(key) or []
    total = float(sum(values))
    if total < 0:
        raise ValueError(f"negative {key} delta {total} in HiSparse stats")
    return total


def _last(data: Mapping[str, Any], key: str) -> float | None:
    values = data.get(key) or []
    return float(values[-1]) if values else None
