"""Fixtures shared by the operator tests."""

from __future__ import annotations

import pytest
import yaml
from opsupport import VALID_EXAMPLES


@pytest.fixture(params=VALID_EXAMPLES, ids=lambda p: p.stem)
def example(request: pytest.FixtureRequest) -> dict:
    return yaml.safe_load(request.param.read_text())
