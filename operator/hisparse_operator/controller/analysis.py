"""Canary analysis steps: PromQL instant queries against Prometheus, each compared with its threshold.

The executor half of an ``analysis`` step: the planner in :mod:`.rollout` decides which queries are due
(``intervalSeconds`` after their last attempt), counts the measurements in ``status.canary.analysis``
and decides what they mean. Here one attempt at one query gives a :class:`~.rollout.Measurement`:
``passed`` or ``failed`` (a number within or outside the threshold), ``inconclusive`` (no data: an empty
vector or NaN; ``failed`` where the query's ``emptyResult`` says so), or ``error`` (Prometheus
unreachable, an HTTP or query error, a result that is not one number), which the planner retries.
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
from .rollout import Measurement

QUERY_PATH: Final = "/api/v1/query"
TIMEOUT_SECONDS: Final = 10.0


class QueryError(Exception):
    """The query gave no measurement (retried at the query's interval)."""


class NoData(Exception):
    """The query answered, with nothing to compare: an empty vector, or NaN."""


@dataclass(frozen=True)
class Fleet:
    """What a query's placeholders stand for, for one revision."""

    revision: str
    pods: str
    """A regex of the fleet's serving pod names."""
    namespace: str
    name: str


def fleet(namespace: str, base: str, revision: str, resource: str) -> Fleet:
    """``base``: the fleet's object name base (``<name>``, or ``<name>-<revision>`` for a fleet a canary started)."""
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
            raise QueryError(f"Prometheus at {url} answered HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise QueryError(f"Prometheus at {url} did not answer ({exc})") from exc
    if not isinstance(body, dict) or body.get("status") != "success":
        body = body if isinstance(body, dict) else {}
        raise QueryError(f"Prometheus refused the query: {body.get('errorType')}: {body.get('error')}")
    data = body.get("data") or {}
    result = data.get("result")
    try:
        if data.get("resultType") == "scalar":
            value = result[1]
        elif data.get("resultType") == "vector" and isinstance(result, list):
            if not result:
                raise NoData("the query gave an empty vector (no series)")
            if len(result) != 1:
                raise QueryError(f"the query gave {len(result)} series, not one: aggregate it (sum, max, histogram_quantile)")
            value = result[0]["value"][1]
        else:
            raise QueryError(f"the query gave a {data.get('resultType')}, not a number")
        x = float(value)
    except (TypeError, KeyError, IndexError, ValueError) as exc:
        raise QueryError(f"the query's result is not a number ({exc})") from exc
    if math.isnan(x):
        raise NoData("the query gave NaN (no samples in the window)")
    return x


def measure_query(url: str, q: AnalysisQuery, candidate: Fleet, stable: Fleet) -> Measurement:
    """One measurement of ``q``: the candidate's value against the threshold."""
    empty = "failed" if q.empty_result == "Failed" else "inconclusive"
    try:
        value = instant(url, render_query(q, candidate))
        limit_hi = q.max
        if q.max_ratio_to_stable is not None:
            try:
                base = instant(url, render_query(q, stable))
            except NoData as exc:
                return Measurement(empty, f"{q.name}: the stable revision's {exc}")
            ratio_limit = q.max_ratio_to_stable * base
            limit_hi = ratio_limit if limit_hi is None else min(limit_hi, ratio_limit)
    except NoData as exc:
        return Measurement(empty, f"{q.name}: {exc}")
    except QueryError as exc:
        return Measurement("error", f"{q.name}: {exc}")
    bad = (limit_hi is not None and value > limit_hi) or (q.min is not None and value < q.min)
    bounds = " ".join(x for x in (f"max {limit_hi:.6g}" if limit_hi is not None else "",
                                  f"min {q.min:.6g}" if q.min is not None else "") if x)
    return Measurement("failed" if bad else "passed", f"{q.name}={value:.6g} ({bounds})")


def measure(step: AnalysisStep, queries: tuple[AnalysisQuery, ...], operator_default: str | None,
            candidate: Fleet, stable: Fleet) -> dict[str, Measurement]:
    """A measurement of each of ``queries`` (those of ``step`` that are due), by name."""
    url = step.prometheus(operator_default)
    if not url:  # admission refuses this; an operator restarted without its setting gets here
        return {q.name: Measurement("error", f"{q.name}: no Prometheus: set the step's prometheusUrl or the "
                                             "operator's HISPARSE_PROMETHEUS_URL") for q in queries}
    return {q.name: measure_query(url, q, candidate, stable) for q in queries}
