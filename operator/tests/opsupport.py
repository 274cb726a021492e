"""Helpers shared by the operator tests (examples and their expectations)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
VALID_EXAMPLES = sorted(EXAMPLES.glob("*.yaml"))
INVALID_EXAMPLES = sorted((EXAMPLES / "invalid").glob("*.yaml"))


@dataclass(frozen=True)
class InvalidExample:
    path: Path
    expected_path: str
    expected_message: str

    @property
    def manifest(self) -> dict:
        """The manifest as kubectl sends it (YAML 1.1 as go-yaml v2 resolves it)."""
        from hisparse_operator.yamlio import load_documents

        [doc] = load_documents(self.path.read_text())
        return doc.data


def invalid_example(path: Path) -> InvalidExample:
    text = path.read_text()
    want_path = re.search(r"^# expected-path: (.+)$", text, re.M)
    want_msg = re.search(r"^# expected-message: (.+)$", text, re.M)
    assert want_path and want_msg, f"{path.name} must declare expected-path and expected-message"
    return InvalidExample(path, want_path.group(1).strip(), want_msg.group(1).strip())


def chart_rules(release: str = "rel", namespace: str = "ops", **kw: bool) -> list[dict[str, Any]]:
    """``rbac.cluster_role_rules`` as the chart renders them for ``release`` in ``namespace``: the webhook
    configuration by its cluster-unique name."""
    from hisparse_operator import rbac
    from hisparse_operator.controller import webhook

    name = f"{namespace}-{release}-hisparse.{webhook.CONFIGURATION}"
    return [{**r, "resourceNames": [name]} if "validatingwebhookconfigurations" in r["resources"] else r
            for r in rbac.cluster_role_rules(**kw)]
