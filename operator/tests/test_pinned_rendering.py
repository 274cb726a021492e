"""A revision's kept rendering (render/pinned.py) stands in for the running operator's render exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from opsupport import EXAMPLES, VALID_EXAMPLES

from hisparse_operator import names
from hisparse_operator.api import labels as L, validate
from hisparse_operator.render import pinned, render_validated, revision



def _valid(path: Path) -> Any:
    d, errors = validate(yaml.safe_load(path.read_text()), None)
    assert not errors and d is not None, errors
    return d


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=[p.stem for p in VALID_EXAMPLES])
def test_the_kept_rendering_put_back_is_the_render_in_any_fleet(path: Path) -> None:
    d = _valid(path)
    kept = pinned.rendering(d)
    assert all("ownerReferences" not in o["metadata"] and "replicas" not in o.get("spec", {}) for o in kept)
    for fleet in (d.name, names.fleet(d.name, revision(d))):
        direct = render_validated(d, fleet=fleet)
        assert json.dumps(pinned.pin(direct, kept, fleet=fleet, revision=revision(d)), sort_keys=True) == \
            json.dumps(direct, sort_keys=True), fleet


def test_pin_refuses_what_would_leave_a_selector_without_the_kept_pods() -> None:
    d = _valid(EXAMPLES / "deepseek-v32-single-node.yaml")
    kept = pinned.rendering(d)
    direct = render_validated(d)
    with pytest.raises(pinned.PinError, match="is of revision"):
        pinned.pin(direct, kept, fleet=d.name, revision="0000000000")
    relabelled = json.loads(json.dumps(kept))
    for o in relabelled:
        if o["kind"] == "Deployment":
            o["spec"]["template"]["metadata"]["labels"][L.DEPLOYMENT] = "elsewhere"
    with pytest.raises(pinned.PinError, match="do not carry"):
        pinned.pin(direct, relabelled, fleet=d.name, revision=revision(d))
    renamed = [o for o in direct if o["metadata"]["name"] != names.role(d.name, "decode")]
    with pytest.raises(pinned.PinError, match="renders no Deployment"):
        pinned.pin(renamed, kept, fleet=d.name, revision=revision(d))
