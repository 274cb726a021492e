"""Every alert and dashboard panel of the chart, evaluated against Prometheus after it scraped real pods.

On the real node: the Prometheus Operator runs Prometheus (:mod:`hisparse_devcluster.monitoring`); the
operator is a pod installed by Helm with the chart's ServiceMonitor and PrometheusRule enabled
(:mod:`hisparse_devcluster.operator_pod`); the CPU example (``examples/cpu-tiny.yaml``) serves with the
PodMonitors the operator renders for it. Then the things the alerts watch are made to happen for real:
completions through decode (hot buffer, host pool, vLLM request gauges), a candidate of a build that
computes other tokens (``HISPARSE_CPU_ENGINE_PERTURB``: parity fails, the canary is rolled back), an
admission policy that refuses the operator's writes (failed reconciles), and a create while no operator
replica answers the webhook (the apiserver's webhook error counter).

The proof, per expression: every metric it names has series scraped from a target (an expression naming
a metric nothing exports fails here), and the expression evaluated (an alert without its threshold, a
panel with every variable set to "all") returns series.

Without :mod:`hisparse_devcluster.operator_pod` in the tree, the operator runs as a host process (as in
``test_e2e_cpu_example.py``): its ``/metrics`` is on the host's loopback, which Prometheus inside the
node's network namespace cannot reach, so every expression naming ``hisparse_operator_*`` fails saying
it was not checked; the runtime's, vLLM's and the apiserver's are checked all the same.
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, get_json
from e2e_realnode import via_envoy_standin
from hisparse_devcluster import Cluster, cpu_example, monitoring, monitoring_exprs
from hisparse_devcluster.realnode import RealNode

pytestmark = [pytest.mark.slow, pytest.mark.host]

DOC = cpu_example.example_doc()
NAME, NAMESPACE = DOC["metadata"]["name"], DOC["metadata"]["namespace"]
READY_TIMEOUT = 900.0
ROLLBACK_TIMEOUT = 1200.0
FIRED = "HiSparseOperatorAbsent"
"""The alert this module drives to firing in Prometheus for real (the operator stopped), its `for` set to 0s
through the chart's values, as a user tunes an alert."""
MONITORING_VALUES = {"monitoring": {"serviceMonitor": {"enabled": True, "interval": monitoring.SCRAPE_INTERVAL},
                                    "prometheusRule": {"enabled": True, "alerts": {FIRED: {"for": "0s"}}},
                                    "dashboards": {"enabled": True}}}


@pytest.fixture(scope="module")
def stack(cluster: Cluster, node: RealNode) -> Iterator[monitoring.PrometheusStack]:
    s = monitoring.PrometheusStack(cluster, node)
    s.install()
    try:
        yield s
    finally:
        s.uninstall()


OPERATOR_POD = importlib.util.find_spec("hisparse_devcluster.operator_pod") is not None


