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
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, get_json
from hisparse_devcluster import Cluster, Tools, cpu_example, monitoring, monitoring_exprs
from hisparse_devcluster.realnode import RealNode

pytestmark = pytest.mark.slow

DOC = cpu_example.example_doc()
NAME, NAMESPACE = DOC["metadata"]["name"], DOC["metadata"]["namespace"]
READY_TIMEOUT = 900.0
ROLLBACK_TIMEOUT = 1200.0
MONITORING_VALUES = {"monitoring": {"serviceMonitor": {"enabled": True, "interval": monitoring.SCRAPE_INTERVAL},
                                    "prometheusRule": {"enabled": True}, "dashboards": {"enabled": True}}}


@pytest.fixture(scope="module")
def node(cluster: Cluster, tools: Tools) -> Iterator[RealNode]:
    n = RealNode(cluster, tools=tools).start()
    try:
        yield n
    finally:
        n.stop()
        assert not n.leftovers(), n.leftovers()


@pytest.fixture(scope="module")
def stack(cluster: Cluster, node: RealNode) -> Iterator[monitoring.PrometheusStack]:
    s = monitoring.PrometheusStack(cluster, node)
    s.install()
    try:
        yield s
    finally:
        s.uninstall()


@pytest.fixture(scope="module")
def release(cluster: Cluster, node: RealNode, stack: monitoring.PrometheusStack) -> Iterator[Any]:
    """The operator pod, installed by Helm with the chart's monitoring on."""
    try:
        from hisparse_devcluster.operator_pod import OperatorRelease
    except ImportError:
        pytest.fail("the operator pod installed by Helm (hisparse_devcluster.operator_pod) is not in this tree: "
                    "the hisparse_operator_* expressions cannot be checked without it", pytrace=False)
    r = OperatorRelease(cluster)
    r.install(r.load_image(node), MONITORING_VALUES)
    try:
        yield r
    finally:
        cluster.kubectl("delete", "hsd", NAME, "-n", NAMESPACE, "--wait=true", "--timeout=180s", check=False)
        r.uninstall()


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
def scraped(cluster: Cluster, node: RealNode, stack: monitoring.PrometheusStack, release: Any) -> dict[str, Any]:
    """The CPU example served, driven through what the alerts watch, and scraped."""
    cpu_example.prepare(cluster, node)
    cluster.kubectl("apply", "-f", str(cpu_example.EXAMPLE))
    eventually(lambda: _conditions(cluster).get("Ready") == "True", what=f"{NAME} Ready", timeout=READY_TIMEOUT)
    _completions(cluster, 6)

    # A candidate whose build computes other tokens: parity fails and the operator rolls it back.
    patch = {"spec": {"engine": {"extraEnv": {"HISPARSE_CPU_ENGINE_PERTURB": "1"}}}}
    cluster.kubectl("patch", "hsd", NAME, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch))
    eventually(lambda: _conditions(cluster).get("Degraded") == "True", what="the perturbed candidate rolled back",
               timeout=ROLLBACK_TIMEOUT)

    # An admission policy refuses the operator's Service writes while its Service is gone: reconciles fail.
    _refuse_service_writes(cluster, release, stack)

    # No operator replica answers the webhook for a moment: the apiserver counts the failed calls.
    deployment = f"deployment/{release.fullname}"
    cluster.kubectl("scale", "-n", release.namespace, deployment, "--replicas=0")
    cluster.kubectl("wait", "-n", release.namespace, "--for=delete", "pod", "-l", release.selector, "--timeout=120s",
                    check=False)
    doc = yaml.safe_load(cpu_example.EXAMPLE.read_text())
    doc["metadata"]["name"] = "webhook-down"
    refused = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert refused.returncode != 0 and "failed calling webhook" in refused.stderr, refused.stderr
    cluster.kubectl("scale", "-n", release.namespace, deployment, "--replicas=1")
    release.wait_webhook()

    # Two scrapes of every target after the last event, so every rate() has two samples.
    time.sleep(2 * max(_seconds(t["scrapeInterval"]) for t in stack.targets()) + 5)
    return {"targets": stack.targets()}


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
    out += [(f"panel {title}", monitoring_exprs.panel_query(expr)) for title, expr in monitoring_exprs.dashboard_targets()]
    return out


EXPRS = _exprs()


def test_every_target_is_up(scraped: dict[str, Any]) -> None:
    pools = {t["scrapePool"]: t["health"] for t in scraped["targets"]}
    assert any(p.startswith(f"serviceMonitor/{'hisparse-system'}/") for p in pools), pools
    assert any(p.startswith(f"podMonitor/{NAMESPACE}/") for p in pools), pools
    down = {p: h for p, h in pools.items() if h != "up"}
    assert not down, f"targets not scraped (an EPP target down is the EPP's /metrics authorization): {down}"


@pytest.mark.parametrize(("what", "expr"), EXPRS, ids=[w for w, _ in EXPRS])
def test_expression_returns_series_from_real_pods(stack: monitoring.PrometheusStack, scraped: dict[str, Any],
                                                  what: str, expr: str) -> None:
    missing = sorted(n for n in monitoring_exprs.metric_names(expr)
                     if not stack.query(f'count({{__name__="{n}", job!=""}})'))
    assert not missing, f"{what}: no target exports {missing}"
    series = stack.query(expr)
    assert series, f"{what}: {expr} returned no series"
