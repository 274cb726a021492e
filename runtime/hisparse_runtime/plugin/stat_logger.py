"""``vllm.stat_logger_plugins`` entry: reads the HiSparse connector stats vLLM hands to stat loggers.

vLLM 0.33 instantiates each plugin class per engine (``cls(vllm_config, engine_index)``) in the API
server process and calls ``record`` once per scheduler update. Every method swallows its own errors
(counted in ``hisparse_plugin_errors_total``): a metrics problem must never stop serving.

Importing this module needs vLLM; if vLLM's logger interface moved, the import fails and vLLM's plugin
loader logs it and carries on without us.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from hisparse_runtime.plugin import connector_stats
from hisparse_runtime.plugin.metrics import metrics

__all__ = ["HiSparseStatLogger", "host_pool_bytes"]

log = logging.getLogger(__name__)
GIB = 1 << 30


def host_pool_bytes(vllm_config: Any) -> int | None:
    """The HiSparse host pool per data-parallel replica, from the KV transfer config, or None."""
    from vllm.config.kv_transfer import hisparse_host_pool_gib

    gib = hisparse_host_pool_gib(getattr(vllm_config, "kv_transfer_config", None))
    return None if gib is None else int(gib * GIB)


def _model_name(vllm_config: Any) -> str:
    model_config = getattr(vllm_config, "model_config", None)
    name = getattr(model_config, "served_model_name", None) or getattr(model_config, "model", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return str(name) if name else ""


class HiSparseStatLogger(StatLoggerBase):
    """Feeds ``hisparse_*`` metrics from ``SchedulerStats.kv_connector_stats``."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self._labels = ("", str(engine_index))
        self._metrics = None
        self._warned = False
        try:
            self._metrics = metrics()
            self._labels = (_model_name(vllm_config), str(engine_index))
            size = host_pool_bytes(vllm_config)
            if size is not None:
                self._metrics.pool_size.labels(*self._labels).set(size)
        except Exception:
            self._fail("init")

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        if self._metrics is None or scheduler_stats is None:
            return
        try:
            connector_stats.observe(self._metrics, self._labels, getattr(scheduler_stats, "kv_connector_stats", None))
        except Exception:
            self._fail("record")

    def log_engine_initialized(self) -> None:
        pass

    def _fail(self, stage: str) -> None:
        if not self._warned:  # once per engine: record() runs every scheduler step
            log.warning("HiSparse metrics: %s failed; continuing without these values", stage, exc_info=True)
            self._warned = True
        try:
            metrics().errors.labels(stage).inc()
        except Exception:
            pass