@pytest.fixture(scope="module")
def operator(cluster: Cluster, node: RealNode, stack: monitoring.PrometheusStack,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The operator pod installed by Helm with the chart's monitoring on; without it, a host process."""
    if OPERATOR_POD:
        from hisparse_devcluster.operator_pod import OperatorRelease

        r = OperatorRelease(cluster)
        r.install(r.load_image(node), MONITORING_VALUES)
        try:
            yield r
        finally:
            cluster.kubectl("delete", "hsd", NAME, "-n", NAMESPACE, "--wait=true", "--timeout=180s", check=False)
            cpu_example.remove(cluster)  # what `scraped` prepared: the next module finds the cluster as it was
            r.uninstall()
        return
    from test_e2e_cpu_example import start_host_operator

    op = start_host_operator(cluster, tmp_path_factory.mktemp("operator"))
    try:
        yield op
    finally:
        cluster.kubectl("delete", "hsd", NAME, "-n", NAMESPACE, "--wait=true", "--timeout=180s", check=False)
        cpu_example.remove(cluster)
        op.stop()


def _conditions(cluster: Cluster) -> dict[str, str]:
    obj = get_json(cluster, "hsd", NAME, "-n", NAMESPACE)
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions", [])}


def _completions(cluster: Cluster, n: int) -> None:
    """``n`` completions through the deployment's Service, sent from the decode pod."""
    from hisparse_operator import names

    (decode,) = get_json(cluster, "pods", "-n", NAMESPACE, "-l", "serving.hisparse.dev/role=decode")["items"]
    url = f"http://{names.service_host(names.serving(NAME), NAMESPACE)}:8000/v1/completions"
    body = json.dumps({"model": DOC["spec"]["model"]["servedModelName"], "prompt": list(range(7, 97)),
                       "max_tokens": 8, "temperature": 0})
    script = ("import sys, urllib.request\nfor _ in range(int(sys.argv[3])):\n"
              "    urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), "
              "headers={'content-type': 'application/json'}), timeout=120).read()")
    cluster.kubectl("exec", "-n", NAMESPACE, decode["metadata"]["name"], "-c", "vllm", "--", "python3", "-c",
                    script, url, body, str(n), timeout=600)


@pytest.fixture(scope="module")
def scraped(cluster: Cluster, node: RealNode, stack: monitoring.PrometheusStack, operator: Any) -> dict[str, Any]:
    """The CPU example served, driven through what the alerts watch, and scraped."""
    cpu_example.prepare(cluster, node)
    _apply_example(cluster, node)
    try:
        eventually(lambda: _conditions(cluster).get("Ready") == "True", what=f"{NAME} Ready", timeout=READY_TIMEOUT)
    except AssertionError:
        print(cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout)
        raise
    # The rendered PodMonitors reach Prometheus through the operator's config Secret, which the kubelet
    # syncs into the Prometheus pod within its sync period (up to about a minute): wait until the example's
    # pods are scraped before making anything happen, so every event is seen by at least one scrape.
    stack.wait_for(f"the example's pods scraped through its PodMonitors ({NAMESPACE})",
                   lambda: any(t["scrapePool"].startswith(f"podMonitor/{NAMESPACE}/") and t["health"] == "up"
                               for t in stack.targets()), timeout=300)
    _completions(cluster, 6)
    # Through llm-d as a gateway sends requests (the EPP's series, the P/D split): one prompt long enough to
    # be disaggregated, one short enough to prefill on decode.
    from hisparse_operator.api import llmd

    threshold = llmd.threshold_chars(DOC["spec"]["routing"]["pdThresholdTokens"])
    for prompt in ("the quick brown fox " * (threshold // 20 + 8), "short prompt"):
        res = via_envoy_standin(cluster, node, NAMESPACE, DOC["spec"]["model"]["servedModelName"], prompt, 4,
                                pool=NAME)
        assert res["status"] == 200, res

    if OPERATOR_POD:
        # A candidate whose build computes other tokens: parity fails and the operator rolls it back.
        patch = {"spec": {"engine": {"extraEnv": {"HISPARSE_CPU_ENGINE_PERTURB": "1"}}}}
        cluster.kubectl("patch", "hsd", NAME, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch))
        eventually(lambda: _conditions(cluster).get("Degraded") == "True",
                   what="the perturbed candidate rolled back", timeout=ROLLBACK_TIMEOUT)
        # An admission policy refuses the operator's Service writes while its Service is gone: reconciles fail.
        _refuse_service_writes(cluster, operator, stack)

    # No operator replica answers the webhook for a moment: the apiserver counts the failed calls, and (with
    # the operator as a pod scraped through the chart's ServiceMonitor) Prometheus fires HiSparseOperatorAbsent.
    firing = f'ALERTS{{alertname="{FIRED}", alertstate="firing"}}'
    _stop_operator(cluster, operator)
    doc = yaml.safe_load(cpu_example.EXAMPLE.read_text())
    doc["metadata"]["name"] = "webhook-down"
    refused = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
    fired = False
    if OPERATOR_POD:
        stack.wait_for(f"{FIRED} firing while no operator runs", lambda: bool(stack.query(firing)), timeout=180)
        fired = True
    _start_operator(cluster, operator)
    assert refused.returncode != 0 and "failed calling webhook" in refused.stderr, refused.stderr
    if fired:
        stack.wait_for(f"{FIRED} resolved once the operator runs again", lambda: not stack.query(firing), timeout=180)

    # Two scrapes of every target after the last event, so every rate() has two samples.
    time.sleep(2 * max(_seconds(t["scrapeInterval"]) for t in stack.targets()) + 5)
    return {"targets": stack.targets(), "fired": fired}


def _apply_example(cluster: Cluster, node: RealNode, timeout: float = 120.0) -> None:
    """Apply the example. The webhook counts the nodes the example's pods could land on now: once in three
    runs (2026-12-06) it found none, right after the stack, the operator pod and the example's images came
    up on the node, and the same apply passed moments later. A refusal for that reason is tried again for up
    to ``timeout``, with what the node showed each time; any other refusal fails at once."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        res = cluster.kubectl("apply", "-f", str(cpu_example.EXAMPLE), check=False)
        if res.returncode == 0:
            if seen:
                print(f"the example was admitted after {len(seen)} refusal(s):\n" + "\n".join(seen))
            return
        doc = get_json(cluster, "node", node.name)
        seen.append(f"{res.stderr.strip()}\n  node: allocatable {doc['status'].get('allocatable')}, taints "
                    f"{doc['spec'].get('taints')}, unschedulable {doc['spec'].get('unschedulable')}, conditions "
                    f"{[(c['type'], c['status']) for c in doc['status'].get('conditions', [])]}")
        if "can be scheduled on" not in res.stderr or time.monotonic() > deadline:
            raise AssertionError("the example was refused:\n" + "\n".join(seen))
        time.sleep(3)


def _stop_operator(cluster: Cluster, operator: Any) -> None:
    if OPERATOR_POD:
        cluster.kubectl("scale", "-n", operator.namespace, f"deployment/{operator.fullname}", "--replicas=0")
        cluster.kubectl("wait", "-n", operator.namespace, "--for=delete", "pod", "-l", operator.selector,
                        "--timeout=120s", check=False)
    else:
        operator.stop()


def _start_operator(cluster: Cluster, operator: Any) -> None:
    if OPERATOR_POD:
        cluster.kubectl("scale", "-n", operator.namespace, f"deployment/{operator.fullname}", "--replicas=1")
        operator.wait_webhook()
    else:
        operator.spawn()
        operator.wait_serving()


def _seconds(duration: str) -> float:
    """A Prometheus duration as the targets API reports it (``5s``, ``30s``, ``1m``, ``1m30s``)."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+)(ms|s|m|h)", duration))


