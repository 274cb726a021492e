"""Suites run by hand, not by ./scripts/test (see e2e/README.md, "Run by hand"): they share the e2e
fixtures and helpers."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
