"""The engine ConfigMap: each role's engine settings (and the Mooncake file) for the pod entrypoint."""

from __future__ import annotations

import json
from typing import Any

from hisparse_runtime.engine import MOONCAKE_CONFIG_FILE, RoleSettings, mooncake_config

from .. import names
from ..api import HiSparseDeployment
from .common import meta, obj


def settings_file(role: str) -> str:
    return f"{role}.json"


def engine_config_map(d: HiSparseDeployment, roles: dict[str, RoleSettings]) -> dict[str, Any]:
    data = {settings_file(r): json.dumps(s.to_json_dict(), indent=2, sort_keys=True) + "\n" for r, s in roles.items()}
    mooncake = mooncake_config(roles["prefill"]) if "prefill" in roles else None
    if mooncake is not None:
        data[MOONCAKE_CONFIG_FILE] = json.dumps(mooncake, indent=2, sort_keys=True) + "\n"
    return obj("v1", "ConfigMap", meta(d, names.engine_config(d.name), "engine"), data=data)
