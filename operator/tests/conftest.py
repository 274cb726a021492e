"""Fixtures shared by the operator tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from opsupport import VALID_EXAMPLES


@pytest.fixture(params=VALID_EXAMPLES, ids=lambda p: p.stem)
def example(request: pytest.FixtureRequest) -> dict:
    return yaml.safe_load(request.param.read_text())


@pytest.fixture(scope="session")
def helm() -> Path:
    """The real Helm binary the control-plane build makes (the chart tests need it)."""
    from hisparse_devcluster import ToolsNotBuiltError, locate_binary

    try:
        return locate_binary("helm", "helm")
    except ToolsNotBuiltError as e:
        pytest.fail(f"{e}\n(the chart tests need the real Helm)", pytrace=False)
