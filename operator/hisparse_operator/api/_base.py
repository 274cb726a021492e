"""Base of the HiSparseDeployment API models and the CEL rules they carry.

A :class:`CelRule` is written once: the CRD generator puts it into ``x-kubernetes-validations`` (the
apiserver evaluates it) and :class:`ApiModel` evaluates the same expression with a CEL runtime when
the model is validated in Python (``hisparse validate``, the webhook, the reconciler).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hisparse_runtime.engine._base import Settings
from pydantic import ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from . import _cel


@dataclass(frozen=True)
class CelRule:
    """A Kubernetes CEL validation rule on the object a model describes (``self``)."""

    rule: str
    message: str
    field_path: str | None = None
    """Where the error points, relative to ``self`` (``.gatewayRef``), as the apiserver reports it."""
    python_path: str | None = None
    """Where ``hisparse validate`` points when the apiserver cannot (``metadata`` has no schema, so a
    rule on the name may not carry a fieldPath); defaults to ``field_path``."""
    reason: str = "FieldValueInvalid"
    python_message: str | None = None
    """A CEL string expression for the message ``hisparse validate``, the webhook and the reconciler give,
    naming the values. Not the CRD's ``messageExpression``: the apiserver's cost estimate multiplies it by
    every enclosing list (steps x queries) and refuses the CRD, so the apiserver keeps ``message``."""

    def to_schema(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message, "reason": self.reason}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out

    def message_for(self, data: dict[str, Any]) -> str:
        if self.python_message:
            text = _cel.evaluate(self.python_message, {"self": data})
            if isinstance(text, str) and text:
                return text
        return self.message


def _add_cel_rules(schema: dict[str, Any], cls: type) -> None:
    rules: tuple[CelRule, ...] = getattr(cls, "__cel_rules__", ())
    if rules:
        schema["x-kubernetes-validations"] = [r.to_schema() for r in rules]


class ApiModel(Settings):
    """The engine settings' conventions (camelCase, unknown fields refused, immutable, documented)
    plus CEL rules, so engine classes embed in the API unchanged."""

    model_config = ConfigDict(json_schema_extra=_add_cel_rules)

    __cel_rules__: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _cel(self) -> ApiModel:
        if not self.__cel_rules__:
            return self
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        for r in self.__cel_rules__:
            if _cel.evaluate(r.rule, {"self": data}) is not True:
                raise PydanticCustomError("cel", r.message_for(data), {"field_path": r.python_path or r.field_path or "", "rule": r.rule})
        return self
