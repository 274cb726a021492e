"""YAML output people can read: multi-line strings (engine JSON, EPP config) as literal blocks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # libyaml when available
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_all(objects: Iterable[dict[str, Any]]) -> str:
    return yaml.dump_all(list(objects), Dumper=_Dumper, sort_keys=False, width=4096)


def dump(obj: dict[str, Any]) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=4096)
