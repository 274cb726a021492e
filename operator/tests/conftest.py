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


@pytest.fixture(autouse=True)
def _planner_writes_only_api_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``status.canary`` the rollout planner decides is valid for the API model (which forbids unknown
    keys): the CRD is generated from it, and a real apiserver prunes any key the CRD lacks, so a control
    kept only in such a key would be lost between reconciles."""
    from hisparse_operator.api.status import CanaryStatus
    from hisparse_operator.controller import rollout

    real = rollout.decide

    def checked(*args, **kwargs):  # type: ignore[no-untyped-def]
        decision = real(*args, **kwargs)
        if decision.canary_status is not None:
            CanaryStatus.model_validate(decision.canary_status)
        return decision

    monkeypatch.setattr(rollout, "decide", checked)