def _refuse_service_writes(cluster: Cluster, release: Any, stack: monitoring.PrometheusStack) -> None:
    """A ValidatingAdmissionPolicy denies the operator's ServiceAccount every Service write in the example's
    namespace; the serving Service is deleted, so the operator's reconcile to restore it fails until the
    policy goes. Waits until Prometheus has scraped a failed reconcile."""
    from hisparse_operator import names

    name = "e2e-refuse-operator-service-writes"
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": name},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                               "operations": ["CREATE", "UPDATE"],
                                                               "resources": ["services"]}]},
                       "validations": [{"expression": f"request.userInfo.username != '{release.service_account}'",
                                        "message": "refused by the monitoring e2e"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name},
               "spec": {"policyName": name, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {
                            "kubernetes.io/metadata.name": NAMESPACE}}}}}
    cluster.apply([policy, binding])
    try:
        time.sleep(2)  # the policy reaches the apiserver's admission cache
        cluster.kubectl("delete", "service", names.serving(NAME), "-n", NAMESPACE)
        eventually(lambda: stack.query('sum(hisparse_operator_reconciles_total{result="error"}) > 0'),
                   what="a failed reconcile scraped from the operator pod", timeout=300)
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name,
                        "--ignore-not-found", check=False)
    eventually(lambda: cluster.kubectl("get", "service", names.serving(NAME), "-n", NAMESPACE,
                                       check=False).returncode == 0,
               what="the operator restoring the serving Service", timeout=300)


def _exprs() -> list[tuple[str, str]]:
    out = [(f"alert {r['alert']}", monitoring_exprs.alert_signal(r["expr"])) for r in monitoring_exprs.alert_rules()]
    # Panels as an on-call engineer opens the dashboard: set to this namespace and deployment, every revision.
    selected = {"namespace": NAMESPACE, "deployment": NAME}
    out += [(f"panel {title}", monitoring_exprs.panel_query(expr, values=selected))
            for title, expr in monitoring_exprs.dashboard_targets()]
    return out


