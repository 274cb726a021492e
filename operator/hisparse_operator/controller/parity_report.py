"""The parity report that outlives its Job: ConfigMap ``<name>-parity-report``, owned by the
HiSparseDeployment.

The Job's pod leaves a summary as its termination message (4 KiB at most: the verdict is read from it)
and prints the full report (every prompt, its first divergence, both sides' top-2 margins there, its
near-ties, the tokens compared) on its log. Both go when the candidate's objects are pruned, a minute
after a rollback. When the verdict is reached the operator copies what the pod left into this
ConfigMap: the report from the pod's log (the operator's one ``pods/log`` read: ``get``, namespaced, on
the finished parity pod only), else the summary alone with the reason the log could not be read.

It is written by the reconciler, not rendered, so the prune of rendered objects keeps it (:func:`keep`)
until a rollout of another revision or attempt runs; then it is pruned, and ``status.parity.report``
with it, so a report never describes a rollout it was not made for.
"""

from __future__ import annotations

import json
from typing import Any, Final

from .. import names
from ..api import HiSparseDeployment, labels as L
from ..render.common import meta, obj

COMPONENT: Final = "parity-report"
ATTEMPT: Final = f"{L.GROUP}/attempt"
"""Annotation: the rollout's attempt the report was made for (with the revision label: which rollout)."""
JOB: Final = f"{L.GROUP}/parity-job"
"""Annotation: the Job whose pod the report was read from (a report is written once per Job)."""
REPORT_KEY: Final = "report.json"
SUMMARY_KEY: Final = "summary.json"
VERDICT_KEY: Final = "verdict.json"
SOURCE_KEY: Final = "source"
LOG_LIMIT_BYTES: Final = 768 * 1024
"""The most of the pod's log read (a ConfigMap holds 1 MiB): 1024 prompts report in about 400 KiB."""
LOG_TAIL_LINES: Final = 4
"""The report is the run's last line on stdout; a few lines cover stderr written after it."""


def name(d: HiSparseDeployment | str) -> str:
    return names.parity_report(d if isinstance(d, str) else d.name)


def full_report(log: str) -> dict[str, Any] | None:
    """The report the parity client printed: the last log line that is a JSON object with ``prompts``."""
    for line in reversed(log.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("prompts"), list):
            return doc
    return None


def read_log(kube: Any, namespace: str, pods: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """(the full report, where it came from or why there is none) from the finished parity pod's log."""
    done = [p for p in pods if any(((c.get("state") or {}).get("terminated")) for c in
                                   (p.get("status") or {}).get("containerStatuses") or [])]
    if not done:
        return None, "no finished parity pod to read the report from"
    pod = done[0]["metadata"]["name"]
    try:
        log = kube.pod_log(namespace, pod, "parity", limit_bytes=LOG_LIMIT_BYTES, tail_lines=LOG_TAIL_LINES)
    except Exception as e:  # noqa: BLE001 (the summary still decides; the report says why it is short)
        return None, f"the log of pod {pod} could not be read ({type(e).__name__}: {str(e)[:300]}); the summary alone is kept"
    report = full_report(log or "")
    if report is None:
        return None, (f"the log of pod {pod} holds no parity report (or it exceeded {LOG_LIMIT_BYTES} bytes); "
                      "the summary alone is kept")
    return report, f"the log of pod {pod}"


def report_object(d: HiSparseDeployment, *, revision: str, attempt: int, job: str, verdict: dict[str, Any],
                  summary: dict[str, Any] | None, report: dict[str, Any] | None, source: str) -> dict[str, Any]:
    m = meta(d, name(d), COMPONENT, extra_labels={L.REVISION: revision},
             annotations={ATTEMPT: str(attempt), JOB: job})
    data = {VERDICT_KEY: json.dumps(verdict, sort_keys=True), SOURCE_KEY: source,
            SUMMARY_KEY: json.dumps(summary, sort_keys=True) if summary is not None else "null"}
    if report is not None:
        data[REPORT_KEY] = json.dumps(report, separators=(",", ":"))
    return obj("v1", "ConfigMap", m, data=data)


def written_for(live: dict[str, Any] | None, job: str) -> bool:
    """The report of ``job`` is there already (the log is read once, not at every reconcile)."""
    return bool(live) and ((live or {}).get("metadata", {}).get("annotations") or {}).get(JOB) == job


def keep(live: dict[str, Any], canary: dict[str, Any] | None) -> bool:
    """Keep the report unless a rollout of another revision or attempt is running (it describes an
    earlier one: pruned when the next rollout starts)."""
    c = canary or {}
    if c.get("phase") not in ("Parity", "Shifting", "Promoting"):
        return True
    m = live.get("metadata") or {}
    mine = ((m.get("labels") or {}).get(L.REVISION), (m.get("annotations") or {}).get(ATTEMPT))
    return mine == (c.get("revision"), str(c.get("attempt") or 1))
