"""Validation of a HiSparseDeployment manifest into field-path errors people can act on.

One entry point for ``hisparse validate``, the admission webhook and the reconciler: the API model
(types, bounds, CEL rules), then every engine constraint of each role, then (when the cluster is
known) the checks that need node facts. All errors are returned, not just the first.

Types are as strict as the CRD's: the manifest is validated as the JSON the apiserver receives, in
pydantic's strict mode, so ``replicas: "2"`` or ``enableDbo: "false"`` is refused at the path the
apiserver reports, instead of being coerced. Every message says the value, the rule, what happens
with it and how to fix it; engine-rule messages name the role they were found for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hisparse_runtime.engine import check_host_pool_fits_nodes, check_role
from hisparse_runtime.engine.constraints import check_gpu_architectures
from hisparse_runtime.engine.constraints import format_path
from pydantic import ValidationError

from .deployment import HiSparseDeployment
from .facts import ClusterFacts
from .roles import role_settings, role_spec, spec_path


@dataclass(frozen=True)
class FieldError:
    """One problem in a manifest: the field path, what is wrong and what to do, and the rule's name."""

    path: str
    message: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


_REFUSED = "the apiserver refuses the manifest (kubectl apply fails)"
_JSON_KIND = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", dict: "an object",
              list: "an array", type(None): "null"}


