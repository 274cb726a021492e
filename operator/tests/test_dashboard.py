"""The chart's Grafana dashboard says what it shows: a unit on every panel that agrees with what its
queries measure, the serving figures the issue asks for, and per-revision series so a canary's candidate
and the stable revision show side by side. (Well-formedness and the ConfigMap: test_chart_monitoring.)"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from hisparse_devcluster.monitoring_exprs import DASHBOARD, metric_names

GRAFANA_UNITS = {"s", "ms", "Bps", "bytes", "percent", "percentunit", "reqps", "ops", "bool"}
"""Grafana unit ids the dashboard may use; a custom unit is written ``suffix: <text>``."""


def panels() -> list[dict[str, Any]]:
    return json.loads(DASHBOARD.read_text())["panels"]


def measured_units(expr: str) -> set[str] | None:
    """The units an expression's result can be shown in, where its metric names tell (None: they don't).
    Prometheus' base units (seconds, bytes) stay in the query: scaling is Grafana's job, so a query divided
    or multiplied by a power of ten has no right unit."""
    if re.search(r"[*/]\s*1e\d+|[*/]\s*10{3,}\b", expr):
        return set()
    names = metric_names(expr)
    if expr.lstrip().startswith("histogram_quantile(") and all(n.endswith("_seconds_bucket") for n in names):
        return {"s", "ms"}
    if "rate(" in expr and names and all("bytes" in n for n in names):
        return {"Bps"}
    if names and all(n.endswith(("_ratio", "_perc")) for n in names):
        return {"percentunit"}
    return None


def unit_problems(panel: dict[str, Any]) -> list[str]:
    unit = (panel.get("fieldConfig", {}).get("defaults", {}) or {}).get("unit") or ""
    title = panel.get("title")
    if not (unit in GRAFANA_UNITS or re.fullmatch(r"suffix: ?\S.*", unit)):
        return [f"{title}: unit {unit!r} is not one of {sorted(GRAFANA_UNITS)} or 'suffix: <text>'"]
    out = []
    for t in panel["targets"]:
        want = measured_units(t["expr"])
        if want is not None and unit not in want:
            out.append(f"{title}: unit {unit!r}, but {t['expr']!r} is in {sorted(want) or 'no unit (scaled)'}")
    return out


def test_every_panel_has_a_unit_that_fits_its_queries() -> None:
    problems = [p for panel in panels() for p in unit_problems(panel)]
    assert not problems, problems


@pytest.mark.parametrize(("unit", "expr"), [
    ("short", 'sum by (pod) (rate(hisparse_swapped_in_bytes_total{pod=~"$p"}[5m])) / 1e9'),  # "GB/s" by hand
    ("Bps", 'sum by (pod) (rate(hisparse_swapped_in_bytes_total{pod=~"$p"}[5m])) / 1e9'),
    ("percentunit", "histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket[5m])))"),
    ("s", "max(vllm:kv_cache_usage_perc)"),
    ("", "max(vllm:num_requests_running)"),
    ("requests", "max(vllm:num_requests_running)"),
])
def test_a_panel_with_a_wrong_or_missing_unit_is_caught(unit: str, expr: str) -> None:
    panel = {"title": "Broken", "fieldConfig": {"defaults": {"unit": unit}}, "targets": [{"expr": expr}]}
    assert unit_problems(panel)


ISSUE_FIGURES = {
    "vllm:time_to_first_token_seconds_bucket": "TTFT",
    "vllm:inter_token_latency_seconds_bucket": "ITL",
    "vllm:e2e_request_latency_seconds_bucket": "e2e latency",
    "vllm:request_success_total": "throughput",
    "vllm:generation_tokens_total": "throughput",
    "vllm:num_requests_waiting": "queue",
    "vllm:kv_cache_usage_perc": "KV cache",
    "vllm:prefix_cache_hits_total": "prefix-cache hit rate",
    "vllm:nixl_xfer_time_seconds_bucket": "NIXL transfer time",
    "vllm:nixl_num_failed_transfers_total": "NIXL failures",
    "llm_d_inference_scheduler_pd_decision_total": "EPP decisions",
    "vllm:prompt_tokens_by_source_total": "P/D split",
    "hisparse_operator_canary_weight_percent": "the canary's progress",
    "hisparse_operator_canary_phase": "the canary's progress",
}
"""What issue 28 asks the dashboard to show -> a metric that shows it."""


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    named = {n for p in panels() for t in p["targets"] for n in metric_names(t["expr"])}
    missing = {figure for name, figure in ISSUE_FIGURES.items() if name not in named}
    assert not missing, missing


def test_serving_panels_show_each_revision() -> None:
    """Every panel of an engine's series (vLLM's, NIXL's, the plugin's) keeps ``revision`` in its result and
    filters on ``$revision``: a candidate's line stands beside the stable one's."""
    bad = []
    for p in panels():
        for t in p["targets"]:
            names = metric_names(t["expr"])
            if not any(n.startswith(("vllm:", "hisparse_")) and not n.startswith("hisparse_operator_") for n in names):
                continue
            groupings = re.findall(r"\bby\s*\(([^)]*)\)", t["expr"])
            if 'revision=~"$revision"' not in t["expr"] or not all("revision" in g for g in groupings) \
                    or "{{revision}}" not in t["legendFormat"]:
                bad.append(f"{p['title']}: {t['expr']}")
    assert not bad, bad


def test_the_canary_sits_beside_the_per_revision_latency() -> None:
    """The canary's weight and phase are on the first row, right above the per-revision latency panels."""
    by_title = {p["title"]: p["gridPos"] for p in panels()}
    top = min(g["y"] for g in by_title.values())
    assert by_title["Canary traffic weight"]["y"] == by_title["Canary phase"]["y"] == top
    below = by_title["Canary traffic weight"]["y"] + by_title["Canary traffic weight"]["h"]
    assert by_title["Time to first token"]["y"] == below
