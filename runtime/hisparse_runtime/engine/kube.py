"""Kubernetes' rules for names, labels, environment variable names and quantities, written once.

They mirror k8s.io/apimachinery's ``pkg/util/validation`` (IsDNS1123Label, IsDNS1035Label,
IsDNS1123Subdomain, IsQualifiedName, IsValidLabelValue, the relaxed IsEnvVarName of Kubernetes 1.34+)
and ``resource.Quantity``'s syntax, so a value accepted here is one the apiserver accepts for the object
it lands in. Patterns are ASCII-only and RE2-compatible: the CRD carries the same ones.

Each check returns ``None`` or a reason that names the rule and a corrected value (which passes the check).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Final

from pydantic import AfterValidator, Field

DNS1123_LABEL: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1035_LABEL: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE: Final = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_NAME_PART: Final = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUANTITY_PATTERN: Final = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"


def _dashed(value: str, allowed: str, lower: bool) -> str:
    text = value.lower() if lower else value
    text = re.sub(f"[^{allowed}]+", "-", text)
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", text)


def _fix_label(value: str, limit: int = 63, letter_first: bool = False) -> str:
    fixed = _dashed(value, "a-z0-9-", lower=True)[:limit].rstrip("-") or "x"
    if letter_first and not fixed[0].isalpha():
        fixed = ("x-" + fixed)[:limit].rstrip("-")
    return fixed


def dns1123_label_problem(value: str, what: str = "a name") -> str | None:
    if len(value) <= 63 and re.match(DNS1123_LABEL, value):
        return None
    return (f"{value!r} is not a DNS-1123 label, which {what} must be (lowercase ASCII letters, digits and '-', "
            f"starting and ending with a letter or digit, at most 63 characters): use {_fix_label(value)!r}")


def dns1035_label_problem(value: str, what: str = "a name") -> str | None:
    if len(value) <= 63 and re.match(DNS1035_LABEL, value):
        return None
    return (f"{value!r} is not a DNS-1035 label, which {what} must be (lowercase ASCII letters, digits and '-', "
            f"starting with a letter, ending with a letter or digit, at most 63 characters): use "
            f"{_fix_label(value, letter_first=True)!r}")


def dns1123_subdomain_problem(value: str, what: str = "a name") -> str | None:
    if len(value) <= 253 and re.match(DNS1123_SUBDOMAIN, value):
        return None
    fixed = ".".join(_fix_label(p) for p in value.split(".") if p)[:253].rstrip("-.") or "x"
    return (f"{value!r} is not a DNS-1123 subdomain, which {what} must be (lowercase ASCII letters, digits, '-' and "
            f"'.', each dot-separated part starting and ending with a letter or digit, at most 253 characters): use "
            f"{fixed!r}")


def extended_resource_name_problem(value: str) -> str | None:
    """A device plugin's (extended) resource name, as ``IsExtendedResourceName`` checks it: a domain prefix
    other than ``kubernetes.io``, ``/``, a name; and ``requests.`` + the name a qualified name."""
    prefix, slash, name = value.partition("/")
    native = not slash or prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")
    if not native and not value.startswith("requests.") and qualified_name_problem(f"requests.{value}") is None:
        return None
    return (f"{value!r} is not an extended resource name, which a device plugin's resource must be (a DNS-1123 "
            f"subdomain prefix other than kubernetes.io, '/', then a name of at most 63 letters, digits, '-', '_' "
            f"or '.'), as the node reports it in status.allocatable: use the name your device plugin advertises, "
            f"for example 'rdma/hca_shared_devices_a' (k8s-rdma-shared-dev-plugin) or 'nvidia.com/sriov_rdma_vf' "
            f"(SR-IOV network device plugin)")


def label_value_problem(value: str) -> str | None:
    if len(value) <= 63 and re.match(LABEL_VALUE, value):
        return None
    fixed = _dashed(value, "A-Za-z0-9_.-", lower=False)[:63].rstrip("-_.")
    return (f"{value!r} is not a valid label value (at most 63 characters: ASCII letters, digits, '-', '_' and '.', "
            f"starting and ending with a letter or digit, or empty): use {fixed!r}")


def qualified_name_problem(value: str) -> str | None:
    """A label or annotation key: ``[DNS-1123 subdomain prefix/]name``, name at most 63 characters."""
    prefix, _, name = value.rpartition("/")
    ok = (len(name) <= 63 and re.fullmatch(_NAME_PART, name)
          and ("/" not in value or (prefix and len(prefix) <= 253 and re.match(DNS1123_SUBDOMAIN, prefix))))
    if ok:
        return None
    fixed_prefix = ".".join(_fix_label(p) for p in prefix.split(".")) + "/" if prefix else ""
    fixed = fixed_prefix + (_dashed(name, "A-Za-z0-9_.-", lower=False)[:63].rstrip("-_.") or "x")
    return (f"{value!r} is not a qualified name, which a label key must be (an optional DNS-1123 subdomain prefix "
            f"and '/', then at most 63 ASCII letters, digits, '-', '_' or '.', starting and ending with a letter or "
            f"digit): use {fixed!r}")


def env_var_name_problem(value: str) -> str | None:
    """Kubernetes 1.34+ (RelaxedEnvironmentVariableValidation, GA): printable ASCII other than '='."""
    if value and all(" " <= c <= "~" and c != "=" for c in value):
        return None
    fixed = "".join("_" if c == "=" else c for c in value if " " <= c <= "~") or "NAME"
    return (f"{value!r} is not an environment variable name the apiserver accepts (printable ASCII characters other "
            f"than '=', not empty): use {fixed!r}")


_SUFFIX: Final[dict[str, Decimal]] = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}
GIB: Final = _SUFFIX["Gi"]


def quantity_problem(value: int | str) -> str | None:
    if isinstance(value, int) or re.match(QUANTITY_PATTERN, value):
        return None
    m = re.match(r"^\s*([0-9.]+)\s*([KMGTPE])B?\s*$", value, re.I)
    fix = f"{m.group(1)}{m.group(2).upper()}i" if m else "for example 1500Gi, 64, 500m"
    return (f"{value!r} is not a Kubernetes quantity (a number with an optional suffix: Ki Mi Gi Ti Pi Ei for powers "
            f"of 1024, k M G T P E for powers of 1000, m for thousandths; no 'B'): use {fix}")


def parse_quantity(value: int | str) -> Decimal:
    """A quantity, exactly, as a number of base units (bytes for memory, cores for CPU)."""
    problem = quantity_problem(value)
    if problem:
        raise ValueError(problem)
    if isinstance(value, int):
        return Decimal(value)
    m = re.match(r"^([+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)([a-zA-Z]*)$", value)
    assert m is not None
    number, suffix = m.groups()
    if suffix and suffix[0] in "eE" and suffix not in _SUFFIX:
        return Decimal(value)
    return Decimal(number) * _SUFFIX[suffix]


def checked(problem):  # type: ignore[no-untyped-def]
    """A pydantic validator from a ``problem(value) -> reason | None`` rule: the rule stays one function
    that messages and tests call too."""

    def validator(value: str) -> str:
        reason = problem(value)
        if reason:
            raise ValueError(reason)
        return value

    return AfterValidator(validator)


EnvVarName = Annotated[str, checked(env_var_name_problem)]
"""A container environment variable name (a dict key: the check has no CRD schema of its own)."""
LabelKey = Annotated[str, checked(qualified_name_problem)]
"""A label or annotation key (a dict key: no CRD schema of its own)."""
# The pattern goes into the CRD only (json_schema_extra): here the check's own message says what to write.
LabelValue = Annotated[str, Field(json_schema_extra={"maxLength": 63, "pattern": LABEL_VALUE}), checked(label_value_problem)]
"""A label value."""
QuantityString = Annotated[str, Field(json_schema_extra={"pattern": QUANTITY_PATTERN}), checked(quantity_problem)]
"""A quantity written as a string (``64Gi``)."""
Dns1123Subdomain = Annotated[str, Field(json_schema_extra={"maxLength": 253, "pattern": DNS1123_SUBDOMAIN}),
                             checked(dns1123_subdomain_problem)]
"""An object name that Kubernetes checks as a DNS-1123 subdomain (a RuntimeClass, a scheduler, a claim)."""
Dns1123Label = Annotated[str, Field(json_schema_extra={"maxLength": 63, "pattern": DNS1123_LABEL}),
                         checked(dns1123_label_problem)]
"""A name that Kubernetes checks as a DNS-1123 label."""
ExtendedResourceName = Annotated[str, Field(json_schema_extra={"maxLength": 253}),
                                 checked(extended_resource_name_problem)]
"""A device plugin's resource name (``rdma/hca_shared_devices_a``)."""
