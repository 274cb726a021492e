"""The plugin's metrics: exposition parsed by Prometheus' own parser and checked by promtool."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hisparse_runtime.plugin import METRIC_TYPES
from hisparse_runtime.plugin.connector_stats import hisparse_payload, observe
from hisparse_runtime.plugin.metrics import HiSparseMetrics

LABELS = ("deepseek-v3.2", "0")

# The payload shape vLLM 0.33 sends: HiSparseKVConnectorStats.data (vllm/distributed/kv_transfer/
# kv_connector/v1/hisparse/stats.py), alone or keyed by connector name under MultiConnector.
HISPARSE_DATA = {
    "cache_hits": [900, 950],
    "cache_misses": [100, 50],
    "host_to_device_bytes": [100 * 656, 50 * 656],
    "host_cache_usage_perc": [0.25, 0.5],
    "pending_page_transfers": [3, 1],
    "host_block_lifetime_seconds": [],
    "host_block_idle_before_evict_seconds": [],
    "host_block_reuse_gap_seconds": [],
}


def exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def families(registry: CollectorRegistry) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(exposition(registry)) if not f.name.endswith("_created")}


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(exposition(registry)):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"no sample {name} {labels}")


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def m(registry: CollectorRegistry) -> HiSparseMetrics:
    return HiSparseMetrics.create(registry)


def test_every_documented_metric_is_exposed_with_its_type(registry: CollectorRegistry, m: HiSparseMetrics) -> None:
    m.set_build_info({"version": "0.1.0", "vllm_version": "0.33.0", "kernels_version": "absent"})
    found = {name: f.type for name, f in families(registry).items()}  # type: ignore[attr-defined]
    assert found == METRIC_TYPES


def test_standalone_connector_stats_feed_counters_and_gauges(registry: CollectorRegistry, m: HiSparseMetrics) -> None:
    assert observe(m, LABELS, HISPARSE_DATA)
    labels = {"model_name": LABELS[0], "engine": LABELS[1]}
    assert sample(registry, "hisparse_hot_buffer_hits_total", **labels) == 1850
    assert sample(registry, "hisparse_hot_buffer_misses_total", **labels) == 150
    assert sample(registry, "hisparse_swapped_in_rows_total", **labels) == 150
    assert sample(registry, "hisparse_swapped_in_bytes_total", **labels) == 150 * 656
    assert sample(registry, "hisparse_host_pool_usage_ratio", **labels) == 0.5, "levels keep the last value"
    assert sample(registry, "hisparse_pending_page_transfers", **labels) == 1


def test_multiconnector_payload_is_found_under_the_connector_name(registry: CollectorRegistry, m: HiSparseMetrics) -> None:
    payload = {"NixlConnector": {"transfer_duration": [0.1]}, "HiSparseConnector": HISPARSE_DATA}
    assert hisparse_payload(payload) is HISPARSE_DATA
    observe(m, LABELS, payload)
    observe(m, LABELS, payload)
    assert sample(registry, "hisparse_hot_buffer_hits_total", engine="0") == 3700, "counters accumulate"


def test_payloads_without_hisparse_change_nothing(registry: CollectorRegistry, m: HiSparseMetrics) -> None:
    before = exposition(registry)
    assert not observe(m, LABELS, None)
    assert not observe(m, LABELS, {"NixlConnector": {"num_failed_transfers": [1]}})
    assert exposition(registry) == before


def test_negative_deltas_are_refused(m: HiSparseMetrics) -> None:
    with pytest.raises(ValueError, match="negative cache_hits"):
        observe(m, LABELS, {"cache_hits": [-5]})


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian package prometheus)")
def test_promtool_accepts_the_exposition(registry: CollectorRegistry, m: HiSparseMetrics) -> None:
    observe(m, LABELS, HISPARSE_DATA)
    m.pool_size.labels(*LABELS).set(160 << 30)
    m.preflight.labels("memlock").set(1)
    m.errors.labels("record").inc()
    m.set_build_info({"version": "0.1.0", "vllm_version": "0.33.0", "kernels_version": "absent"})
    run = subprocess.run(["promtool", "check", "metrics"], input=exposition(registry),
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "" and run.stderr.strip() == "", "no lint findings"