EXPRS = _exprs()


def test_every_target_is_up(scraped: dict[str, Any]) -> None:
    pools = {t["scrapePool"]: t["health"] for t in scraped["targets"]}
    assert any(p.startswith(f"podMonitor/{NAMESPACE}/") for p in pools), pools
    if OPERATOR_POD:
        assert any(p.startswith("serviceMonitor/hisparse-system/") for p in pools), pools
    down = {p: h for p, h in pools.items() if h != "up"}
    assert not down, f"targets not scraped: {down}"


def test_operator_series_keep_the_deployment_s_namespace(cluster: Cluster, stack: monitoring.PrometheusStack,
                                                          operator: Any, scraped: dict[str, Any]) -> None:
    """Scraped through the chart's ServiceMonitor, the operator's per-deployment series name the deployment's
    namespace, not the operator's (Prometheus Operator renames a target label the series carries unless the
    endpoint honors the series' labels)."""
    if not OPERATOR_POD:
        pytest.fail("NOT CHECKED: the operator runs as a host process here, not scraped through the chart's "
                    "ServiceMonitor", pytrace=False)
    series = stack.query(f'hisparse_operator_deployments{{name="{NAME}"}}')
    assert series, "the operator exports no series for the example"
    assert {s["metric"].get("namespace") for s in series} == {NAMESPACE}, series
    assert not stack.query('count({__name__=~"hisparse_operator_.+", exported_namespace!=""})'), \
        "operator series renamed to exported_namespace"
    # The negative control: the chart's ServiceMonitor without honorLabels, scraped by the same Prometheus
    # under another name, loses the deployment's namespace (the bug this guards against), then goes.
    (sm,) = json.loads(cluster.kubectl("get", "servicemonitor", "-n", operator.namespace, "-o", "json").stdout)["items"]
    copy = {"apiVersion": sm["apiVersion"], "kind": "ServiceMonitor",
            "metadata": {"name": "e2e-without-honor-labels", "namespace": operator.namespace},
            "spec": {**sm["spec"], "endpoints": [{k: v for k, v in e.items() if k != "honorLabels"}
                                                  for e in sm["spec"]["endpoints"]]}}
    cluster.apply([copy])
    renamed = f'hisparse_operator_deployments{{name="{NAME}", namespace="{operator.namespace}", exported_namespace="{NAMESPACE}"}}'
    try:
        stack.wait_for("the operator scraped without honorLabels, its namespace renamed", lambda: bool(stack.query(renamed)),
                       timeout=240)
    finally:
        cluster.kubectl("delete", "servicemonitor", "-n", operator.namespace, "e2e-without-honor-labels",
                        "--ignore-not-found", check=False)


def test_an_alert_fired_in_prometheus_for_real(scraped: dict[str, Any]) -> None:
    """Not only evaluated: Prometheus loaded the chart's PrometheusRule (with the `for` the values set), and
    the operator stopped fired HiSparseOperatorAbsent, which resolved when it came back."""
    if not OPERATOR_POD:
        pytest.fail(f"NOT CHECKED: {FIRED} needs the operator scraped as a pod", pytrace=False)
    assert scraped["fired"]


@pytest.mark.parametrize(("what", "expr"), EXPRS, ids=[w for w, _ in EXPRS])
def test_expression_returns_series_from_real_pods(stack: monitoring.PrometheusStack, scraped: dict[str, Any],
                                                  what: str, expr: str) -> None:
    named = monitoring_exprs.metric_names(expr)
    if not OPERATOR_POD and any(n.startswith("hisparse_operator_") for n in named):
        pytest.fail(f"{what}: NOT CHECKED: it names the operator's metrics, and the operator runs as a host "
                    "process here (no hisparse_devcluster.operator_pod in this tree): its /metrics is on the host's "
                    "loopback, which Prometheus in the node's network namespace cannot reach", pytrace=False)
    missing = sorted(n for n in named if not stack.query(f'count({{__name__="{n}", job!=""}})'))
    assert not missing, f"{what}: no target exports {missing}"
    series = stack.query(expr)
    assert series, f"{what}: {expr} returned no series"
