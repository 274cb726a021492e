"""The distribution declares what the runtime needs: its console script and vLLM plugin entry points."""

from __future__ import annotations

import importlib.util
import tomllib

import pytest
from rtsupport import REPO_DIR

REQUIRED = {
    ("scripts", "hisparse-runtime"): "hisparse_runtime.cli:main",
    ("vllm.general_plugins", "hisparse"): "hisparse_runtime.plugin:register",
    ("vllm.stat_logger_plugins", "hisparse"): "hisparse_runtime.plugin.stat_logger:HiSparseStatLogger",
}


def declared() -> dict[tuple[str, str], str]:
    project = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]
    found = {("scripts", name): target for name, target in project.get("scripts", {}).items()}
    for group, entries in project.get("entry-points", {}).items():
        found.update({(group, name): target for name, target in entries.items()})
    return found


def test_pyproject_declares_the_runtime_entry_points() -> None:
    found = declared()
    missing = {key: target for key, target in REQUIRED.items() if found.get(key) != target}
    lines = [f'[project.{"scripts" if g == "scripts" else f"entry-points.{chr(34)}{g}{chr(34)}"}] {n} = "{t}"'
             for (g, n), t in missing.items()]  # fmt: skip
    assert not missing, "pyproject.toml must declare:\n" + "\n".join(lines)


@pytest.mark.parametrize("target", sorted(set(REQUIRED.values())))
def test_entry_point_targets_exist(target: str) -> None:
    # Located without importing: the stat logger's module needs vLLM.
    module, _, attr = target.partition(":")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} is not importable"
    text = open(spec.origin, encoding="utf-8").read()
    assert f"def {attr}(" in text or f"class {attr}(" in text, f"{attr} is not defined in {module}"
