"""Validation of a HiSparseDeployment manifest into field-path errors people can act on.

One entry point for ``hisparse validate``, the admission webhook and the reconciler: the API model
(types, bounds, CEL rules), then every engine constraint of each role, then (when the cluster is
known) the checks that need node facts. All errors are returned, not just the first.
"""

from __future__ import annotations

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


_PYDANTIC_HINTS = {
    "extra_forbidden": "unknown field; check its spelling against `hisparse crd` (fields are camelCase)",
    "missing": "required field is missing",
}


def _from_pydantic(exc: ValidationError) -> list[FieldError]:
    out = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p in {"function-after[_cel()]", "int", "str"})]
        # Unions of int|str report each branch: keep the location, drop the branch tag.
        loc = [p for p in loc if not (isinstance(p, str) and (p.startswith("function-") or p.startswith("constrained-")))]
        ctx = err.get("ctx") or {}
        path = format_path(loc)
        if err["type"] == "cel" and ctx.get("field_path"):
            path = f"{path}{ctx['field_path']}" if path else ctx["field_path"].lstrip(".")
        message = _PYDANTIC_HINTS.get(err["type"], err["msg"])
        if err["type"] not in ("missing", "extra_forbidden") and "input" in err and not isinstance(err["input"], (dict, list)):
            message = f"{message} (got {err['input']!r})"
        out.append(FieldError(path or "(root)", message, f"schema:{err['type']}"))
    # A union failing in both branches reports twice at one path: keep one line per path and message.
    unique = {(e.path, e.message): e for e in out}
    return list(unique.values())


def validate(obj: dict[str, Any], facts: ClusterFacts | None = None) -> tuple[HiSparseDeployment | None, list[FieldError]]:
    """The parsed resource (``None`` if the schema rejects it) and every error found."""
    try:
        d = HiSparseDeployment.model_validate(obj)
    except ValidationError as exc:
        return None, _from_pydantic(exc)
    errors: list[FieldError] = []
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
        errors += [FieldError(spec_path(role, v.path), v.message, v.rule) for v in violations]
    # Deployment-wide fields are checked once per role; report each once.
    unique = {(e.path, e.message): e for e in errors}
    return d, list(unique.values())
