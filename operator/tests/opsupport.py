"""Helpers shared by the operator tests (examples and their expectations)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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
        return yaml.safe_load(self.path.read_text())


def invalid_example(path: Path) -> InvalidExample:
    text = path.read_text()
    want_path = re.search(r"^# expected-path: (.+)$", text, re.M)
    want_msg = re.search(r"^# expected-message: (.+)$", text, re.M)
    assert want_path and want_msg, f"{path.name} must declare expected-path and expected-message"
    return InvalidExample(path, want_path.group(1).strip(), want_msg.group(1).strip())

