"""Running the build tools: one log per step, the heavy lock, and one error type that names the step."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

HEAVY_LOCK_ENV: Final = "HISPARSE_HEAVY_LOCK"
DEFAULT_HEAVY_LOCK: Final = "/tmp/hisparse-heavy.lock"
"""Image builds take this lock (flock(2), as ``flock(1)`` does) so heavy builds on one machine take turns.
Set ``HISPARSE_HEAVY_LOCK=`` (empty) when the caller already holds it."""

SETUP_FIX: Final = "run scripts/setup (it installs Debian's buildah, mmdebstrap and containerd)"
TOOLS: Final = {"buildah": "buildah", "mmdebstrap": "mmdebstrap", "containerd": "containerd", "ctr": "containerd"}
"""Executable -> the Debian package that has it."""


class ImageError(RuntimeError):
    """An image step failed: the message names the step, the cause and the fix."""

    def __init__(self, step: str, cause: str, fix: str) -> None:
        self.step, self.cause, self.fix = step, cause, fix
        super().__init__(f"image step '{step}' failed: {cause}\n  fix: {fix}")


def require(*tools: str, step: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        packages = sorted({TOOLS.get(t, t) for t in missing})
        raise ImageError(step, f"{', '.join(missing)} not found on PATH (Debian package {', '.join(packages)})",
                         f"{SETUP_FIX}, or: apt-get install {' '.join(packages)}")
    if os.geteuid() != 0:
        raise ImageError(step, "building and loading images here needs root (buildah and containerd run as root "
                               "with chroot isolation)", "run it as root")


@contextlib.contextmanager
def heavy_lock() -> Iterator[None]:
    path = os.environ.get(HEAVY_LOCK_ENV, DEFAULT_HEAVY_LOCK)
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run(step: str, argv: Sequence[str], log: Path, *, fix: str, env: dict[str, str] | None = None,
        timeout: float = 3600.0) -> float:
    """Run ``argv`` with its output appended to ``log``; the seconds it took. A failure is an ImageError."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        try:
            proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, **(env or {})}, timeout=timeout, check=False)
        except FileNotFoundError as e:
            raise ImageError(step, f"{argv[0]} not found", SETUP_FIX) from e
        except subprocess.TimeoutExpired as e:
            raise ImageError(step, f"{argv[0]} ran past {timeout:.0f}s; log {log}", fix) from e
    if proc.returncode:
        raise ImageError(step, f"{Path(argv[0]).name} exited {proc.returncode}; last lines of {log}:\n{tail(log)}", fix)
    return time.monotonic() - start


def output(step: str, argv: Sequence[str], *, fix: str, env: dict[str, str] | None = None) -> str:
    """Run a short query; its stdout. A failure is an ImageError."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=300, check=False)
    if proc.returncode:
        raise ImageError(step, f"{' '.join(argv[:3])} ... exited {proc.returncode}: {proc.stderr.strip()[-2000:]}", fix)
    return proc.stdout
