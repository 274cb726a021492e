"""Fixtures shared by the runtime tests (helpers live in rtsupport)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rtsupport import Child


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Collects children started by a test and stops every one of them afterwards."""
    started: list[Child] = []
    yield started
    for child in started:
        child.stop()