def _kind(value: Any) -> str:
    return _JSON_KIND.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else _kind(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _unquoted(value: Any) -> str | None:
    """The JSON a quoted scalar stands for (``"2"`` -> ``2``), if it is one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = json.loads(value.strip().lower() if value.strip().lower() in ("true", "false") else value)
    except ValueError:
        return None
    return json.dumps(parsed) if isinstance(parsed, (int, float, bool)) else None


def _type_message(field: str, want: str, value: Any, hint: str, written: str | None = None) -> str:
    fix = hint
    plain = _unquoted(value)
    if plain is not None:
        fix = f"write {plain} without quotes"
    elif want == "a string" and isinstance(value, (int, float, bool, type(None))):
        if written is not None and written != json.dumps(value):
            fix = (f"quote it: {json.dumps(written)} (unquoted, YAML 1.1 as kubectl reads it turns {written} into "
                   f"{_show(value)}: y/n/yes/no/on/off are booleans, 0x10 and 1e3 are numbers)")
        else:
            fix = f"quote it: {json.dumps(json.dumps(value))}"
    return f"{field} is {want} in the CRD, but got {_show(value)} ({_kind(value)}); {_REFUSED}: {fix}"


def _lookalike(field: str, known: list[str] | None) -> str:
    """Non-ASCII characters of an unknown key (a Cyrillic ``е`` in ``namеspace``) and the field it resembles."""
    import difflib
    import unicodedata

    odd = [c for c in field if not c.isascii() or not c.isprintable()]
    note = ""
    if odd:
        note = " (it contains " + ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}" for c in dict.fromkeys(odd)) + ")"
    ascii_form = unicodedata.normalize("NFKD", field).encode("ascii", "ignore").decode()
    close = difflib.get_close_matches(ascii_form or field, known or [], n=1, cutoff=0.75)
    return note + (f"; did you mean {close[0]!r}?" if close else "")


def _schema_message(err: dict[str, Any], field: str, written: str | None = None) -> str:
    """pydantic's error as value, rule, consequence and fix."""
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "missing":
        return f"{field} is required and missing; {_REFUSED}: add it (see `kubectl explain` or `hisparse crd`)"
    if kind == "extra_forbidden":
        return (f"unknown field {field!r}{_lookalike(field, err.get('known'))}; the apiserver refuses unknown fields "
                "(kubectl's strict field validation), which would otherwise be dropped silently: check its spelling "
                "against `hisparse crd` (fields are camelCase)")
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return _type_message(field, "an integer", value, "write a whole number")
    if kind in ("float_type", "float_parsing"):
        return _type_message(field, "a number", value, "write a number")
    if kind in ("bool_type", "bool_parsing"):
        return _type_message(field, "a boolean", value, "write true or false without quotes")
    if kind == "string_type":
        return _type_message(field, "a string", value, "write a string", written)
    if kind in ("dict_type", "model_type", "model_attributes_type", "mapping_type"):
        return _type_message(field, "an object", value, "write a mapping of keys to values")
    if kind == "list_type":
        return _type_message(field, "an array", value, "write a YAML list (one `- item` per line)")
    if kind == "literal_error":
        return f"{field} is {_show(value)}, but must be one of {ctx.get('expected')}; {_REFUSED}: use one of those"
    bounds = {"greater_than_equal": ("at least", "ge"), "greater_than": ("more than", "gt"),
              "less_than_equal": ("at most", "le"), "less_than": ("less than", "lt")}
    if kind in bounds:
        words, key = bounds[kind]
        return f"{field} is {_show(value)}, but must be {words} {ctx.get(key)}; {_REFUSED}: use a value {words} {ctx.get(key)}"
    if kind in ("string_too_long", "too_long"):
        unit = "characters" if kind == "string_too_long" else "items"
        return (f"{field} has {len(value) if hasattr(value, '__len__') else '?'} {unit}, more than the {ctx.get('max_length')} "
                f"allowed; {_REFUSED}: shorten it")
    if kind in ("string_too_short", "too_short"):
        unit = "characters" if kind == "string_too_short" else "items"
        return f"{field} needs at least {ctx.get('min_length')} {unit}; {_REFUSED}: fill it in"
    if kind == "string_pattern_mismatch":
        return f"{field} is {_show(value)}, which does not match {ctx.get('pattern')}; {_REFUSED}: correct its form"
    if kind == "value_error":
        reason = str(ctx.get("error") or err["msg"]).removeprefix("Value error, ")
        return f"{field}: {reason}; {_REFUSED}"
    if kind == "cel":
        return f"{err['msg']} ({_REFUSED})"
    return f"{field} is {_show(value)}: {err['msg']}; {_REFUSED}: correct it"


def _from_pydantic(exc: ValidationError, spelled: Mapping[tuple[str | int, ...], str] | None = None) -> list[FieldError]:
    out = []
    for err in exc.errors():
        # Unions (quantities are int | str) and validators tag the location with their branch: drop it.
        loc = [p for p in err["loc"] if not (isinstance(p, str) and (p in {"int", "str", "[key]"} or p.startswith(("function-", "constrained-"))))]
        ctx = err.get("ctx") or {}
        path = format_path(loc)
        if err["type"] == "cel" and ctx.get("field_path"):
            path = f"{path}{ctx['field_path']}" if path else ctx["field_path"].lstrip(".")
        field = next((str(p) for p in reversed(loc) if isinstance(p, str)), "the document")
        written = (spelled or {}).get(tuple(loc))
        if err["type"] == "extra_forbidden":
            err = {**err, "known": _known_fields(loc[:-1])}
        out.append(FieldError(path or "(root)", _schema_message(err, field, written), f"schema:{err['type']}"))
    # A union failing in both branches reports twice at one path: keep one line per path and message.
    unique = {(e.path, e.message): e for e in out}
    return list(unique.values())


def _known_fields(loc: list[Any]) -> list[str]:
    """The camelCase fields of the model at ``loc`` (for "did you mean")."""
    model: Any = HiSparseDeployment
    for part in loc:
        if isinstance(part, int):
            continue
        field = next((f for f in getattr(model, "model_fields", {}).values() if f.alias == part), None)
        if field is None:
            return []
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next((c for c in candidates if hasattr(c, "model_fields")), None)
        for c in candidates:
            for inner in getattr(c, "__args__", ()):
                if hasattr(inner, "model_fields"):
                    model = inner
        if model is None:
            return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _as_json(obj: Any) -> str | FieldError:
    """The manifest as the apiserver receives it; a value with no JSON form is an error, not a crash."""
    try:
        return json.dumps(obj, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        return FieldError("(root)", f"the manifest has no JSON form ({exc}); Kubernetes objects are JSON: "
                          "write plain strings, numbers, booleans, lists and mappings", "schema:json")


def analysis_without_prometheus(d: HiSparseDeployment, prometheus_url: str | None) -> list[FieldError]:
    """Analysis steps with no Prometheus to query: neither their own ``prometheusUrl`` nor the operator's
    ``HISPARSE_PROMETHEUS_URL`` (``prometheus_url``). Every measurement would be an error, and the canary
    would roll back after ``consecutiveErrorLimit`` of them."""
    out = []
    for i, step in enumerate(d.spec.rollout.steps):
        if step.analysis is not None and step.analysis.prometheus(prometheus_url) is None:
            out.append(FieldError(
                f"spec.rollout.steps[{i}].analysis.prometheusUrl",
                "unset, and the operator has no HISPARSE_PROMETHEUS_URL (chart value prometheusUrl): an analysis step "
                "needs a Prometheus to query, so every measurement would be an error and the canary would be rolled "
                "back; set prometheusUrl on the step (for example http://prometheus-operated.monitoring.svc:9090), or "
                "install the operator with prometheusUrl (hisparse validate --prometheus-url URL checks against it)",
                "rollout:analysis-without-prometheus"))
    return out


def rdma_not_offered(d: HiSparseDeployment, facts: ClusterFacts) -> list[FieldError]:
    """Roles whose ``rdma.resourceName`` no node they can land on offers (with the count per pod): every pod
    would stay Pending, the scheduler reporting ``Insufficient <resource>``."""
    out = []
    for role in ("prefill", "decode"):
        spec = role_spec(d, role)
        if spec is None or spec.rdma is None:
            continue
        gpus = role_settings(d, role).parallelism.gpus_per_node
        rdma = spec.rdma
        offering = facts.nodes_offering(spec, gpus, rdma.resource_name, rdma.count)
        if offering is None or offering:
            continue
        elsewhere = sorted({k for n in facts.nodes for k in n.device_resources})
        out.append(FieldError(
            f"spec.{role}.rdma.resourceName",
            f"{role} role: no node the role can land on (with {gpus} GPUs, its nodeSelector, tolerations and "
            f"affinity) offers {rdma.count} of {rdma.resource_name!r} in status.allocatable, so every pod would stay "
            f"Pending (Insufficient {rdma.resource_name}) and nothing is applied; device resources the nodes offer: "
            f"{', '.join(elsewhere) or 'none'}. Use the name the RDMA device plugin advertises (kubectl get nodes "
            "-o jsonpath='{.items[*].status.allocatable}'), lower rdma.count, or deploy the device plugin first",
            "topology:rdma-not-offered"))
    return out


def validate(obj: dict[str, Any], facts: ClusterFacts | None = None,
             spelled: Mapping[tuple[str | int, ...], str] | None = None, *,
             prometheus_url: str | None = None) -> tuple[HiSparseDeployment | None, list[FieldError]]:
    """The parsed resource (``None`` if the schema rejects it) and every error found. ``spelled``: what the
    YAML said where an unquoted scalar became a non-string (``yamlio.Document.spelled``), for the fix;
    ``prometheus_url``: the operator's ``HISPARSE_PROMETHEUS_URL`` (None: it has none, the chart's default)."""
    text = _as_json(obj)
    if isinstance(text, FieldError):
        return None, [text]
    try:
        d = HiSparseDeployment.model_validate_json(text, strict=True)
    except ValidationError as exc:
        return None, _from_pydantic(exc, spelled)
    by_place: dict[tuple[str, str, str], list[str]] = {}
    for role in ("prefill", "decode"):
        if role_spec(d, role) is None:
            continue
        settings = role_settings(d, role)
        violations = check_role(settings)
        if facts is not None:
            spec, gpus = role_spec(d, role), settings.parallelism.gpus_per_node
            allocatable = facts.allocatable_gib_for(spec, gpus)  # type: ignore[arg-type]
            if allocatable is not None:
                violations += check_host_pool_fits_nodes(settings, allocatable)
            violations += check_gpu_architectures(settings, facts.gpu_architectures_for(spec, gpus))  # type: ignore[arg-type]
        for v in violations:
            roles = by_place.setdefault((spec_path(role, v.path), v.message, v.rule), [])
            roles.append(role)
    # Deployment-wide fields are checked once per role: one line per finding, naming the role(s).
    return d, [FieldError(path, f"{' and '.join(roles)} role{'s' if len(roles) > 1 else ''}: {message}", rule)
               for (path, message, rule), roles in by_place.items()] + analysis_without_prometheus(d, prometheus_url) + (
        rdma_not_offered(d, facts) if facts is not None else [])
