"""Operator metrics (prometheus-client): reconciles, their duration, API writes, conditions, webhook,
canary rollouts. Per-deployment series carry ``namespace`` and ``name`` and are removed when the deployment
is deleted (:func:`forget`), so a gone deployment does not keep alerting or showing on dashboards."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hisparse")
    except PackageNotFoundError:  # a source tree
        return "unknown"


RECONCILES = Counter("hisparse_operator_reconciles_total", "Reconciles by result", ["result"])
# At 0 from the start: HiSparseReconcileErrors takes rate() of it, which needs a sample before the first error.
RECONCILES.labels(result="error")
RECONCILE_SECONDS = Histogram(
    "hisparse_operator_reconcile_duration_seconds", "Wall time of one reconcile",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
API_WRITES = Counter("hisparse_operator_api_writes_total", "Write requests sent to the apiserver", ["verb", "kind"])
CONDITIONS = Gauge("hisparse_operator_deployments", "Managed HiSparseDeployments by condition status",
                   ["namespace", "name", "condition", "status"])
WEBHOOK_REJECTIONS = Counter("hisparse_operator_webhook_rejections_total", "Admission rejections by rule", ["rule"])
RETRIES = Counter("hisparse_operator_reconcile_retries_total",
                  "Reconciles run again after a failure, with exponential backoff")
CANARY_OUTCOMES = Counter("hisparse_operator_canary_outcomes_total",
                          "Canary rollouts that ended, by deployment and outcome (promoted, rolled_back, superseded)",
                          ["namespace", "name", "outcome"])
CANARY_WEIGHT = Gauge("hisparse_operator_canary_weight_percent",
                      "Percent of requests the HTTPRoute sends to a running candidate", ["namespace", "name"])
STATUS_CONFLICTS = Counter("hisparse_operator_status_conflicts_total",
                           "Status writes refused for a newer resourceVersion (decided again from a fresh read)")
CANARY_PHASE = Gauge("hisparse_operator_canary_phase",
                     "1 for the phase of a deployment's current or last canary rollout, 0 for the others",
                     ["namespace", "name", "phase"])
PARITY_RESULTS = Counter("hisparse_operator_parity_results_total",
                         "Parity verdicts recorded in status, by verdict (passed, failed)", ["namespace", "name", "verdict"])
REPLICAS = Gauge("hisparse_operator_replicas",
                 "Replicas of a deployment's role as its status reports them, by state (desired, ready); a "
                 "multi-node replica (a LeaderWorkerSet group) counts once", ["namespace", "name", "role", "state"])
PREFLIGHT_FAILURES = Gauge("hisparse_operator_preflight_failures",
                           "Serving pods not ready whose vLLM container last exited with a preflight check's exit "
                           "code, by role and check", ["namespace", "name", "role", "check"])
INFO = Gauge("hisparse_operator_info", "1 for each running operator process, with its version", ["version"])
INFO.labels(version=_version()).set(1)  # its absence is HiSparseOperatorAbsent
ADMISSION_NODE_FACTS = Counter("hisparse_operator_admission_node_facts_total",
                               "Admission requests by where their node facts came from: cache (the node watch), "
                               "live (a LIST: the watch had not synced yet)", ["source"])
NODE_LISTS = Counter("hisparse_operator_node_lists_total",
                     "LISTs of every node by the node watch, by reason: start, expired (410 Gone), error",
                     ["reason"])
NODE_WATCH_ERRORS = Counter("hisparse_operator_node_watch_errors_total",
                            "Failed node LISTs and watches, each retried after a delay")
NODE_FACTS_NODES = Gauge("hisparse_operator_node_facts_nodes", "Nodes whose facts the node watch holds")
WEBHOOK_CERT_EXPIRY = Gauge("hisparse_operator_webhook_certificate_expiry_timestamp_seconds",
                            "Unix time at which the webhook serving certificate this replica serves expires")

_PER_DEPLOYMENT = (CONDITIONS, CANARY_WEIGHT, CANARY_PHASE, PARITY_RESULTS, CANARY_OUTCOMES, REPLICAS, PREFLIGHT_FAILURES)


def set_preflight_failures(namespace: str, name: str, roles: Iterable[str], counts: dict[tuple[str, str], int]) -> None:
    """The deployment's failing pods by (role, check), every check of every role it runs at 0 unless counted
    (as kube-state-metrics exports every pod phase): the series exist before a failure, so the alert's
    signal and a dashboard have them, and a failure that ended reads 0."""
    from hisparse_runtime.engine import PREFLIGHT_EXIT_CODES

    for labels in list(PREFLIGHT_FAILURES._metrics):
        if labels[:2] == (namespace, name) and labels[2] not in roles:
            PREFLIGHT_FAILURES.remove(*labels)
    for role in roles:
        for check in PREFLIGHT_EXIT_CODES:
            PREFLIGHT_FAILURES.labels(namespace, name, role, check).set(counts.get((role, check), 0))


def forget(namespace: str, name: str) -> None:
    """Drop every series of a deleted deployment."""
    for family in _PER_DEPLOYMENT:
        for labels in list(family._metrics):  # prometheus-client keeps one child per label tuple
            if labels[:2] == (namespace, name):
                family.remove(*labels)

