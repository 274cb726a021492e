"""Package boundaries (import-linter contracts in pyproject.toml) hold, and every API/engine field is
documented with a default or marked required, as vLLM's validate_config demands of its config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
from hisparse_operator import api
from hisparse_runtime import engine
from opsupport import REPO


def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint), "--config", "pyproject.toml"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: " in result.stdout and " broken" in result.stdout


def test_operator_folder_has_no_init():
    """operator/__init__.py would shadow Python's own `operator` module for anything run from the root."""
    assert not (REPO / "operator" / "__init__.py").exists()


def _models() -> list[type[pydantic.BaseModel]]:
    seen: list[type[pydantic.BaseModel]] = []
    for module in (api, engine):
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, pydantic.BaseModel) and obj not in seen:
                seen.append(obj)
    return seen


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.__name__)
def test_every_field_is_documented(model):
    undocumented = [name for name, field in model.model_fields.items() if not field.description]
    allowed = {"Condition": {"type", "status", "reason", "message", "last_transition_time", "observed_generation"},
               "HiSparseDeployment": {"api_version", "kind", "metadata", "status"},
               "ObjectMeta": {"namespace", "uid", "generation", "labels", "annotations"}}
    undocumented = [n for n in undocumented if n not in allowed.get(model.__name__, set())]
    assert not undocumented, f"{model.__name__}: fields without a docstring: {undocumented}"
