"""The reference pages of the docs site are what the code generates, and they follow the code: a new field,
value, metric, alert, command or reason changes its page (or, for a reason without advice, stops the
generation)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import typer
import typer.main
from prometheus_client import Counter

from hisparse_operator import docs_reference as D


@pytest.fixture(scope="module")
def sources() -> D.Sources:
    return D.Sources.load()


def test_generated_pages_are_current(sources: D.Sources) -> None:
    stale = D.stale(pages=D.generate(sources))
    assert not stale, f"{stale} are stale: run `python -m hisparse_operator.docs_reference` and commit docs/"


def test_every_page_is_generated_and_named_in_the_nav() -> None:
    nav = (D.REPO / "mkdocs.yml").read_text()
    for rel in D.PAGES:
        assert f" {rel}\n" in nav, f"{rel} is not in mkdocs.yml's nav"


def test_a_new_crd_field_and_its_rule_show_on_the_page(sources: D.Sources) -> None:
    crd = copy.deepcopy(sources.crd)
    rollout = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["rollout"]
    rollout["properties"]["warmupSeconds"] = {
        "type": "integer", "default": 120, "minimum": 0, "maximum": 3600,
        "description": "Seconds a candidate replica warms up before it counts as ready capacity.",
    }
    rollout.setdefault("x-kubernetes-validations", []).append({
        "rule": "self.warmupSeconds <= self.readyTimeoutSeconds", "fieldPath": ".warmupSeconds",
        "message": "warmupSeconds must fit in readyTimeoutSeconds"})
    before, after = D.crd_page(sources), D.crd_page(dataclasses.replace(sources, crd=crd))
    assert after != before
    assert "#### `spec.rollout.warmupSeconds` {#spec.rollout.warmupSeconds}" in after
    assert "`integer` · optional · default `120`" in after and "<= `3600`" in after
    assert "warms up before it counts as ready capacity" in after
    assert "rule `self.warmupSeconds <= self.readyTimeoutSeconds` (at `spec.rollout.warmupSeconds`)" in after
    assert "warmupSeconds" not in before


def test_a_new_chart_value_shows_on_the_page(sources: D.Sources) -> None:
    schema = copy.deepcopy(sources.values_schema)
    schema["properties"]["leaderElectionSeconds"] = {"type": "integer", "default": 15, "minimum": 1,
                                                     "description": "How often a replica renews its lease."}
    after = D.values_page(dataclasses.replace(sources, values_schema=schema))
    assert "## `leaderElectionSeconds` {#leaderElectionSeconds}" in after
    assert "`integer` · default `15`" in after and "renews its lease" in after
    assert "leaderElectionSeconds" not in D.values_page(sources)


def test_a_new_metric_shows_on_the_page(sources: D.Sources) -> None:
    widget = Counter("hisparse_operator_rollbacks_total", "Rollbacks by cause", ["namespace", "name", "cause"],
                     registry=None)
    after = D.metrics_page(dataclasses.replace(sources, metrics=(*sources.metrics, D.Metric.of(widget))))
    row = next(line for line in after.splitlines() if "hisparse_operator_rollbacks_total" in line)
    assert '<a id="hisparse_operator_rollbacks_total"></a>' in row
    assert "| counter | `namespace`, `name`, `cause` | Rollbacks by cause. |" in row
    assert "hisparse_operator_rollbacks_total" not in D.metrics_page(sources)


def test_every_operator_metric_is_on_the_page(sources: D.Sources) -> None:
    from hisparse_operator.controller import metrics

    page = D.metrics_page(sources)
    assert sources.metrics and len(sources.metrics) == len(
        [v for v in vars(metrics).values() if type(v).__module__ == "prometheus_client.metrics"])
    for m in sources.metrics:
        assert f'<a id="{m.series[0]}"></a>' in page
    assert "`hisparse_operator_reconcile_duration_seconds_bucket`" in page  # a histogram's series


def test_a_new_alert_shows_on_the_page_with_its_runbook(sources: D.Sources) -> None:
    alerts = copy.deepcopy(sources.alerts)
    alerts["groups"][0]["rules"].append({
        "alert": "HiSparseCanaryStuck", "expr": "hisparse_operator_canary_phase{phase=\"Parity\"} == 1", "for": "2h",
        "labels": {"severity": "warning"},
        "annotations": {"summary": "A canary of {{ $labels.name }} is stuck", "description": "It waits."}})
    after = D.alerts_page(dataclasses.replace(sources, alerts=alerts))
    assert "### HiSparseCanaryStuck {#HiSparseCanaryStuck}" in after
    assert "[runbook](../runbooks/HiSparseCanaryStuck.md)" in after and "for `2h`" in after
    assert "HiSparseCanaryStuck" not in D.alerts_page(sources)


def test_every_alert_links_its_runbook(sources: D.Sources) -> None:
    page = D.alerts_page(sources)
    names = [r["alert"] for g in sources.alerts["groups"] for r in g["rules"] if r.get("alert")]
    assert names
    for name in names:
        assert f"[runbook](../runbooks/{name}.md)" in page
        assert (D.DOCS_DIR / "runbooks" / f"{name}.md").is_file()


def test_a_new_command_and_option_show_on_the_page(sources: D.Sources) -> None:
    app = typer.Typer()

    @app.command()
    def render() -> None:
        """Render."""

    @app.command("diff")
    def diff(since: str = typer.Option("HEAD", "--since", help="Compare with this revision")) -> None:
        """Show what a change of FILE would change in the cluster."""

    page = D.cli_page(dataclasses.replace(sources, cli=typer.main.get_command(app)))
    assert "## `hisparse diff` {#hisparse-diff}" in page
    assert '<a id="hisparse-diff-since"></a>`--since` | text | `HEAD` | Compare with this revision |' in page


def test_the_cli_page_names_every_command(sources: D.Sources) -> None:
    page = D.cli_page(sources)
    for path in ("hisparse-render", "hisparse-validate", "hisparse-crd", "hisparse-operator-run", "hisparse-dev-up",
                 "hisparse-rollout-promote", "hisparse-chart-test"):
        assert f"{{#{path}}}" in page, path
    assert '<a id="hisparse-dev-up-real-node"></a>`--real-node` / `--no-real-node`' in page


def test_a_reason_or_exit_code_without_advice_stops_the_generation(sources: D.Sources) -> None:
    reasons = (*sources.reasons, D.Reason("CANARY_THROTTLED", "CanaryThrottled"))
    with pytest.raises(ValueError, match=r"condition reasons without advice \['CanaryThrottled'\]"):
        D.reasons_page(dataclasses.replace(sources, reasons=reasons))
    codes = {**sources.preflight_exit_codes, "numa": 43}
    with pytest.raises(ValueError, match=r"preflight checks without advice \['numa'\]"):
        D.exit_codes_page(dataclasses.replace(sources, preflight_exit_codes=codes))
    fewer = tuple(r for r in sources.reasons if r.value != "RolloutHeld")
    with pytest.raises(ValueError, match=r"advice for unknown condition reasons \['RolloutHeld'\]"):
        D.conditions_page(dataclasses.replace(sources, reasons=fewer))


def test_reasons_come_from_the_code(sources: D.Sources) -> None:
    from hisparse_operator.controller import conditions

    values = {v for k, v in vars(conditions).items() if k.isupper() and isinstance(v, str)}
    assert {r.value for r in sources.reasons} == values
    assert {"Diverged", "EndpointError", "NoSummary", "JobFailed", "TimedOut", "TooFewPrompts"} <= set(sources.parity_reasons)
    assert {"RepeatedExits", "Unschedulable", "CrashLoopBackOff"} <= set(sources.failure_reasons)
    assert [t for t, _ in sources.condition_types][:2] == ["ConfigValid", "ModelReady"]
    assert all(meaning for _, meaning in sources.condition_types), sources.condition_types
    page = D.exit_codes_page(sources)
    for check, code in sources.preflight_exit_codes.items():
        assert f"### {code}: `{check}` {{#exit-{code}}}" in page


@pytest.mark.parametrize(("text", "shown"), [
    ("the Service `<name>-serving` and <name>-canary", "the Service `<name>-serving` and &lt;name&gt;-canary"),
    ("VLLM_* variables, ``double`` ticks", "VLLM_\\* variables, `double` ticks"),
    ("pvc://CLAIM[/SUBPATH] {{pods}}", "pvc://CLAIM\\[/SUBPATH\\] \\{\\{pods\\}\\}"),
])
def test_prose_from_the_code_is_shown_as_written(text: str, shown: str) -> None:
    assert D.md(text) == shown


def test_a_new_runtime_option_and_plugin_metric_show_on_the_runtime_page(sources: D.Sources) -> None:
    runtime = copy.deepcopy(sources.runtime)
    serve = next(c for c in runtime["commands"] if c["path"] == ["serve"])
    serve["options"].append({"flags": ["--drain-seconds"], "positional": False, "kind": "integer", "required": False,
                             "default": 120, "help": "seconds vLLM drains after SIGTERM"})
    runtime["metrics"].append({"name": "hisparse_hot_buffer_evictions", "kind": "counter",
                               "help": "Rows evicted from the GPU hot buffer.", "labels": ["engine"]})
    before, after = D.runtime_page(sources), D.runtime_page(dataclasses.replace(sources, runtime=runtime))
    assert '<a id="runtime-serve-drain-seconds"></a>`--drain-seconds` | integer | `120` | seconds vLLM drains' in after
    assert '`hisparse_hot_buffer_evictions_total` | counter | `engine` | Rows evicted' in after
    assert "drain-seconds" not in before and "evictions" not in before
    # What the runtime really has is there: every command and every plugin family.
    assert "## `hisparse-runtime serve` {#runtime-serve}" in before and "`hisparse_hot_buffer_hits_total`" in before
