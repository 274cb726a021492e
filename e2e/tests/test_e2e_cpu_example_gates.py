"""The canary's gates failing for real on the CPU example's real pods (fixtures of
``e2e/tests/test_e2e_cpu_example.py``; the rollouts that pass are in ``test_e2e_cpu_example_rollouts.py``):

- **A parity Job that exits 0 without a summary.** A MutatingAdmissionPolicy (the apiserver's own CEL
  mutation, as a cluster's policies would apply it) replaces the parity container's command with
  ``true`` when the operator creates the Job. The real Job then runs on the real node, completes, and
  leaves no termination message: the operator must roll the candidate back with ``NoSummary`` in
  status, never count it as a pass, and leave the stable pods alone.
- **An analysis step that fails against a real Prometheus.** The Prometheus Operator runs Prometheus on
  the real node (:mod:`hisparse_devcluster.monitoring`), which scrapes the stable and the candidate pods
  through the PodMonitors the operator renders, each series labelled with its revision. After parity
  passes and the first weight step, the analysis step's queries run against it: one proves the
  candidate's pods are scraped (it passes), one holds the candidate's resident memory to half the stable
  revision's, which a build of the same code cannot meet (it fails). The rollout rolls back with
  ``AnalysisFailed`` and the values in status. The operator here is a host process, so it reaches
  Prometheus through ``kubectl port-forward`` (an operator pod reaches it by its Service).

In CI since the real node keeps its images across clusters and serving pods are Ready about 20 s after
they run (e2e/BENCHMARKS.md): the module took 500 s alone on 2 cores.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_helpers import eventually, get_json
from hisparse_devcluster import Cluster, monitoring
from hisparse_devcluster.realnode import RealNode
from hisparse_operator.api import labels as L
from test_e2e_cpu_example import (  # noqa: F401 (fixtures, by name)
    CANARY_TIMEOUT,
    DOC,
    NAME,
    NAMESPACE,
    _candidate_pods,
    _canary,
    _conditions,
    _stable_uids,
    _status,
    deployed,
    operator,
    prepared,
)

pytestmark = [pytest.mark.slow, pytest.mark.host]

SILENT_POLICY = "hisparse-e2e-silent-parity"


def silent_parity_policy(namespace: str) -> list[dict[str, Any]]:
    """The parity Jobs created in ``namespace`` run ``true`` (their arguments ignored): exit 0, no summary."""
    api = "admissionregistration.k8s.io/v1beta1"
    return [
        {"apiVersion": api, "kind": "MutatingAdmissionPolicy", "metadata": {"name": SILENT_POLICY}, "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": ["batch"], "apiVersions": ["v1"],
                                                    "operations": ["CREATE", "UPDATE"], "resources": ["jobs"]}]},
            # Also on UPDATE: the operator's next apply carries its own command, which must meet the
            # same mutation (a Job's template is immutable).
            "matchConditions": [{"name": "parity-job", "expression":
                                 f"'{L.APP_COMPONENT}' in object.metadata.labels && "
                                 f"object.metadata.labels['{L.APP_COMPONENT}'] == 'parity'"}],
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression":
                           '[JSONPatch{op: "replace", path: "/spec/template/spec/containers/0/command", '
                           'value: ["true"]}]'}}],
        }},
        {"apiVersion": api, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": SILENT_POLICY}, "spec": {
            "policyName": SILENT_POLICY,
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        }},
    ]


def _set_image(cluster: Cluster, image: str, rollout: dict[str, Any] | None = None) -> None:
    spec: dict[str, Any] = {"engine": {"image": image}}
    if rollout is not None:
        spec["rollout"] = rollout
    cluster.kubectl("patch", "hsd", NAME, "-n", NAMESPACE, "--type=merge", "-p", json.dumps({"spec": spec}))


def _rolled_back(cluster: Cluster, before: dict[str, Any]) -> bool:
    """The canary started after ``before`` (the status read before the patch) is rolled back. The status keeps
    the last canary after it ends: a rollback of an earlier test's candidate is not this one's."""
    c = _canary(cluster)
    # An inconclusive analysis holds instead of failing: say so at once rather than at the timeout.
    assert "inconclusive" not in (c.get("holdReason") or ""), c
    assert _status(cluster).get("stableRevision") and c.get("phase") != "Promoted", c
    earlier = (before.get("canary") or {}).get("revision")
    return c.get("phase") == "RolledBack" and c.get("revision") not in (None, earlier)


def _back_to_stable(cluster: Cluster, image: str, rollout: dict[str, Any]) -> None:
    cluster.kubectl("patch", "hsd", NAME, "-n", NAMESPACE, "--type=merge", "-p",
                    json.dumps({"spec": {"engine": {"image": image}, "rollout": rollout}}))
    eventually(lambda: not _candidate_pods(cluster), what="the candidate's pods gone", timeout=300)
    eventually(lambda: _conditions(cluster).get("Degraded") != "True" and _conditions(cluster).get("Ready") == "True",
               what="Ready again on the stable spec", timeout=180)


def test_parity_job_that_exits_0_without_a_summary_is_rolled_back(cluster: Cluster, node: RealNode,
                                                                 deployed: dict) -> None:
    spec = get_json(cluster, "hsd", NAME, "-n", NAMESPACE)["spec"]
    before, stable_pods = _status(cluster), _stable_uids(cluster)
    tag = DOC["spec"]["engine"]["image"].rsplit(":", 1)[0] + ":silent"
    node.ctr("images", "tag", "--force", DOC["spec"]["engine"]["image"], tag)
    cluster.apply(silent_parity_policy(NAMESPACE))
    try:
        _set_image(cluster, tag)
        eventually(lambda: _rolled_back(cluster, before), what="the candidate with a silent parity Job rolled back",
                   timeout=CANARY_TIMEOUT)
        st = _status(cluster)
        parity = st["parity"]
        assert not parity["passed"] and parity["reason"] == "NoSummary", parity
        assert parity.get("prompts", 0) == 0, parity
        assert st["stableRevision"] == before["stableRevision"], st
        assert "summary" in st["canary"]["message"], st["canary"]
        # The Job really ran the mutated command and succeeded: the gate saw a Complete Job, not a failure.
        jobs = [j for j in get_json(cluster, "jobs", "-n", NAMESPACE, "-l", f"{L.APP_COMPONENT}=parity")["items"]
                if j["metadata"]["labels"].get(L.REVISION) == parity["revision"]]
        if jobs:  # pruned once rolled back; when still there, it says what ran
            (job,) = jobs
            assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["true"], job["spec"]
            assert job["status"].get("succeeded") == 1, job["status"]
        events = json.loads(cluster.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                                            f"involvedObject.name={NAME}", "-o", "json").stdout)["items"]
        assert any("summary" in (e.get("message") or "") and e.get("reason") == "CanaryRolledBack" for e in events), \
            [e.get("message") for e in events][-10:]
        eventually(lambda: not _candidate_pods(cluster), what="the candidate's pods gone", timeout=300)
        assert _stable_uids(cluster) == stable_pods, "a rollback touched the stable pods"
    finally:
        for obj in reversed(silent_parity_policy(NAMESPACE)):
            cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found", check=False)
    _back_to_stable(cluster, spec["engine"]["image"], spec["rollout"])


# ---- an analysis step against a real Prometheus -----------------------------------------------------------

@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, node: RealNode) -> Iterator[str]:
    """The stack on the real node, and a URL the host-process operator reaches it at."""
    stack = monitoring.PrometheusStack(cluster, node)
    stack.install()
    forward = subprocess.Popen([str(cluster.kubectl_path), f"--kubeconfig={cluster.kubeconfig}", "port-forward",
                                "-n", stack.namespace, f"pod/{stack.pod_name}", f":{monitoring.PROMETHEUS_PORT}"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()
        m = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert m, f"kubectl port-forward said: {line}"
        yield f"http://127.0.0.1:{m.group(1)}"
    finally:
        forward.terminate()
        forward.wait(timeout=30)
        stack.uninstall()


def analysis_steps(url: str) -> list[dict[str, Any]]:
    selector = 'namespace="{{namespace}}", revision="{{revision}}"'
    return [
        {"weight": 50, "pauseSeconds": 0},
        # 90 s at the step: the rendered PodMonitors scrape every 30 s, so the candidate's series exist.
        {"analysis": {"prometheusUrl": url, "delaySeconds": 90, "queries": [
            # Passes: both of the candidate's serving pods are scraped, with its revision on their series.
            {"name": "candidate-scraped", "query": f"count(up{{{selector}}} == 1)", "min": 2},
            # Fails: a build of the same code needs about the stable revision's memory, not half of it.
            {"name": "resident-memory", "query": f"sum(process_resident_memory_bytes{{{selector}}})",
             "maxRatioToStable": 0.5},
        ]}},
        {"weight": 100},
    ]


def test_analysis_step_that_fails_against_real_prometheus_rolls_back(cluster: Cluster, node: RealNode,
                                                                    prometheus: str, deployed: dict) -> None:
    from hisparse_devcluster.route_watch import RouteWatcher

    spec = get_json(cluster, "hsd", NAME, "-n", NAMESPACE)["spec"]
    before = _status(cluster)
    tag = DOC["spec"]["engine"]["image"].rsplit(":", 1)[0] + ":analysed"
    node.ctr("images", "tag", "--force", DOC["spec"]["engine"]["image"], tag)
    with RouteWatcher(cluster, NAMESPACE) as watch:
        _set_image(cluster, tag, {**spec["rollout"], "steps": analysis_steps(prometheus)})
        try:
            eventually(lambda: _rolled_back(cluster, before), what="the candidate rolled back by its analysis step",
                       timeout=CANARY_TIMEOUT)
        except AssertionError:
            print(json.dumps(_status(cluster), indent=1))
            raise
        eventually(lambda: not _candidate_pods(cluster), what="the candidate's pods gone", timeout=300)
        eventually(lambda: _conditions(cluster).get("Ready") == "True", what="Ready on the stable revision",
                   timeout=300)
    st = _status(cluster)
    assert st["parity"]["passed"], st["parity"]  # the gate before it passed: the analysis rolled it back
    assert st["stableRevision"] == before["stableRevision"], st
    message = st["canary"]["message"]
    assert "analysis at step 2 failed" in message and "resident-memory=" in message, message
    assert "candidate-scraped" not in message, message  # the passing query is not named as failing
    events = json.loads(cluster.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                                        f"involvedObject.name={NAME}", "-o", "json").stdout)["items"]
    assert any("analysis at step 2 failed" in (e.get("message") or "") for e in events), \
        [e.get("message") for e in events][-10:]
    # The candidate took traffic at 50 % (the step the analysis watched), and at no moment did the route
    # point at a pool with no ready endpoint, on the way there or back.
    assert any(len([v for v in w.values() if v > 0]) == 2 for _, w in watch.weights), watch.weights
    assert not watch.violations, watch.violations
    serving = get_json(cluster, "pods", "-n", NAMESPACE, "-l",
                       f"{L.DEPLOYMENT}={NAME},{L.ROLE} in (prefill,decode)")["items"]
    assert serving and {p["metadata"]["labels"].get(L.REVISION) for p in serving} == {before["stableRevision"]}, \
        [(p["metadata"]["name"], p["metadata"]["labels"].get(L.REVISION)) for p in serving]
    _back_to_stable(cluster, spec["engine"]["image"], spec["rollout"])
