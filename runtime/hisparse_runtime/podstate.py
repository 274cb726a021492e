"""Small files through which the entrypoint tells the probes what the pod is doing.

The probes run as separate processes (kubelet exec), so "draining" and "data path verified" live in
files under ``$HISPARSE_STATE_DIR`` (default ``/tmp/hisparse``), not in memory."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Final

DRAINING: Final = "draining"
DATA_PATH_OK: Final = "data-path-verified"


def state_dir() -> Path:
    return Path(os.environ.get("HISPARSE_STATE_DIR", "/tmp/hisparse"))


def mark(name: str, text: str = "") -> None:
    """Write ``name`` atomically. Probes run concurrently (the kubelet's readiness and liveness probes, a
    ``kubectl exec``), so each writer renames a temporary file of its own: with one shared name, the second
    writer's rename found the file already moved and the probe failed."""
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, d / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def age_seconds(name: str) -> float | None:
    """Seconds since ``name`` was marked, or None if it never was."""
    try:
        return time.time() - (state_dir() / name).stat().st_mtime
    except FileNotFoundError:
        return None


def clear(name: str) -> None:
    (state_dir() / name).unlink(missing_ok=True)
