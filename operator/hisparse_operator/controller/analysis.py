"""Canary analysis steps: PromQL instant queries against Prometheus, each compared with its threshold.

The executor half of an ``analysis`` step (the planner in :mod:`.rollout` decides when one is due and
what its result means). Verdicts: ``passed`` (every query within its threshold), ``failed`` (one is not:
the candidate rolls back), ``inconclusive`` (Prometheus unreachable, an error, an empty or ambiguous
result: the rollout holds for a person to promote or abort, as nothing was learnt).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Final

from ..api.spec import AnalysisQuery, AnalysisStep

QUERY_PATH: Final = "/api/v1/query"
TIMEOUT_SECONDS: Final = 10.0


class Inconclusive(Exception):
    """A query gave no number to compare."""


@dataclass(frozen=True)
class Fleet:
    """What a query's placeholders stand for, for one revision."""

    revision: str
    pods: str
    """A regex of the fleet's serving pod names."""
    namespace: str
    name: str


def fleet(namespace: str, base: str, revision: str, resource: str) -> Fleet:
    """``base``: the fleet's object name base (``<name>`` or ``<name>-canary``)."""
    # Object names are DNS labels ([a-z0-9-]): nothing to escape (and PromQL strings would take a
    # backslash as their own escape).
    return Fleet(revision, f"{base}-(prefill|decode)-.*", namespace, resource)


def render_query(q: AnalysisQuery, f: Fleet) -> str:
    return (q.query.replace("{{revision}}", f.revision).replace("{{pods}}", f.pods)
            .replace("{{namespace}}", f.namespace).replace("{{name}}", f.name))


def instant(url: str, promql: str, *, timeout: float = TIMEOUT_SECONDS) -> float:
    """The one number an instant query gives (a scalar, or a vector of exactly one sample)."""
    full = url.rstrip("/") + QUERY_PATH + "?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(full, timeout=timeout) as response:  # noqa: S310 (http(s) only, see the API)
            body: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as exc:  # 400/422/503 carry Prometheus's own error in the body
        try:
            body = json.loads(exc.read())
        except ValueError:
            raise Inconclusive(f"Prometheus at {url} answered HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise Inconclusive(f"Prometheus at {url} did not answer ({exc})") from exc
    if body.get("status") != "success":
        raise Inconclusive(f"Prometheus refused the query: {body.get('errorType')}: {body.get('error')}")
    data = body.get("data") or {}
    result = data.get("result")
    if data.get("resultType") == "scalar":
        value = result[1]
    elif data.get("resultType") == "vector" and isinstance(result, list):
        if len(result) != 1:
            raise Inconclusive(f"the query gave {len(result)} series, not one: aggregate it (sum, max, histogram_quantile)")
        value = result[0]["value"][1]
    else:
        raise Inconclusive(f"the query gave a {data.get('resultType')}, not a number")
    x = float(value)
    if math.isnan(x):
        raise Inconclusive("the query gave NaN (no samples in the window)")
    return x


def evaluate(step: AnalysisStep, default_url: str | None, candidate: Fleet, stable: Fleet) -> tuple[str, str]:
    """(``passed`` | ``failed`` | ``inconclusive``, what each query gave)."""
    url = step.prometheus_url or default_url
    if not url:
        return "inconclusive", "no Prometheus: set the step's prometheusUrl or the operator's HISPARSE_PROMETHEUS_URL"
    notes, failed = [], []
    for q in step.queries:
        try:
            value = instant(url, render_query(q, candidate))
            limit_hi = q.max
            if q.max_ratio_to_stable is not None:
                base = instant(url, render_query(q, stable))
                ratio_limit = q.max_ratio_to_stable * base
                limit_hi = ratio_limit if limit_hi is None else min(limit_hi, ratio_limit)
        except Inconclusive as exc:
            return "inconclusive", f"{q.name}: {exc}"
        bad = (limit_hi is not None and value > limit_hi) or (q.min is not None and value < q.min)
        bounds = " ".join(x for x in (f"max {limit_hi:.6g}" if limit_hi is not None else "",
                                      f"min {q.min:.6g}" if q.min is not None else "") if x)
        notes.append(f"{q.name}={value:.6g} ({bounds})")
        if bad:
            failed.append(notes[-1])
    if failed:
        return "failed", "; ".join(failed)[:900]
    return "passed", "; ".join(notes)[:900]
