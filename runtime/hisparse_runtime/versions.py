"""Versions the runtime reports and builds against, in one place.

The vLLM version is owned by the engine core (``hisparse_runtime.engine.versions.VLLM_VERSION``);
``VLLM_VERSION`` here is read from it on first use, so commands that do not need it (the link
checks, parity) never import the engine package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RUNTIME_VERSION", "VLLM_VERSION", "runtime_version"]

VLLM_VERSION: str  # read from the engine core on first access (module __getattr__ below)

RUNTIME_VERSION = "0.1.0"
"""Fallback version of the runtime when the ``hisparse`` distribution is not installed (source tree)."""


def runtime_version() -> str:
    """The installed ``hisparse`` distribution's version, or ``RUNTIME_VERSION`` from a source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hisparse")
    except PackageNotFoundError:
        return RUNTIME_VERSION


def __getattr__(name: str) -> Any:
    if name == "VLLM_VERSION":
        from hisparse_runtime.engine.versions import VLLM_VERSION

        return VLLM_VERSION
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
