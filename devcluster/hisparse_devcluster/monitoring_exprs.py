"""The PromQL expressions of the chart's alerts and dashboard, and what evaluating them needs.

One place for reading them: the chart's static tests (``operator/tests/test_chart_monitoring.py``) check
the metric names they select, the e2e suite evaluates them against Prometheus after it scraped real pods.

- :func:`alert_rules`, :func:`dashboard_targets`: the expressions as the chart ships them;
  :func:`variable_selectors`: the series selector of each of the dashboard's ``label_values`` variables.
- :func:`named_metrics`: every metric name the alerts, panels and variables select, each with where.
- :data:`EPP_METRIC_PREFIXES`: the names the EPP exports (checked against a scrape of the real EPP).
- :func:`metric_names`: the metric names an expression selects.
- :func:`panel_query`: a panel's expression with Grafana's variables set to "all" (every variable the
  dashboard defines is used as a regex matcher, ``=~"$name"``), ready for Prometheus.
- :func:`alert_signal`: an alert's expression without its final threshold comparison: the series the
  alert watches. An alert that is silent returns nothing by design, so evaluating the alert as written
  proves nothing about its metrics; its signal returns series exactly when what it watches is exported.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final

import yaml

from ._tools import REPO_ROOT

__all__ = ["ALERTS", "DASHBOARD", "EPP_METRIC_PREFIXES", "alert_rules", "alert_signal", "dashboard_targets",
           "metric_names", "named_metrics", "panel_query", "variable_selectors"]

CHART_FILES: Final = REPO_ROOT / "charts" / "hisparse" / "files"
ALERTS: Final = CHART_FILES / "alerts.yaml"
DASHBOARD: Final = CHART_FILES / "dashboard.json"

EPP_METRIC_PREFIXES: Final = ("inference_objective_", "inference_pool_", "inference_extension_",
                               "llm_d_inference_scheduler_")
"""The EPP's metric namespaces: gateway-api-inference-extension's subsystems (``pkg/epp/metrics``) and
llm-d-inference-scheduler's own (``pkg/metrics``: the P/D decisions)."""

_FUNCS: Final = {"rate", "increase", "sum", "max", "min", "by", "histogram_quantile", "time", "label_values", "and",
                 "or", "without", "count", "avg", "abs", "absent", "on", "ignoring", "group_left", "le", "bool",
                 "unless"}


def alert_rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    """Every alerting rule of the chart's rule file."""
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "alert" in r]


def dashboard_targets(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """``(panel title, expression)`` of every query of every panel of the chart's dashboard."""
    return [(p["title"], t["expr"]) for p in json.loads(path.read_text())["panels"] for t in p["targets"]]


def variable_selectors(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """``(variable, selector)`` of every ``label_values(<selector>, <label>)`` query variable."""
    out = []
    for v in json.loads(path.read_text())["templating"]["list"]:
        query = v.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", text, re.S)
        if v.get("type") == "query" and m:
            out.append((v["name"], m.group(1)))
    return out


def named_metrics(alerts: Path = ALERTS, dashboard: Path = DASHBOARD) -> dict[str, set[str]]:
    """Every metric name the alerts, the panels and the variables select -> where (``alert X``, ...)."""
    out: dict[str, set[str]] = {}
    exprs = [(f"alert {r['alert']}", r["expr"]) for r in alert_rules(alerts)]
    exprs += [(f"panel {t}", e) for t, e in dashboard_targets(dashboard)]
    exprs += [(f"variable {v}", e) for v, e in variable_selectors(dashboard)]
    for where, expr in exprs:
        for name in metric_names(expr):
            out.setdefault(name, set()).add(where)
    return out


def dashboard_variables(path: Path = DASHBOARD) -> set[str]:
    return {v["name"] for v in json.loads(path.read_text())["templating"]["list"]}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (identifiers not followed by ``(`` and not inside ``{}``/``by ()``)."""
    expr = re.sub(r"\{[^}]*\}", "{}", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    names = set()
    for m in re.finditer(r"(?<![\w:$.])([a-zA-Z_:][\w:]*)(\s*\()?", expr):
        word, call = m.group(1), m.group(2)
        if call or word in _FUNCS or re.fullmatch(r"\d+(e\d+)?", word):
            continue
        names.add(word)
    return names


def panel_query(expr: str, variables: set[str] | None = None, values: dict[str, str] | None = None) -> str:
    """``expr`` as Grafana sends it: each dashboard variable set to its value in ``values`` (an exact match, as
    Grafana escapes a single selected value) or else to "all" (``=~"$v"`` -> ``=~".*"``); a variable used any
    other way is refused, since "all" would then not be a regex."""
    variables = dashboard_variables() if variables is None else variables
    values = values or {}

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in variables:
            return m.group(0)
        if name not in values:
            return '=~".*"'
        # A regex metacharacter escaped for the regex, its backslash escaped for PromQL's string literal.
        return '=~"' + re.sub(r"([.+*?()\[\]{}|^$\\])", r"\\\\\1", values[name]) + '"'

    out = re.sub(r'=~"\$(\w+)"', value, expr)
    left = re.findall(r"\$\w+", out)
    if left:
        raise ValueError(f"{expr!r}: variables {left} are not used as =~\"$name\" matchers (or not defined)")
    return out


_THRESHOLD: Final = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*(bool\s+)?[-+]?[\d.]+(e[-+]?\d+)?(\s*[*/]\s*[\d.]+(e[-+]?\d+)?)*\s*$")


def alert_signal(expr: str) -> str:
    """The alert's expression without its final comparison with a constant (``X > 0.9`` -> ``X``)."""
    stripped = _THRESHOLD.sub("", expr.strip())
    if stripped == expr.strip():
        raise ValueError(f"{expr!r} does not end in a comparison with a constant")
    return stripped
