"""Base class of the engine settings: strict, frozen, documented."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


def camel(name: str) -> str:
    """Field name -> JSON/CRD name: camelCase, with binary units spelled as Kubernetes does (GiB)."""
    head, *rest = name.split("_")
    out = head + "".join(part[:1].upper() + part[1:] for part in rest)
    return out[:-3] + "GiB" if out.endswith("Gib") else out


class Settings(BaseModel):
    """Every engine settings class forbids unknown keys (a typo is an error, not a default) and is
    immutable once built, so a settings object that passed the constraints stays valid."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        validate_default=True,
        alias_generator=camel,  # the same classes are embedded in the camelCase CRD
        populate_by_name=True,
        use_attribute_docstrings=True,  # field docstrings become descriptions (CRD, --help)
    )

    def to_json_dict(self) -> dict:
        """camelCase JSON-ready dict, omitting unset optional values."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
