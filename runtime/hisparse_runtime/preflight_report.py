"""The preflight outcome handed from the entrypoint to the vLLM plugin.

The entrypoint runs preflight, writes this report as JSON, then execs ``vllm serve``; the plugin, loaded
inside vLLM, reads it back and exports one gauge per check. The path travels in ``REPORT_PATH_ENV``.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEFAULT_REPORT_PATH", "REPORT_PATH_ENV", "CheckOutcome", "PreflightReport", "read_report", "write_report"]

REPORT_PATH_ENV = "HISPARSE_PREFLIGHT_REPORT"
"""Environment variable naming the report file."""

DEFAULT_REPORT_PATH = "/tmp/hisparse/preflight.json"
"""Where the entrypoint writes the report when the variable is unset (a writable path for non-root)."""


class CheckOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Stable check name; the metric's label.")
    ok: bool
    message: str = Field(default="", description="What was found; on failure, what to do.")
    exit_code: int = Field(default=0, ge=0, le=255, description="Exit code the entrypoint uses for this failure.")


class PreflightReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checks: list[CheckOutcome]
    finished_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def report_path() -> Path:
    return Path(os.environ.get(REPORT_PATH_ENV) or DEFAULT_REPORT_PATH)


def write_report(report: PreflightReport, path: Path | None = None) -> Path:
    target = path or report_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(report.model_dump_json(indent=1), encoding="utf-8")
    tmp.replace(target)  # readers never see half a file
    return target


def read_report(path: Path | None = None) -> PreflightReport | None:
    """The report, or None when no preflight ran (file absent)."""
    target = path or report_path()
    if not target.exists():
        return None
    return PreflightReport.model_validate_json(target.read_text(encoding="utf-8"))
